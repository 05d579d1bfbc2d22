"""Running the commands a token holder sends (``POST /api/v1/cli``, from
:func:`messagebox.cli.remote.forward`) on the store this process holds.

**Served commands** (:data:`SERVED`, an allow-list): ``init``, ``publish``,
``subscriptions`` (``list``, ``add``, ``remove``, ``set-filter``), ``route explain``,
``services`` (``start``, ``stop``, ``unenlist``), ``hosts`` (``list``, ``add``,
``set``, ``remove``), ``messages show``, ``queues``, ``instances``, ``search``, ``orchestrations``
(``list``, ``find``, ``show``, ``terminate``), ``suspended`` (``list``, ``show``,
``resume``, ``terminate``, ``reroute``, ``resubmit``), ``failures`` (``list``, ``show``,
``resume``, ``terminate``), ``scheduled`` (``list``, ``deliver-now``, ``cancel``),
``cleanup``, ``stats``, ``check``, ``tracking`` (``status``, ``enable``, ``disable``,
``events``), ``metrics``, ``export``, ``plan``, ``apply``, ``versions``, ``rollback``,
``lint``, ``spark route`` and ``spark what-if``. Any other command (``host run``,
``console``, or one added to the command line and not here) is refused with exit code 2,
naming it.

A served command reads the files and standard input sent with it, never this machine's
(:data:`messagebox.cli.inputs.SENT`), and writes only its answer; except ``spark
route`` and ``spark what-if``, whose input and output are this machine's: they are
confined to the store's own folder and the folders the operator allows
(:mod:`messagebox.console.paths`), their JSON files taken from what was sent.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import io
import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messagebox.cli.inputs import Sent
from messagebox.cli.remote import SPARK_FILES, command_action, command_name, duckdb_file
from messagebox.console.paths import Refused, ServedPaths, confine_spark

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

SERVED: frozenset[tuple[str, str]] = frozenset(
    (command, action)
    for command, actions in {
        # command: its actions, space-separated; a leading space: also without one
        "init": "",
        "publish": "",
        "subscriptions": " list add remove set-filter",
        "route": "explain",
        "services": "start stop unenlist",
        "hosts": " list add set remove",
        "messages": "show",
        "queues": "",
        "instances": "",
        "search": "",
        "orchestrations": " list find show terminate",
        "suspended": "list show resume terminate reroute resubmit",
        "failures": " list show resume terminate",
        "scheduled": "list deliver-now cancel",
        "cleanup": "",
        "stats": "",
        "check": "",
        "tracking": " status enable disable events",
        "metrics": "",
        "export": "",
        "plan": "",
        "apply": "",
        "versions": "",
        "rollback": "",
        "lint": "",
        "spark": "route what-if",
        "users": " list add set-role disable enable remove reset-password",
    }.items()
    for action in actions.split(" ")
)
"""The commands this process runs for a token holder, as (command, action); "" when
there is none."""

_PARSE = threading.Lock()
_SPARK = threading.Lock()


@dataclass(frozen=True)
class ServedRequest:
    """A command sent by :func:`~messagebox.cli.remote.forward`, checked: its arguments,
    the files and standard input sent with it, the command line's working directory."""

    argv: list[str]
    sent: Sent
    cwd: str | None = None


def _names_this_store(url: str | None, box: MessageBox) -> bool:
    """Whether a served command's ``--url`` is this process's store: none, the serving
    process's address (what the command line reached it by), or the store itself."""
    if not url or url.startswith(("http://", "https://")):
        return True
    here = duckdb_file(box.store.url.render_as_string(hide_password=False))
    if here is not None:
        there = duckdb_file(url)
        return there is not None and os.path.realpath(there) == os.path.realpath(here)
    return box.store.names(url)


def parse_request(body: Mapping[str, Any]) -> ServedRequest:
    """The request of a ``POST /api/v1/cli`` body; ValueError names what is malformed."""
    argv = body.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    raw_files = body.get("files") or {}
    if not isinstance(raw_files, dict) or not all(isinstance(v, str) for v in raw_files.values()):
        raise ValueError("files must be an object of base64 strings")
    stdin = body.get("stdin") or ""
    cwd = body.get("cwd")
    if not isinstance(stdin, str) or not (cwd is None or isinstance(cwd, str)):
        raise ValueError("stdin must be a base64 string, cwd a string")
    try:
        files = {str(k): base64.b64decode(v, validate=True) for k, v in raw_files.items()}
        sent = Sent(files, base64.b64decode(stdin, validate=True))
    except binascii.Error as exc:
        raise ValueError(f"files and stdin must be base64: {exc}") from None
    return ServedRequest(list(argv), sent, cwd if cwd and os.path.isabs(cwd) else None)


