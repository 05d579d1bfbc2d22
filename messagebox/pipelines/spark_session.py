"""Spark sessions for batch routing, and what a cluster's executors need
(docs/howto-spark.md, "On a cluster").

    from messagebox.pipelines.spark import session

    spark = session("spark://master:7077", **{"spark.executor.memory": "4g"})

What the executors run:

- ``route_dataframe`` and ``what_if``: Spark's own JVM code only. The subscriptions go
  to them inside the plan (small tables built from Arrow in the driver), so they start
  no Python worker and need neither messagebox nor a Python at all.
- ``publish_dataframe`` on PostgreSQL: Python, in the interpreter the driver names in
  ``PYSPARK_PYTHON`` (the same path on every executor), which imports messagebox and its
  dependencies there. :func:`session` ships the messagebox package to the executors of a
  cluster master (:func:`ship_package`); its dependencies must be installed there. On
  DuckDB (or ``parallel=False``) the driver publishes: the executors run no Python.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from messagebox.errors import MessageBoxError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HUGE_METHODS = "-XX:-DontCompileHugeMethods"
"""JVM option :func:`session` sets (add it to your own sessions' extraJavaOptions)."""

SHIP_CONF = "spark.messagebox.ship"
"""The setting that turns :func:`session`'s shipping of the package on or off
(``false`` where messagebox is installed on the executors: its compiled parts then run)."""

MASTER_TIMEOUT = 5.0
"""Seconds :func:`check_master` waits for a ``spark://`` master to accept a connection."""

_LEFT_OUT = frozenset({".so", ".pyd", ".c", ".pyc"})
"""What a shipped package leaves out: compiled parts (they do not load from a zip; the
pure-Python fallbacks run instead), their C sources and bytecode."""

_shipped: dict[str, Path] = {}
"""Per Spark application id, the zip shipped to its executors."""


def session(master: str = "local[*]", app: str = "messagebox", **conf: str) -> SparkSession:
    """A Spark session for batch routing: UTC session time, no UI, JIT for large
    generated methods (:data:`HUGE_METHODS`); ``conf`` adds settings
    (``"spark.driver.memory"`` and such, with dots as given).

    A ``spark://`` master must answer first (:func:`check_master`). The messagebox
    package is sent to the executors (:func:`ship_package`) on every master but
    ``local``, unless :data:`SHIP_CONF` says ``false`` (``"true"``: on ``local`` too)."""
    from pyspark.sql import SparkSession

    local = master.startswith("local")
    ship = conf.get(SHIP_CONF, "false" if local else "true").lower()
    if ship not in ("true", "false"):
        raise MessageBoxError(f"{SHIP_CONF} is 'true' or 'false', not {ship!r}")
    check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for side in ("driver", "executor"):
        # the generated code of a wide frame's probes has methods over the JVM's 8 KB
        # JIT limit; without this they run interpreted, 2-5x slower
        conf.setdefault(f"spark.{side}.extraJavaOptions", HUGE_METHODS)
    if local and "spark.sql.shuffle.partitions" not in conf:
        # the default (200) is sized for clusters; adaptive execution coalesces from here
        builder = builder.config("spark.sql.shuffle.partitions", str(4 * (os.cpu_count() or 2)))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if ship == "true":
        ship_package(spark)
    return spark


def check_master(master: str, timeout: float = MASTER_TIMEOUT) -> None:
    """Raise :class:`~messagebox.errors.MessageBoxError` naming ``master`` when it is a
    ``spark://host:port[,host:port…]`` URL and none of its hosts accepts a connection
    within ``timeout`` seconds (Spark itself tries for a minute, then fails with an
    error about a stopped context). Other masters are left to Spark."""
    if not master.startswith("spark://"):
        return
    refusals = []
    for address in master.removeprefix("spark://").split(","):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MessageBoxError(
                f"Spark master {master!r}: expected spark://host:port (several masters: "
                "spark://host1:port1,host2:port2)"
            )
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout).close()
        except OSError as exc:
            refusals.append(f"{address}: {exc.strerror or exc}")
            continue
        return
    raise MessageBoxError(
        f"Spark master {master} does not answer ({'; '.join(refusals)}): is it running, "
        "and is the URL the one its log or web UI shows?"
    )


def package_zip(folder: Path) -> Path:
    """A zip of the installed messagebox package, written in ``folder`` (named by its
    content's hash), without compiled parts: executors import it as they import the
    driver's copy, in pure Python."""
    import messagebox

    root = Path(messagebox.__file__).parent
    files: list[tuple[str, Path]] = []
    # the repository's top-level packages are links inside messagebox/: follow them
    for here, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            path = Path(here, name)
            if path.suffix not in _LEFT_OUT:
                files.append((f"messagebox/{path.relative_to(root).as_posix()}", path))
    digest = hashlib.sha256()
    for arcname, path in files:
        digest.update(arcname.encode() + b"\0" + path.read_bytes())
    target = folder / f"messagebox-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        partial = target.with_suffix(".tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, path in files:
                zf.write(path, arcname)
        partial.replace(target)
    return target


def ship_package(spark: SparkSession) -> Path:
    """Send the messagebox package to the session's executors (``addPyFile`` of
    :func:`package_zip`), once per application; returns the zip. The executors' Python
    then imports messagebox from it, ahead of any copy installed there; its
    dependencies (SQLAlchemy, the database drivers…) must be installed there."""
    sc = spark.sparkContext
    app = str(sc.applicationId)
    if app not in _shipped:
        folder = Path(tempfile.mkdtemp(prefix="messagebox-ship-"))
        atexit.register(shutil.rmtree, folder, True)  # served to executors until then
        _shipped[app] = package_zip(folder)
        sc.addPyFile(str(_shipped[app]))
    return _shipped[app]


_EXECUTOR_FAILURES = re.compile(
    r"(ModuleNotFoundError|ImportError): ([^\n]*)|Cannot run program (\"[^\"]*\")"
)


@contextmanager
def python_on_executors(spark: SparkSession, what: str) -> Iterator[None]:
    """Run a job whose tasks import messagebox on the executors: a failure to start
    their Python or to import a module there is raised as
    :class:`~messagebox.errors.MessageBoxError` saying what is missing and what to do;
    other failures go through as they are."""
    try:
        yield
    except Exception as exc:
        found = _EXECUTOR_FAILURES.search(str(exc))
        if found is None:
            raise
        python = spark.sparkContext.pythonExec
        if found.group(3):
            why = f"the executors cannot run Python {found.group(3)} (PYSPARK_PYTHON)"
        else:
            why = f"the executors' Python ({python}) cannot import a module: {found.group(2)}"
        raise MessageBoxError(
            f"{what}: {why}. Set PYSPARK_PYTHON to a Python every executor has, with "
            "messagebox's dependencies installed; messagebox itself is shipped by "
            "session() on a cluster master, or by ship_package(spark) (docs/howto-spark.md, "
            "On a cluster)"
        ) from exc
