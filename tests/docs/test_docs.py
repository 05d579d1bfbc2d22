"""Every code sample in the documentation runs, as written.

**What is collected.** Every fenced code block of ``docs/*.md``, in document order, and
those of ``README.md`` (see ``README_EXCEPTIONS`` below: the README is not annotated).
A block's language decides how it runs; a block of any other language, or of none, fails
:func:`test_every_block_is_recognised` unless a marker says what it is. So nothing
escapes silently.

**Languages.**

- ``python``: run with ``exec``, in order, in one namespace per document (a module
  registered while the document runs, so later blocks use earlier names), in the
  document's working folder (a fresh temporary one, also on ``sys.path`` as for the
  interactive interpreter), with the environment the shell commands exported so far.
  Standard output is captured; a ``text`` block right after a ``python`` block (only
  blank lines between) is its expected output.
- ``console``: lines starting with ``$ `` are commands, continued on lines starting
  with ``> `` (the shell's second prompt); the lines up to the next command are its
  expected output.
- ``bash``, ``sh``: every line is a command (``#`` comments and ``\\`` continuations as in
  the shell); the output is not checked.

**Shell commands** run one by one, each as ``bash -c`` in the document's working folder,
with the virtualenv's ``bin`` first on ``PATH`` (its ``messagebox`` command),
``PYTHONUNBUFFERED=1`` and standard error merged into standard output (the order a
terminal shows). The working folder and exported variables carry over from one command
to the next, across the document's blocks, as in one terminal; ``MESSAGEBOX_URL`` is
unset at the start. Each command must exit 0: a sample that shows a failure does so
with ``; echo "exit $?"``. One exception: a plain ``messagebox …`` command (one
command, no pipes, redirections or substitutions, not ``host run`` or ``console``) runs
in this process, through :func:`messagebox.cli.main`, with the same working folder,
variables and merged output (a process of its own costs 2 s of imports; ``messagebox
spark …`` runs on the test session's Spark, where a second JVM would cost 15 s).

**Expected output** is matched line by line: every non-blank expected line must match
an output line, in order (other output lines may come between). Runs of blanks match
any blanks, and ``...`` matches any text within a line.

**Markers**, HTML comments on the line before a fence (invisible when rendered):

- ``<!-- doc-test: skip (why) -->``: not run; the reason is required. Used rarely: for
  installation commands, for what needs a remote machine or a cluster.
- ``<!-- doc-test: file NAME -->``: the block is a file the reader saves as ``NAME``
  (a host app module, a JSON file); the test writes it into the working folder, where
  later commands use it.

and, anywhere in a document, once:

- ``<!-- doc-test: requires postgresql -->``: the document's samples run against a
  fresh PostgreSQL schema (dropped afterwards) whose URL is in ``MESSAGEBOX_URL``, for
  the shell and for ``os.environ`` (the samples read it from there, as the ``messagebox``
  command does). Without a server the test skips, except when ``CI=true``: then it
  fails (``tests/conftest.py``).
- ``<!-- doc-test: requires spark -->``: the document uses the test session's Spark
  (the ``spark`` fixture); ``SparkSession.builder.getOrCreate()``, and so
  :func:`messagebox.pipelines.spark.session`, return it. Runtime settings a sample changes are
  restored afterwards.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import scratch_url
from tests.docs import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent

RUNNABLE = {"python", "console", "bash", "sh"}
COMMAND_TIMEOUT = 120

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<body>.*?)\s*-->")
_SKIP = re.compile(r"skip\s*\((?P<why>.*)\)", re.DOTALL)
_FILE = re.compile(r"file\s+(?P<name>\S+)")
_REQUIRES = re.compile(r"requires\s+(?P<what>postgresql|spark)")


@dataclass
class Block:
    """A fenced code block of a document."""

    path: Path
    line: int
    """The line of the first line of code (1-based), for error messages."""
    language: str
    code: str
    marker: str | None = None
    """The ``doc-test`` marker on the line before the fence, if any."""
    expected: str | None = None
    """For a python block: the text block that follows it (its expected output)."""
    consumed: bool = False
    """A text block taken as the expected output of the python block before it."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None:
            return None
        found = _SKIP.fullmatch(self.marker)
        return found.group("why").strip() if found else None

    @property
    def file_name(self) -> str | None:
        if self.marker is None:
            return None
        found = _FILE.fullmatch(self.marker)
        return found.group("name") if found else None


