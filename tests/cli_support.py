"""Running the ``messagebox`` command line from tests: in this process (fast) or as a
subprocess (when the process boundary is what a test is about).

:func:`run_cli` calls :func:`messagebox.cli.main` as ``python -m messagebox.cli`` would
run it with pipes for stdin, stdout and stderr, and answers as :func:`subprocess.run`
does (a :class:`subprocess.CompletedProcess` with the exit code and both outputs as
text), without paying ~2 s of interpreter start-up and imports per command. It swaps
the process-wide state a command reads or changes, and puts it all back, whatever
happens:

- ``sys.stdin``, ``sys.stdout`` and ``sys.stderr``: text wrappers over bytes buffers
  (so ``.buffer`` works for binary input and output, and ``isatty()`` is False, as on
  a pipe);
- the environment (``env`` is applied, and whatever the command set is undone);
- the root logger's handlers and level (``--log-format`` replaces them), and the
  ``messagebox.typecheck`` logger's (the CLI quiets it: it says those warnings itself);

``SystemExit`` (argparse's usage errors, ``--help``) becomes its exit code; any other
exception propagates, with its traceback, where a subprocess would print it and exit 1.
A command that leaves a DuckDB file open fails the test: the CLI opens the box and
closes it, and an open file would lock the database against the next command.

:func:`run_process` runs ``python -m messagebox.cli`` for real.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
PROCESS_TIMEOUT = 120.0


def run_cli(
    argv: Sequence[str], *, stdin: bytes = b"", env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``messagebox ARGV`` in this process: (exit code, stdout, stderr) as a subprocess
    with piped stdin/stdout/stderr would give them."""
    from messagebox.cli import main

    args = list(argv)
    out, err = _sink("strict"), _sink("backslashreplace")
    opened = _duckdb_files()
    with _environment(env or {}), _root_logging(), _streams(_source(stdin), out, err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = _exit_code(exc, err)
    left = _duckdb_files() - opened
    assert not left, f"`messagebox {' '.join(args)}` left DuckDB files open: {sorted(left)}"
    return subprocess.CompletedProcess(
        ["messagebox", *args], code, _text(out, "strict"), _text(err, "backslashreplace")
    )


def run_process(
    argv: Sequence[str],
    *,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    command: Sequence[str] = (sys.executable, "-m", "messagebox.cli"),
) -> subprocess.CompletedProcess[str]:
    """``messagebox ARGV`` as a subprocess (``python -m messagebox.cli`` unless
    ``command`` says otherwise), stdin and stdout pipes, from the repository's root."""
    result = subprocess.run(
        [*command, *argv],
        input=stdin,
        capture_output=True,
        timeout=PROCESS_TIMEOUT,
        cwd=ROOT,
        env=process_env(env),
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


def process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, the repository importable, plus ``env``."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}


def _sink(errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors)


def _source(data: bytes) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def _text(stream: io.TextIOWrapper, errors: str) -> str:
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode("utf-8", errors)


def _exit_code(exc: SystemExit, err: TextIO) -> int:
    """The status ``sys.exit(code)`` gives a process (a message is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=err)
    return 1


@contextmanager
def _streams(stdin: TextIO, stdout: TextIO, stderr: TextIO) -> Iterator[None]:
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` applied for the block; afterwards the environment is as it was before,
    whatever the block set or removed."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextmanager
def _root_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were (pytest's capture handlers
    among them), and any handler the command installed closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    typecheck = logging.getLogger("messagebox.typecheck")  # the CLI quiets it
    typecheck_state = typecheck.handlers[:], typecheck.propagate
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        typecheck.handlers[:], typecheck.propagate = typecheck_state


def _duckdb_files() -> set[str]:
    """The DuckDB databases (and their write-ahead logs) this process has open."""
    found: set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: nothing to check
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith((".duckdb", ".duckdb.wal")):
            found.add(target)
    return found
