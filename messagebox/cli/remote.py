"""Commands served by a running process: the management endpoint of an embedded store.

A DuckDB file is open in one process at a time. The process that holds it (``messagebox
host run``, ``messagebox console``) serves a small management API beside its console and
writes an *endpoint file* beside the database (``messagebox.duckdb.endpoint``: its
address, pid and API token, readable by its owner only). While that process lives, every
store command of the command line — ``queues``, ``stats``, ``suspended resume`` … — is
sent to it and runs there, on its open store, with the same output and exit code as run
here. ``--url http://HOST:PORT`` sends the command to such an endpoint explicitly (its
token from ``MESSAGEBOX_CONSOLE_TOKEN``), on either backend.

The endpoint file is trusted only as a regular file (not a symbolic link), this user's,
that no one else may write, checked on the file opened; and the process it names must
say, in its status, that it serves this database (its resolved path, or the file's
device and inode), else the command is refused.

**Served commands** (an allow-list, :data:`messagebox.console.served.SERVED`):
``init``, ``publish``, ``subscriptions``, ``route explain``, ``services``, ``hosts``,
``messages show``, ``queues``, ``instances``, ``suspended``, ``scheduled``, ``cleanup``,
``stats``, ``check``, ``tracking``, ``metrics``, ``export``, ``plan``, ``apply``, ``versions``,
``rollback``, ``lint``, ``users``, ``spark route`` and ``spark what-if``. Any other is
refused, exit code 2, naming it (``host run`` and ``console`` start a process of their
own: the command line says so without sending them).

The files a command reads (``publish FILE``, ``--filter @FILE``, a routing file, a
``spark`` command's ``--subscriptions`` or ``--proposed`` JSON file) and standard input
are read here and sent with it (so is the password ``users add`` and ``users
reset-password`` ask for here); its standard output and error come back when it ends (so
progress shows at the end, not as it goes). A served ``spark`` command's input and
output are read and written by the serving process, only inside the store's own folder
and the folders its operator allows (:mod:`messagebox.console.paths`).

The command line waits for the serving process :data:`TIMEOUTS`: 10 s to connect, then
60 s of silence at most (the process sends a space every 5 s while a command runs, so a
long command is waited for, a process that stopped answering is not). It follows no
redirect (the token goes to the address given only), and refuses an answer that is not
JSON of the shape below, naming what it got (shortened; exit code 1).

The API: ``POST /api/v1/cli`` with ``{"argv": [...], "files": {name: base64},
"stdin": base64, "cwd": DIR}`` answers ``{"exit": N, "stdout": base64, "stderr":
base64}``; ``GET /api/v1/status`` answers what the process serves. Both need
``Authorization: Bearer TOKEN`` (:mod:`messagebox.console.api`; the serving side is
:mod:`messagebox.console.served`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import errno
import http.client
import json
import os
import re
import secrets
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ENDPOINT_SUFFIX = ".endpoint"
"""Beside ``store.duckdb``: ``store.duckdb.endpoint``."""

TOKEN_ENV = "MESSAGEBOX_CONSOLE_TOKEN"
NOT_SERVED = ("host", "console")
"""Commands that start a process of their own: the command line says so itself."""

SPARK_FILES = ("subscriptions", "proposed")
"""``spark`` options naming a JSON file the command line reads and sends (a MessageBox
URL, or a ``file://`` URL naming a file on the serving machine, is sent as it is)."""

STDIN_NOTE = "reading the message body from standard input (end it with Ctrl-D)"
SENT_FILE_BYTES = 256 << 20
"""The largest file the command line sends to a serving process (whole, in the
request): a regular file only, never a FIFO or a device it would read for ever."""
MAX_ANSWER_BYTES = 1 << 30
"""An answer longer than this is refused (1 GiB: a message body as stdout, in base64)."""
MAX_ENDPOINT_BYTES = 64 * 1024

_DUCKDB_URL = re.compile(r"^duckdb(?:\+\w+)?:///(?P<path>[^?]*)")


@dataclass(frozen=True)
class Timeouts:
    """How long the command line waits for a serving process, in seconds."""

    connect: float = 10.0
    idle: float = 60.0
    """The longest silence, once connected (it sends a space every 5 s while it works)."""


TIMEOUTS = Timeouts()
"""For a command."""
CHECK_TIMEOUTS = Timeouts(connect=5.0, idle=5.0)
"""For asking a process named in an endpoint file whether it is there."""


class RemoteError(Exception):
    """A serving process gave no usable answer; the message says what it did."""


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


def store_identity(database: Path) -> dict[str, str]:
    """How a process names the DuckDB file it serves, in its status: ``database``, the
    resolved path, and ``database_id``, the file's device and inode."""
    real = os.path.realpath(database)
    identity = {"database": real}
    with contextlib.suppress(OSError):
        info = os.stat(real)
        identity["database_id"] = f"{info.st_dev}:{info.st_ino}"
    return identity


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
    (open the store here). An endpoint file that is a symbolic link or not a regular
    file, that another user owns or others may write, or whose process serves another
    store, is refused (MessageBoxError): it would send this user's commands and files
    elsewhere."""
    from messagebox.errors import MessageBoxError

    if url.startswith(("http://", "https://")):
        token = os.environ.get(TOKEN_ENV)
        return Endpoint(url.rstrip("/"), token.strip() if token else None)
    database = duckdb_file(url)
    if database is None:
        return None
    path = endpoint_file(database)
    data = _read_endpoint(path)
    if data is None:
        return None
    try:
        pid = int(data["pid"])
        token = data.get("token")
        if token is not None and not isinstance(token, str):
            raise TypeError("the token is not a string")
        served = Endpoint(str(data["url"]).rstrip("/"), token, pid, path)
    except (ValueError, KeyError, TypeError) as exc:
        raise MessageBoxError(f"unreadable endpoint file {str(path)!r}: {exc}") from exc
    status = _status(served) if _alive(pid) else None
    if status is None or status.get("pid") != pid:
        print(
            f"messagebox: note: ignoring {str(path)!r}: process {pid} does not answer "
            "(it ended without removing it)",
            file=sys.stderr,
        )
        return None
    _check_store(status, database, served)
    return served


def _read_endpoint(path: Path) -> dict[str, Any] | None:
    """The endpoint file's contents (None: there is none), read from the file checked:
    a regular file, not a link, this user's and not writable by others."""
    from messagebox.errors import MessageBoxError

    def refused(why: str) -> MessageBoxError:
        return MessageBoxError(
            f"the endpoint file {str(path)!r} {why}: not trusted (remove it if no "
            "process of yours serves this store)"
        )

    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise refused(f"is a symbolic link (to {os.readlink(path)!r})")
        if not stat.S_ISREG(info.st_mode):
            raise refused("is not a regular file")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # made a link since
            raise refused("is a symbolic link") from exc
        raise MessageBoxError(f"unreadable endpoint file {str(path)!r}: {exc}") from exc
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise refused("is not a regular file")
        if opened.st_uid != os.getuid() or opened.st_mode & 0o022:
            raise refused("is another user's or writable by others")
        raw = os.read(fd, MAX_ENDPOINT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw) if len(raw) <= MAX_ENDPOINT_BYTES else None
    except ValueError as exc:
        raise MessageBoxError(f"unreadable endpoint file {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise MessageBoxError(f"unreadable endpoint file {str(path)!r}: not a JSON object")
    return data


def _status(endpoint: Endpoint) -> dict[str, Any] | None:
    """The endpoint's status, or None when it gives none."""
    try:
        status = _request(endpoint, "/api/v1/status", None, CHECK_TIMEOUTS)
    except RemoteError:
        return None
    return status if isinstance(status, dict) else None


def _check_store(status: Mapping[str, Any], database: Path, endpoint: Endpoint) -> None:
    """Refuse a process that serves another store than ``database``."""
    from messagebox.errors import MessageBoxError

    asked = store_identity(database)
    served_id, served = status.get("database_id"), status.get("database")
    same_file = served_id is not None and served_id == asked.get("database_id")
    if same_file or served == asked["database"]:
        return
    serves = f"serves {served}" if isinstance(served, str) else "does not say which store it serves"
    raise MessageBoxError(
        f"the endpoint file {str(endpoint.file)!r} names process {endpoint.pid} at "
        f"{endpoint.url}, which {serves}, not {asked['database']}: refused (remove the "
        "file if no process serves this store)"
    )


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
    from messagebox.errors import MessageBoxError

    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, MessageBoxError):
        data = _read_endpoint(path)
        if data is not None and int(data["pid"]) == os.getpid():
            path.unlink()


def new_token() -> str:
    return secrets.token_urlsafe(24)


# --- the command line's side ---


FILE_OPTIONS = ("filter", "properties_json")
"""The options that take ``@FILE`` (read by :func:`messagebox.cli.inputs.read_arg`)."""


def _named_files(args: argparse.Namespace) -> list[str]:
    """The files a command reads: ``@FILE`` values of :data:`FILE_OPTIONS`,
    ``publish``'s files, a routing file, ``suspended resubmit --body`` and a ``spark``
    command's JSON file."""
    names = [
        v[1:]
        for key in FILE_OPTIONS
        if isinstance(v := getattr(args, key, None), str) and v.startswith("@") and len(v) > 1
    ]
    if args.command == "publish":
        names.extend(f for f in args.files if f != "-")
    if args.command in ("plan", "apply", "lint") and getattr(args, "file", None):
        names.append(args.file)
    if args.command == "suspended" and getattr(args, "body", None):
        names.append(args.body)
    if args.command == "spark":
        names.extend(
            v
            for key in SPARK_FILES
            if isinstance(v := getattr(args, key, None), str) and v and "://" not in v
        )
    return names


def _request(
    endpoint: Endpoint, path: str, body: Mapping[str, Any] | None, timeouts: Timeouts | None = None
) -> Any:
    """POST ``body`` (GET without one) to the endpoint; its JSON answer. RemoteError
    says what went wrong: no connection, no answer in time, a redirect, an error status,
    an answer that is not JSON."""
    status, message, raw = _exchange(endpoint, path, body, timeouts or TIMEOUTS)
    kind = message.get_content_type()
    if 300 <= status < 400:
        location = _printable(message.get("Location") or "nowhere")
        raise RemoteError(
            f"answered {status}, a redirect to {location!r}: not followed (the token is "
            "sent to the address given only); give the serving process's own address"
        )
    if status != 200:
        detail = _gist(raw, kind)
        if status in (401, 403):
            detail = f"the token was refused ({detail}); set {TOKEN_ENV}"
        raise RemoteError(f"answered {status}: {detail}")
    try:
        return json.loads(raw)
    except ValueError:
        raise RemoteError(f"answered with something that is not JSON: {_gist(raw, kind)}") from None


def _exchange(
    endpoint: Endpoint, path: str, body: Mapping[str, Any] | None, timeouts: Timeouts
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """The status, headers and body of one request, redirects not followed."""
    parts = urlsplit(endpoint.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"is not an http:// or https:// address: {endpoint.url!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeouts.connect)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if endpoint.token:
        headers["Authorization"] = f"Bearer {endpoint.token}"
    try:
        try:
            connection.connect()
        except TimeoutError:
            raise RemoteError(f"does not answer: no connection in {timeouts.connect:g} s") from None
        except OSError as exc:
            raise RemoteError(f"does not answer: {exc}") from None
        assert connection.sock is not None
        connection.sock.settimeout(timeouts.idle)
        method = "GET" if data is None else "POST"
        connection.request(method, parts.path.rstrip("/") + path, body=data, headers=headers)
        response = connection.getresponse()
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read1(1 << 16):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise RemoteError(f"answered more than {MAX_ANSWER_BYTES:,} bytes: refused")
            chunks.append(chunk)
    except TimeoutError:
        raise RemoteError(
            f"gave no answer in {timeouts.idle:g} s: given up (a command it was running "
            "may go on there)"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise RemoteError(f"does not answer: {exc}") from None
    finally:
        connection.close()
    return response.status, response.msg, b"".join(chunks)


def _printable(text: str) -> str:
    """``text`` with control characters (a terminal's escapes) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _gist(raw: bytes, kind: str) -> str:
    """What an answer says, in a line of 200 characters at most: a JSON error's text,
    an HTML page's title, else the first line."""
    text = raw.decode("utf-8", "replace")
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict) and isinstance(found.get("error"), str):
        text = found["error"]
    elif "html" in kind or text.lstrip().startswith("<"):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]*>", " ", text)
        text = "an HTML page" + (f" titled {' '.join(text.split())!r}" if text.strip() else "")
    line = next((line.strip() for line in text.splitlines() if line.strip()), "an empty body")
    line = _printable(line)
    return line if len(line) <= 200 else line[:200] + "…"


def _decoded(answer: Any) -> tuple[int, bytes, bytes]:
    """The exit code, standard output and standard error of a served command's answer
    (RemoteError when it is not one)."""
    code = answer.get("exit") if isinstance(answer, dict) else None
    streams = [answer.get(k) for k in ("stdout", "stderr")] if isinstance(answer, dict) else []
    try:
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise ValueError(code)
        texts = [v for v in streams if isinstance(v, str)]
        if len(texts) != 2:
            raise ValueError(streams)
        out, err = (base64.b64decode(v, validate=True) for v in texts)
    except (ValueError, binascii.Error):  # the answer shown as it came, shortened
        shown = _gist(json.dumps(answer).encode(), "application/json")
        raise RemoteError(
            f"answered with something that is not a served command's answer: {shown}"
        ) from None
    return code, out, err


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
    from messagebox.cli.inputs import UsageError
    from messagebox.cli.users import forwarded_password
    from messagebox.config.routing_file import RoutingFileError, read_bytes

    files: dict[str, str] = {}
    for name in _named_files(args):
        try:
            files[name] = base64.b64encode(read_bytes(name, "file", SENT_FILE_BYTES)).decode()
        except RoutingFileError as exc:  # a FIFO, a device, too large: as when run here
            print(f"messagebox {command_name(args)}: error: {exc}", file=sys.stderr)
            return 2
    stdin = b""
    if args.command == "publish" and ("-" in args.files or not args.files):
        if sys.stdin.isatty():
            print(STDIN_NOTE, file=sys.stderr)
        stdin = sys.stdin.buffer.read()
    try:
        password = forwarded_password(args)  # asked here, sent as standard input
    except UsageError as exc:
        print(f"messagebox {command_name(args)}: error: {exc}", file=sys.stderr)
        return 2
    if password is not None:
        stdin = password
        argv = [*argv, *([] if args.password_stdin else ["--password-stdin"])]
    body = {
        "argv": list(argv),
        "files": files,
        "stdin": base64.b64encode(stdin).decode(),
        "cwd": os.getcwd(),
    }
    try:
        code, out, err = _decoded(_request(endpoint, "/api/v1/cli", body))
    except RemoteError as exc:
        print(f"messagebox: {_where(endpoint)} {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"messagebox: interrupted; the command may still be running in {_where(endpoint)}",
            file=sys.stderr,
        )
        return 130
    sys.stdout.flush()
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    sys.stderr.write(err.decode("utf-8", "replace"))
    return code


def command_name(args: argparse.Namespace) -> str:
    """The command's name as typed: ``suspended resume``, ``spark route``, ``stats``."""
    return f"{args.command} {action}" if (action := command_action(args)) else args.command


def command_action(args: argparse.Namespace) -> str:
    """The command's action (``resume``, ``route``), or ""."""
    for key in ("action", "spark_command", "host_command"):
        if value := getattr(args, key, None):
            return str(value)
    return ""