@dataclass
class Document:
    path: Path
    blocks: list[Block]
    requires: set[str] = field(default_factory=set)


def parse(path: Path) -> Document:
    """The fenced blocks of a Markdown file, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines)
    requires = {m.group("what") for m in _REQUIRES.finditer(text)}
    blocks: list[Block] = []
    i = 0
    previous_end = -10
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, indent = opened.group("fence"), len(opened.group("indent"))
        language = opened.group("info").strip().split(" ")[0].lower()
        marker = None
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        if before >= 0:
            found = _MARKER.fullmatch(lines[before].strip())
            if found and not _REQUIRES.fullmatch(found.group("body")):
                marker = found.group("body")
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence[0] * len(fence))
            and set(lines[end].strip()) == {fence[0]}
        ):
            end += 1
        code = "\n".join(
            line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : end]
        )
        block = Block(path, i + 2, language, code + "\n", marker)
        only_blanks_between = all(not lines[k].strip() for k in range(previous_end + 1, i))
        if (
            language == "text"
            and marker is None
            and blocks
            and blocks[-1].language == "python"
            and blocks[-1].expected is None
            and only_blanks_between
        ):
            blocks[-1].expected = block.code
            block.consumed = True
        blocks.append(block)
        previous_end = end
        i = end + 1
    return Document(path, blocks, requires)


def documents() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


# --- README: not annotated, so its blocks are described here ---

README_EXCEPTIONS: dict[str, str] = {
    "make demo": "runs the demo and the whole test suite (this test is part of it)",
    'spark.read.parquet("orders/")': "reads an orders/ folder and a PostgreSQL URL that "
    "are placeholders (docs/howto-spark.md runs the same calls)",
    "publish_dataframe(orders": "a PostgreSQL URL and an orders frame that are "
    "placeholders (docs/howto-spark.md runs the same call)",
    "messagebox spark route --input orders.parquet": "needs orders.parquet and "
    "proposed.json (docs/howto-spark.md runs the same commands)",
}
"""README blocks that do not run as they are, by a text each contains, with why."""


def readme_blocks() -> list[Block]:
    """The README's blocks, with the exceptions' reasons as skip markers."""
    blocks = parse(README).blocks
    for block in blocks:
        reasons = [why for text, why in README_EXCEPTIONS.items() if text in block.code]
        if reasons:
            block.marker = f"skip ({reasons[0]})"
    return blocks


# --- running shell commands ---


def commands(block: Block) -> Iterator[tuple[str, str | None]]:
    """``(command, expected output)`` of a shell block (``None``: not checked)."""
    lines = block.code.splitlines()
    if block.language == "console":
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                if lines[i].strip():
                    raise AssertionError(
                        f"{block.where}: output before the first `$ ` command: {lines[i]!r}"
                    )
                i += 1
                continue
            command = lines[i][2:]
            i += 1
            while i < len(lines) and lines[i].startswith("> "):  # PS2: a continued command
                command += "\n" + lines[i][2:]
                i += 1
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i])
                i += 1
            yield command, "\n".join(out)
        return
    command = ""
    for line in lines:
        if not command and (not line.strip() or line.lstrip().startswith("#")):
            continue
        command += ("\n" if command else "") + line
        if not line.endswith("\\"):
            yield command, None
            command = ""
    if command:
        yield command, None


def _line_pattern(expected: str) -> re.Pattern[str]:
    pieces = [
        r"\s+".join(re.escape(word) for word in piece.split()) for piece in expected.split("...")
    ]
    return re.compile(r"\s*" + ".*?".join(pieces) + r"\s*")


def assert_output(where: str, command: str, expected: str, output: str) -> None:
    """Every non-blank expected line matches an output line, in order."""
    got = output.splitlines()
    at = 0
    for want in (line for line in expected.splitlines() if line.strip()):
        pattern = _line_pattern(want)
        while at < len(got) and not pattern.fullmatch(got[at]):
            at += 1
        if at == len(got):
            raise AssertionError(
                f"{where}: `{command}`: expected a line matching\n    {want}\n"
                f"in order; the output was:\n{output}"
            )
        at += 1


@dataclass
class Shell:
    """One terminal: a working folder and exported variables, carried over."""

    cwd: Path
    env: dict[str, str]
    state: Path

    def run(self, command: str, spark: Any = None) -> tuple[int, str]:
        argv = _split(command.replace("\\\n", " "))  # continued lines are one command
        if argv and argv[0] == "messagebox" and "spark" in argv[1:] and spark is not None:
            return self._in_process(argv, spark)
        if argv and argv[0] == "messagebox" and _in_process_ok(command, argv):
            return self._in_process(argv, None)
        script = (
            f"{command}\n__mb_rc=$?\n"
            f'env -0 > "{self.state}/env"; pwd > "{self.state}/cwd"\n'
            "exit $__mb_rc\n"
        )
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        env_file, cwd_file = self.state / "env", self.state / "cwd"
        if env_file.exists():
            pairs = env_file.read_bytes().decode().split("\0")
            self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
            self.env.pop("_", None)
            self.cwd = Path(cwd_file.read_text().strip())
            env_file.unlink()
        return done.returncode, done.stdout

    def _in_process(self, argv: list[str], spark: Any) -> tuple[int, str]:
        from messagebox.cli import main

        saved_env = dict(os.environ)
        out = io.StringIO()
        try:
            os.environ.clear()
            os.environ.update(self.env)
            with (
                working_folder(self.cwd, spark),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(out),
            ):
                try:
                    code = main([os.path.expandvars(a) for a in argv[1:]])
                except SystemExit as exc:  # argparse: --help, or a usage error
                    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            if spark is not None:
                spark.sparkContext.setLogLevel("OFF")  # as the spark fixture has it
        return code, out.getvalue()


@contextlib.contextmanager
def working_folder(path: Path, spark: Any = None) -> Iterator[None]:
    """Work in ``path``: Python's working folder and, with Spark, the JVM's, for the
    relative paths it reads and writes (as a process started in ``path`` would)."""
    saved = Path.cwd()
    os.chdir(path)
    sys.path.insert(0, str(path))  # as the interpreter's '': modules saved there import
    local_fs = before = None
    if spark is not None:
        jvm = spark.sparkContext._jvm
        local_fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(
            spark.sparkContext._jsc.hadoopConfiguration()
        )
        before = local_fs.getWorkingDirectory()
        local_fs.setWorkingDirectory(jvm.org.apache.hadoop.fs.Path(str(path)))
    try:
        yield
    finally:
        os.chdir(saved)
        sys.path.remove(str(path))
        if local_fs is not None:
            local_fs.setWorkingDirectory(before)


_SHELL_SYNTAX = re.compile(r"[|&;<>`]|\$\(")
_LONG_RUNNING = {"run", "console"}
"""``host run`` and ``console`` serve until stopped: they stay processes of their own."""


def _in_process_ok(command: str, argv: list[str]) -> bool:
    """Whether a ``messagebox`` command can run through :func:`messagebox.cli.main` in
    this process, as the shell would run it: one command, no shell syntax (pipes,
    redirections, ``;``, ``&``, substitutions), and not a server."""
    return not _SHELL_SYNTAX.search(command) and not _LONG_RUNNING & set(argv[1:])


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return []


# --- running a document ---

SPARK_RUNTIME = (
    "spark.sql.shuffle.partitions",
    "spark.sql.session.timeZone",
    "spark.sql.execution.arrow.pyspark.enabled",
)
"""Runtime settings a sample's ``session()`` may change on the shared session."""


