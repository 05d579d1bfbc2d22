"""The code's shape, checked: ``python -m tests.structure`` (``make lint`` runs it; so does
the test suite).

- no module of the packages or benches over ``MAX_MODULE_LINES`` lines, and none under
  ``hosts/`` over ``MAX_HOST_MODULE_LINES`` (a host instance is composed of parts, each
  a module of its own);
- no function over ``MAX_FUNCTION_LINES`` lines (the CLI's argument parser excepted: it is
  one declaration of every command);
- no SQL driver or SQLAlchemy above the storage layer: ``hosts/``, ``adapters/`` and
  ``pipelines/`` name neither ``sqlalchemy``, ``psycopg`` nor ``duckdb``, and neither
  they nor the front (``MessageBox``, the CLI, the console, the metrics) open a
  transaction or import a driver;
- no storage module under the hosts: ``hosts/``, ``adapters/`` and ``pipelines/`` import
  no ``messagebox`` module that imports SQLAlchemy or a driver (the value types and
  constants they need live in modules without SQL), but the engine (``MessageBox``) and
  what they name for typing only (``if TYPE_CHECKING:``);
- one process clock: no package module but ``messagebox/clock.py`` reads the time of day
  (``datetime.now``, ``datetime.utcnow``, ``time.time``), so a test can set it for all;
  nor the database's (``SELECT now()``) but ``messagebox/storage/store_clock.py``, through which
  each transaction reads it once; nor, under ``hosts/``, the monotonic clock
  (``time.monotonic``, ``time.sleep``) but ``hosts/timing.py``, whose clock the parts
  of a host instance are given, so that a test can drive their time;
- capabilities, not names: no module outside ``messagebox/storage/dialects/`` and
  ``messagebox/storage/capabilities.py`` branches on a backend's name (``dialect.name``).

Prints each breach and exits 1; exits 0 when there is none.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("messagebox", "bench")
HOSTS = "messagebox/hosts"
ABOVE_STORAGE = (HOSTS, "messagebox/adapters", "messagebox/pipelines")
FRONT = (
    "messagebox/engine.py",
    "messagebox/metrics.py",
    "messagebox/cli",
    "messagebox/console",
)
"""Inside the messagebox package but above the storage layer."""
MAX_MODULE_LINES = 600
MAX_HOST_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED = {"messagebox/cli/parser.py"}
DRIVERS = re.compile(r"sqlalchemy|psycopg|duckdb")
CLOCK = "messagebox/clock.py"
HOST_CLOCK = f"{HOSTS}/timing.py"
MONOTONIC = re.compile(r"\btime\.(monotonic|sleep)\b|\bfrom time import\b")
STORE_CLOCK = "messagebox/storage/store_clock.py"
TIME_OF_DAY = re.compile(r"datetime\.(now|utcnow)\(|time\.time\(\)")
DATABASE_TIME = re.compile(r"select\(sa\.func\.now\(\)\)")
BACKEND_NAME = re.compile(r"dialect\.name\s*(==|!=|in\b|not\s+in\b)")
NAMES_ALLOWED = ("messagebox/storage/dialects/", "messagebox/storage/capabilities.py")


def sources(packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def long_modules() -> list[str]:
    found = []
    for path in sources():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        name = path.relative_to(ROOT).as_posix()
        most = MAX_HOST_MODULE_LINES if name.startswith(f"{HOSTS}/") else MAX_MODULE_LINES
        if lines > most:
            found.append(f"{name}: {lines} lines (at most {most})")
    return found


def long_functions() -> list[str]:
    found = []
    for path in sources():
        name = path.relative_to(ROOT).as_posix()
        if name in LONG_FUNCTIONS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - start + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}(): {lines} lines")
    return found


def driver_mentions() -> list[str]:
    found = []
    for path in sources(ABOVE_STORAGE):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DRIVERS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def front_reaching_storage() -> list[str]:
    found = []
    paths = list(sources(ABOVE_STORAGE))
    for front in FRONT:
        target = ROOT / front
        paths += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    reaching = re.compile(r"\.transaction\(|^\s*(import|from) (sqlalchemy|psycopg|duckdb)\b")
    for path in paths:
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if reaching.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: reaches storage: {line.strip()}")
    return found


STORAGE_IMPORT = re.compile(r"^\s*(import|from) (sqlalchemy|psycopg|duckdb)\b", re.MULTILINE)
SQL_ALLOWED = frozenset({"messagebox.engine"})
"""The facade the hosts are given a store through."""


def _module_file(name: str) -> Path | None:
    """``messagebox.x.y``'s source (``messagebox/x/y.py`` or its package's
    ``__init__.py``), or None for what is not a module of the tree."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _runtime_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of each ``messagebox`` module a source imports when it runs: not
    under ``if TYPE_CHECKING:``; ``from messagebox import x`` names module ``x`` where
    there is one."""
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for child in node.body
        for n in ast.walk(child)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield node.lineno, sub if _module_file(sub) else node.module


def hosts_import_sql_modules() -> list[str]:
    found = []
    for path in sources(ABOVE_STORAGE):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for number, module in _runtime_imports(tree):
            if not module.startswith("messagebox.") or module in SQL_ALLOWED:
                continue
            target = _module_file(module)
            if target is not None and STORAGE_IMPORT.search(target.read_text(encoding="utf-8")):
                found.append(
                    f"{path.relative_to(ROOT)}:{number}: imports {module}, which imports SQL"
                )
    return sorted(set(found))


def clock_reads() -> list[str]:
    found = []
    for path in sources(PACKAGES[:-1]):  # the benches time themselves
        name = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (TIME_OF_DAY.search(line) and name != CLOCK) or (
                DATABASE_TIME.search(line) and name != STORE_CLOCK
            ):
                found.append(f"{path.relative_to(ROOT)}:{number}: reads the clock: {line.strip()}")
    return found


def host_clock_reads() -> list[str]:
    found = []
    for path in sources((HOSTS,)):
        name = path.relative_to(ROOT).as_posix()
        if name == HOST_CLOCK:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if MONOTONIC.search(line):
                found.append(f"{name}:{number}: reads the monotonic clock: {line.strip()}")
    return found


def backend_names() -> list[str]:
    found = []
    for path in sources(PACKAGES[:-1]):  # a bench may name what it measures
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(NAMES_ALLOWED):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BACKEND_NAME.search(line):
                found.append(f"{name}:{number}: branches on a backend's name: {line.strip()}")
    return found


def main() -> int:
    breaches = (
        long_modules()
        + long_functions()
        + driver_mentions()
        + front_reaching_storage()
        + hosts_import_sql_modules()
        + clock_reads()
        + host_clock_reads()
        + backend_names()
    )
    for breach in breaches:
        print(breach)
    if not breaches:
        print(
            f"no module over {MAX_MODULE_LINES} lines (under hosts/, "
            f"{MAX_HOST_MODULE_LINES}), no function over "
            f"{MAX_FUNCTION_LINES}, no driver above the storage layer, no storage module "
            "under the hosts, one process clock, one host clock, "
            "no backend's name"
        )
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