def serve(
    box: MessageBox,
    body: Mapping[str, Any] | ServedRequest,
    client: str | None = None,
    paths: ServedPaths | None = None,
) -> dict[str, Any]:
    """Run a command sent by :func:`~messagebox.cli.remote.forward` on ``box`` (one off
    :data:`SERVED` is refused, exit code 2); the answer it prints. ``paths``: where a
    ``spark`` command may read and write (default: the store's own folder)."""
    from messagebox.cli.inputs import SENT
    from messagebox.cli.parser import build
    from messagebox.cli.running import EXIT_USAGE, run, shown_argv
    from messagebox.cli.terminal import Terminal

    request = body if isinstance(body, ServedRequest) else parse_request(body)
    errors, printed = io.StringIO(), io.StringIO()
    # argparse writes its errors, and --help, there (under the lock: the redirection is
    # the process's)
    with _PARSE, contextlib.redirect_stderr(errors), contextlib.redirect_stdout(printed):
        try:
            args = build().parse_args(request.argv)
        except SystemExit as exc:
            code = int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
            return answer(code, printed.getvalue().encode(), errors.getvalue())
    command = command_name(args)
    if (args.command, command_action(args)) not in SERVED:
        why = "a serving process runs the store commands and `spark route`/`what-if` only"
        return answer(EXIT_USAGE, b"", f"messagebox: `{command}` is not served: {why}\n", command)
    served = box.store.url.render_as_string(hide_password=True)
    if not _names_this_store(args.url, box):
        return answer(
            EXIT_USAGE,
            b"",
            f"messagebox: --url {args.url!r} names another store; this process serves {served}\n",
            command,
        )
    args.url = args.explicit_url = served
    if args.command == "spark":
        return _serve_spark(args, request, paths or ServedPaths.of(duckdb_file(args.url)))
    args.served_box = box
    args.served_for = f"token holder at {client or 'an unknown address'}"
    args.argv = shown_argv(request.argv)
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    out = Terminal(
        json_output=args.json, progress=bool(args.progress), stdout=stdout, stderr=errors
    )
    token = SENT.set(request.sent)
    try:
        code = run(args, out)
    finally:
        SENT.reset(token)
        stdout.flush()
    return answer(code, raw.getvalue(), errors.getvalue(), command)


def answer(code: int, stdout: bytes, stderr: str, command: str | None = None) -> dict[str, Any]:
    """A served command's answer (``command`` is for the log)."""
    return {
        "command": command,
        "exit": code,
        "stdout": base64.b64encode(stdout).decode(),
        "stderr": base64.b64encode(stderr.encode()).decode(),
    }


def failed_answer(exc: BaseException) -> dict[str, Any]:
    """The answer to a command that raised: exit code 1, the error on standard error."""
    from messagebox.cli.running import EXIT_ERROR

    text = f"messagebox: the serving process failed: {type(exc).__name__}: {exc}\n"
    return answer(EXIT_ERROR, b"", text, "(failed)")


def _serve_spark(
    args: argparse.Namespace, request: ServedRequest, paths: ServedPaths
) -> dict[str, Any]:
    """Run a ``spark`` command here, in the process that holds the store: its paths
    resolved from the caller's working directory and confined to ``paths``, its JSON
    files the ones sent, its output captured (one at a time: the job prints to this
    process's standard streams)."""
    from messagebox.cli.running import EXIT_USAGE
    from messagebox.pipelines.spark_cli import run as spark

    command = command_name(args)
    with tempfile.TemporaryDirectory(prefix="messagebox-served-") as scratch:
        sent: dict[str, Path] = {}
        for i, key in enumerate(SPARK_FILES):
            name = getattr(args, key, None)
            if isinstance(name, str) and name in request.sent.files:
                sent[name] = Path(scratch, f"{i}.json")
                sent[name].write_bytes(request.sent.files[name])

        def store(option: str, value: str, cwd: str) -> str:
            return _this_store(option, value, cwd, paths, args.url)

        try:
            confine_spark(args, paths, request.cwd, store, sent)
        except Refused as exc:
            return answer(EXIT_USAGE, b"", f"messagebox {command}: error: {exc}\n", command)
        out, err = io.StringIO(), io.StringIO()
        with _SPARK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = spark(args)
    return answer(code, out.getvalue().encode(), err.getvalue(), command)


def _this_store(option: str, value: str, cwd: str, paths: ServedPaths, url: str) -> str:
    """``url`` when ``value`` names the served DuckDB store; else Refused: a served
    command opens no other store."""
    database = duckdb_file(value)
    if (
        database is not None
        and paths.database is not None
        and Path(os.path.realpath(os.path.join(cwd, database))) == paths.database
    ):
        return url
    raise Refused(
        f"{option} {value!r}: a served command opens no store but the one it is served "
        "on; give a JSON file"
    )