class Runner:
    def __init__(self, doc: Document, workdir: Path, env: dict[str, str], spark: Any) -> None:
        self.doc = doc
        self.workdir = workdir
        self.spark = spark
        state = workdir.parent / f"{workdir.name}-shell"
        state.mkdir()
        self.shell = Shell(workdir, env, state)
        self.module = types.ModuleType(f"doc_sample_{doc.path.stem.replace('-', '_')}")
        self.module.__file__ = str(doc.path)

    def run(self) -> None:
        sys.modules[self.module.__name__] = self.module
        try:
            for block in self.doc.blocks:
                self.block(block)
        finally:
            self.close()
            del sys.modules[self.module.__name__]
            for name, module in list(sys.modules.items()):  # modules the samples saved
                if str(getattr(module, "__file__", None) or "").startswith(str(self.workdir)):
                    del sys.modules[name]

    def block(self, block: Block) -> None:
        if block.consumed or block.skip_reason is not None:
            return
        if block.file_name is not None:
            target = self.shell.cwd / block.file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
            return
        if block.language == "python":
            self.python(block)
        elif block.language in ("console", "bash", "sh"):
            for command, expected in commands(block):
                code, output = self.shell.run(command, self.spark)
                if code != 0:
                    raise AssertionError(f"{block.where}: `{command}` exited {code}:\n{output}")
                if expected:
                    assert_output(block.where, command, expected, output)
        else:
            raise AssertionError(f"{block.where}: a {block.language or 'plain'} block, not run")

    def python(self, block: Block) -> None:
        source = "\n" * (block.line - 1) + block.code  # tracebacks name the doc's lines
        code = compile(source, str(block.path.relative_to(ROOT)), "exec")
        out = io.StringIO()
        try:
            with (
                pytest.MonkeyPatch.context() as mp,
                working_folder(self.shell.cwd, self.spark),
                contextlib.redirect_stdout(out),
            ):
                for name, value in self.shell.env.items():  # what the terminal exported
                    mp.setenv(name, value)
                exec(code, self.module.__dict__)
        except BaseException as exc:
            exc.add_note(f"{block.where}: the sample printed:\n{out.getvalue()}")
            raise
        if block.expected:
            assert_output(block.where, "python block", block.expected, out.getvalue())

    def close(self) -> None:
        """Stop host instances and close stores the samples left open."""
        from messagebox import MessageBox
        from messagebox.hosts import HostInstance

        for value in list(vars(self.module).values()):
            with contextlib.suppress(Exception):
                if isinstance(value, HostInstance):
                    value.stop(5.0)
                elif isinstance(value, MessageBox):
                    value.close()


