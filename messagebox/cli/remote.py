"""Commands served by a running process: the management endpoint of an embedded store.

A DuckDB file is open in one process at a time. The process that holds it (``messagebox
host run``, ``messagebox console``) serves a small management API beside its console and
writes an *endpoint file* beside the database (``messagebox.duckdb.endpoint``: its
address, pid and API token, readable by its owner only). While that process lives, every
store command of the command line — ``queues``, ``stats``, ``suspended resume`` … — is
sent to it and runs there, on its open store, with the same output and exit code as run
here. ``--url http://HOST:PORT`` sends the command to such an endpoint explicitly (its
token from ``MESSAGEBOX_CONSOLE_TOKEN``), on either backend.

The files a command reads (``publish FILE``, ``--filter @FILE``) and standard input are
read here and sent with it; its standard output and error come back when it ends (so
progress shows at the end, not as it goes).

The API: ``POST /api/v1/cli`` with ``{"argv": [...], "files": {name: base64},
"stdin": base64}`` answers ``{"exit": N, "stdout": base64, "stderr": base64}``;
``GET /api/v1/status`` answers what the process serves. Both need ``Authorization:
Bearer TOKEN``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import re
import secrets
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

ENDPOINT_SUFFIX = ".endpoint"
"""Beside ``store.duckdb``: ``store.duckdb.endpoint``."""

TOKEN_ENV = "MESSAGEBOX_CONSOLE_TOKEN"
NOT_SERVED = ("host", "console")
"""Commands that start a process of their own and are never sent. (``spark`` commands
are: the process that holds the store runs the Spark job, with this machine's paths.)"""
SPARK_PATHS = ("input", "output", "subscriptions", "proposed")
"""``spark`` options naming local files or folders: resolved against the command line's
working directory, which is sent along."""

STDIN_NOTE = "reading the message body from standard input (end it with Ctrl-D)"
TIMEOUT_SECONDS = 3600.0
CHECK_SECONDS = 5.0
"""How long the command line waits for a serving process to say it is there."""
"""How long the command line waits for a served command (a bulk resume may be long)."""

_DUCKDB_URL = re.compile(r"^duckdb(?:\+\w+)?:///(?P<path>[^?]*)")


@dataclass(frozen=True)
class Endpoint:
    """A running process that serves store commands."""

    url: str
    token: str | None
    pid: int | None = None
    file: Path | None = None
    """The endpoint file it was found from, if any."""


def duckdb_file(url: str) -> Path | None:
    """The database file of a DuckDB URL (None for another backend or in memory)."""
    found = _DUCKDB_URL.match(url)
    if found is None or not found.group("path") or found.group("path") == ":memory:":
        return None
    return Path(found.group("path"))


def endpoint_file(database: Path) -> Path:
    return database.with_name(database.name + ENDPOINT_SUFFIX)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def endpoint_for(url: str) -> Endpoint | None:
    """Where commands on ``url`` are served: the endpoint itself for an ``http(s)://``
    URL; for a DuckDB file, the process named in its endpoint file while that process
    answers as that process (a file left by a crash is ignored, with a note); else None
    (open the store here). An endpoint file that another user owns, or that others may
    write, is refused: it would send this user's commands and files elsewhere."""
    if url.startswith(("http://", "https://")):
        token = os.environ.get(TOKEN_ENV)
        return Endpoint(url.rstrip("/"), token.strip() if token else None)
    database = duckdb_file(url)
    if database is None:
        return None
    path = endpoint_file(database)
    from messagebox.errors import MessageBoxError

    try:
        info = path.stat()
        data = json.loads(path.read_text(encoding="utf-8"))
        pid = int(data["pid"])
        served = Endpoint(str(data["url"]).rstrip("/"), data.get("token"), pid, path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MessageBoxError(f"unreadable endpoint file {str(path)!r}: {exc}") from exc
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise MessageBoxError(
            f"the endpoint file {str(path)!r} is another user's or writable by others: "
            "not trusted (remove it if no process of yours serves this store)"
        )
    if not _alive(pid) or not _answers(served):
        print(
            f"messagebox: note: ignoring {str(path)!r}: process {pid} does not answer "
            "(it ended without removing it)",
            file=sys.stderr,
        )
        return None
    return served


def _answers(endpoint: Endpoint) -> bool:
    """Whether the endpoint answers as the process its file names."""
    try:
        status = _request(endpoint, "/api/v1/status", None, timeout=CHECK_SECONDS)
    except (OSError, ValueError):
        return False
    return isinstance(status, dict) and status.get("pid") == endpoint.pid


def advertise(database: Path, url: str, token: str) -> Path:
    """Write the endpoint file of ``database``, readable by its owner only (it holds the
    token): written to a new private file, then renamed into place."""
    path = endpoint_file(database)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"url": url, "pid": os.getpid(), "token": token}, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def withdraw(path: Path) -> None:
    """Remove an endpoint file this process wrote (not one another process wrote since)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        if int(json.loads(path.read_text(encoding="utf-8"))["pid"]) == os.getpid():
            path.unlink()


def new_token() -> str:
    return secrets.token_urlsafe(24)


# --- the command line's side ---


FILE_OPTIONS = ("filter", "properties_json")
"""The options that take ``@FILE`` (read by :func:`messagebox.cli.inputs.read_arg`)."""


def _named_files(args: argparse.Namespace) -> list[str]:
    """The files a command reads: ``@FILE`` values of :data:`FILE_OPTIONS`,
    ``publish``'s files and a routing file."""
    names = [
        v[1:]
        for key in FILE_OPTIONS
        if isinstance(v := getattr(args, key, None), str) and v.startswith("@") and len(v) > 1
    ]
    if args.command == "publish":
        names.extend(f for f in args.files if f != "-")
    if args.command in ("plan", "apply", "lint") and getattr(args, "file", None):
        names.append(args.file)
    return names


def _request(
    endpoint: Endpoint,
    path: str,
    body: Mapping[str, Any] | None,
    timeout: float = TIMEOUT_SECONDS,
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(endpoint.url + path, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if endpoint.token:
        req.add_header("Authorization", f"Bearer {endpoint.token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _where(endpoint: Endpoint) -> str:
    if endpoint.file is None:
        return endpoint.url
    return f"process {endpoint.pid} at {endpoint.url} (from {str(endpoint.file)!r})"


def forward(endpoint: Endpoint, argv: Sequence[str], args: argparse.Namespace) -> int:
    """Run the command in the process that serves the store; returns its exit code."""
    if args.command in NOT_SERVED:
        if args.command == "console" and endpoint.file is not None:
            print(
                f"messagebox console: the store is open in {_where(endpoint)}, which serves "
                f"the console: {endpoint.url}/",
                file=sys.stderr,
            )
            return 0
        print(
            f"messagebox {args.command}: the store is open in {_where(endpoint)}; "
            f"`{args.command}` needs the database itself: stop that process first",
            file=sys.stderr,
        )
        return 1
    files: dict[str, str] = {}
    for name in _named_files(args):
        try:
            files[name] = base64.b64encode(Path(name).read_bytes()).decode()
        except OSError as exc:  # as the command says it when run here
            action = getattr(args, "action", None)
            command = f"{args.command} {action}" if action else args.command
            print(f"messagebox {command}: error: cannot read {name!r}: {exc}", file=sys.stderr)
            return 2
    stdin = b""
    if args.command == "publish" and ("-" in args.files or not args.files):
        if sys.stdin.isatty():
            print(STDIN_NOTE, file=sys.stderr)
        stdin = sys.stdin.buffer.read()
    body = {
        "argv": list(argv),
        "files": files,
        "stdin": base64.b64encode(stdin).decode(),
        "cwd": os.getcwd(),
    }
    try:
        answer = _request(endpoint, "/api/v1/cli", body)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        if exc.code in (401, 403):
            detail = f"the token was refused ({detail}); set {TOKEN_ENV}"
        print(f"messagebox: {_where(endpoint)} answered {exc.code}: {detail}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(
            f"messagebox: the store is served by {_where(endpoint)}, which does not answer: {exc}",
            file=sys.stderr,
        )
        return 1
    sys.stdout.flush()
    sys.stdout.buffer.write(base64.b64decode(answer["stdout"]))
    sys.stdout.flush()
    sys.stderr.write(base64.b64decode(answer["stderr"]).decode("utf-8", "replace"))
    return int(answer["exit"])


# --- the serving process's side ---

_PARSE = threading.Lock()


def serve(box: MessageBox, body: Mapping[str, Any], client: str | None = None) -> dict[str, Any]:
    """Run a command sent by :func:`forward` on ``box``; what :func:`forward` prints."""
    from messagebox.cli.inputs import SENT, Sent
    from messagebox.cli.parser import build
    from messagebox.cli.running import EXIT_USAGE, run, shown_argv
    from messagebox.cli.terminal import Terminal

    argv = body.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    raw_files = body.get("files") or {}
    if not isinstance(raw_files, dict):
        raise ValueError("files must be an object of base64 strings")
    sent = Sent(
        {str(k): base64.b64decode(v) for k, v in raw_files.items()},
        base64.b64decode(body.get("stdin") or ""),
    )
    errors = io.StringIO()
    with _PARSE, contextlib.redirect_stderr(errors):  # argparse writes its errors there
        try:
            args = build().parse_args(argv)
        except SystemExit as exc:
            return _answer(
                int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE,
                b"",
                errors.getvalue(),
            )
    if args.command in NOT_SERVED:
        return _answer(EXIT_USAGE, b"", f"messagebox: `{args.command}` is not served here\n")
    args.url = args.explicit_url = box.store.url.render_as_string(hide_password=True)
    if args.command == "spark":
        return _serve_spark(args, body.get("cwd"))
    args.served_box = box
    args.served_for = f"token holder at {client or 'an unknown address'}"
    args.argv = shown_argv(argv)
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    out = Terminal(
        json_output=args.json, progress=bool(args.progress), stdout=stdout, stderr=errors
    )
    token = SENT.set(sent)
    try:
        code = run(args, out)
    finally:
        SENT.reset(token)
        stdout.flush()
    action = getattr(args, "action", None)
    command = f"{args.command} {action}" if action else args.command
    return _answer(code, raw.getvalue(), errors.getvalue(), command)


def _answer(code: int, stdout: bytes, stderr: str, command: str | None = None) -> dict[str, Any]:
    return {
        "command": command,
        "exit": code,
        "stdout": base64.b64encode(stdout).decode(),
        "stderr": base64.b64encode(stderr.encode()).decode(),
    }


_SPARK = threading.Lock()


def _serve_spark(args: argparse.Namespace, cwd: object) -> dict[str, Any]:
    """Run a ``spark`` command here, in the process that holds the store: its paths taken
    from the caller's working directory, its output captured (one at a time: the job
    prints to this process's standard streams)."""
    from messagebox.pipelines.spark_cli import run as spark

    if isinstance(cwd, str) and cwd:
        for key in SPARK_PATHS:
            value = getattr(args, key, None)
            if isinstance(value, str) and value and "://" not in value:
                setattr(args, key, os.path.join(cwd, value))
    out, err = io.StringIO(), io.StringIO()
    with _SPARK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = spark(args)
    command = f"spark {args.spark_command}"
    return _answer(code, out.getvalue().encode(), err.getvalue(), command)