@contextlib.contextmanager
def _adapters_restored() -> Iterator[None]:
    """Leave the process's adapter registry as it was (howto-adapter.md adds mem://)."""
    from messagebox import adapters

    adapters._builtins()
    saved: tuple[dict[str, Any], ...] = dict(adapters._receive), dict(adapters._send)
    try:
        yield
    finally:
        tables: tuple[dict[str, Any], ...] = (adapters._receive, adapters._send)
        for table, before in zip(tables, saved, strict=True):
            table.clear()
            table.update(before)


def run_document(doc: Document, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MESSAGEBOX_URL"}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("COLUMNS", None)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_adapters_restored())  # a doc may register its own adapters
        spark = None
        if "spark" in doc.requires:
            spark = request.getfixturevalue("spark")
            saved = {k: spark.conf.get(k) for k in SPARK_RUNTIME}
            stack.callback(lambda: [spark.conf.set(k, v) for k, v in saved.items()])
        if "postgresql" in doc.requires:
            env["MESSAGEBOX_URL"] = stack.enter_context(scratch_url("postgresql", tmp_path))
        Runner(doc, workdir, env, spark).run()


# --- the tests ---


def _doc_ids() -> list[str]:
    return [p.name for p in documents()]


def _doc_params() -> list[Any]:
    """The documents; those that use the test session's Spark run on its xdist worker."""
    return [
        pytest.param(
            p.name,
            marks=[pytest.mark.xdist_group("spark")] if "spark" in parse(p).requires else [],
        )
        for p in documents()
    ]


@pytest.mark.parametrize("name", _doc_params())
def test_doc_samples_run(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Given a document, when its samples run in order, then each succeeds and prints
    what the document shows."""
    run_document(parse(DOCS / name), tmp_path, request)


def test_readme_samples_run(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    doc = Document(README, readme_blocks())
    run_document(doc, tmp_path, request)


def test_readme_exceptions_still_apply() -> None:
    """Each README exception names a block that exists (else it is stale: remove it)."""
    code = [b.code for b in parse(README).blocks]
    stale = [text for text in README_EXCEPTIONS if not any(text in c for c in code)]
    assert not stale, f"README_EXCEPTIONS names no README block: {stale}"


def test_every_block_is_recognised() -> None:
    """Every block runs, is a file the samples use, is an expected output, or is
    skipped with a reason: nothing escapes silently."""
    problems = []
    for path in [*documents(), README]:
        blocks = readme_blocks() if path == README else parse(path).blocks
        for b in blocks:
            if b.marker is not None and b.skip_reason is None and b.file_name is None:
                problems.append(f"{b.where}: unknown marker <!-- doc-test: {b.marker} -->")
            elif b.marker is not None and b.skip_reason is not None and not b.skip_reason:
                problems.append(f"{b.where}: a skip needs a reason")
            elif b.marker is None and not b.consumed and b.language not in RUNNABLE:
                problems.append(
                    f"{b.where}: a {b.language or 'plain'} block that is not run: mark it "
                    "<!-- doc-test: skip (why) --> or <!-- doc-test: file NAME -->"
                )
    assert not problems, "\n".join(problems)


def test_docs_have_samples() -> None:
    """The documents are found, and each has at least one sample that runs."""
    names = _doc_ids()
    for wanted in (
        "quickstart.md",
        "concepts.md",
        "howto-postgresql.md",
        "howto-spark.md",
        "howto-adapter.md",
        "reference.md",
    ):
        assert wanted in names
    for path in documents():
        runnable = [
            b
            for b in parse(path).blocks
            if b.skip_reason is None and (b.language in RUNNABLE or b.file_name)
        ]
        if path.name != "reference.md":
            assert runnable, f"{path.name} has no sample that runs"


def test_reference_is_generated_from_the_code() -> None:
    """The generated sections of docs/reference.md are what the code makes now."""
    current = reference.REFERENCE.read_text(encoding="utf-8")
    assert reference.render(current) == current, (
        "docs/reference.md is out of date with the code: run "
        ".venv/bin/python -m tests.docs.reference --write"
    )


def test_reference_names_every_command() -> None:
    text = reference.REFERENCE.read_text(encoding="utf-8")
    missing = [c for c in reference.command_paths() if f"`messagebox {c}`" not in text]
    assert not missing, f"docs/reference.md does not name: {missing}"


def _anchors(path: Path) -> set[str]:
    """The heading anchors of a Markdown file, as GitHub makes them."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(slug.replace(" ", "-"))
    return found


def test_links_resolve() -> None:
    """Every relative link in the docs and the README names a file that exists, and a
    heading of it when the link has an anchor."""
    broken = []
    for path in [*documents(), README]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            linked = path.parent / file if file else path
            if not linked.exists() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_links_every_doc() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [p.name for p in documents() if f"(docs/{p.name})" not in text]
    assert not missing, f"README.md does not link {missing}"
