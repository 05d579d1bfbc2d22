"""``messagebox console``: serve the web console with uvicorn (arguments in
:mod:`messagebox.cli.parser`).

The token (resume, terminate, the contents of message parts) comes from
``MESSAGEBOX_CONSOLE_TOKEN`` or ``--token-file PATH`` (the file wins), never from the
command line, where other users could read it. Without one the console is read-only.
It also serves the management API (:mod:`messagebox.cli.remote`) to requests with that
token, or on a DuckDB store with the token it writes in the endpoint file beside the
database, so that the command line works on the store while the console holds it.
It answers to the ``--bind`` address's Host (on loopback also ``localhost``,
``127.0.0.1``, ``[::1]``) and to each ``--allowed-host NAME[:PORT]``
(:mod:`messagebox.console.hostcheck`).

Settings of the serving process (``host run`` reads them too):
``MESSAGEBOX_CONSOLE_TRUSTED_PROXIES`` (addresses or networks, comma-separated: the
reverse proxies whose ``X-Forwarded-For`` names the client, :mod:`.clients`; none by
default), ``MESSAGEBOX_SERVE_PATHS`` (folders, ``:``-separated, that a served ``spark``
command may read and write besides the store's own folder, :mod:`.paths`; none by
default), ``MESSAGEBOX_CONSOLE_SESSION_IDLE`` and ``MESSAGEBOX_CONSOLE_SESSION_LIFETIME``
(how long a login lasts unused, and at most: ``30m``, ``8h``; 1 hour and 8 hours by
default, :class:`.auth.SessionSettings`).

Exit codes: 0 after a clean stop (Ctrl-C), 1 a messagebox error (no such database), 2
bad usage (an unreadable or empty token file, a malformed host name, proxy or folder, a
session time out of bounds).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from messagebox.errors import MessageBoxError, NoSchema

if TYPE_CHECKING:
    from messagebox.console.auth import SessionSettings

TOKEN_ENV = "MESSAGEBOX_CONSOLE_TOKEN"
READ_TOKEN_ENV = "MESSAGEBOX_CONSOLE_READ_TOKEN"
SESSION_IDLE_ENV = "MESSAGEBOX_CONSOLE_SESSION_IDLE"
SESSION_LIFETIME_ENV = "MESSAGEBOX_CONSOLE_SESSION_LIFETIME"


class UsageProblem(Exception):
    """A bad option (exit code 2)."""


def token(
    token_file: str | None, *, env_name: str = TOKEN_ENV, option: str = "--token-file"
) -> str | None:
    """A console secret: the file's first line, else the environment's; None when
    neither is given. An empty one is refused rather than taken as no token."""
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageProblem(f"{option}: cannot read {token_file!r}: {exc}") from exc
        found = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not found:
            raise UsageProblem(f"{option}: {token_file!r} is empty")
        return found
    env = os.environ.get(env_name)
    if env is None:
        return None
    if not env.strip():
        raise UsageProblem(f"{env_name} is set but empty (unset it to go without)")
    return env.strip()


def secrets_of(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The console token and the read token of a command's options and environment."""
    secret = token(args.token_file)
    read = token(args.read_token_file, env_name=READ_TOKEN_ENV, option="--read-token-file")
    if read is not None and read == secret:
        raise UsageProblem("the read token must differ from the console token")
    return secret, read


def serving_settings() -> tuple[list[str], list[str]]:
    """The trusted proxies and the served folders of the environment (see above);
    UsageProblem names a malformed proxy or a folder that is not one."""
    from messagebox.console.clients import TRUSTED_PROXIES_ENV, TrustedProxies
    from messagebox.console.paths import SERVE_PATHS_ENV

    proxies = [p.strip() for p in os.environ.get(TRUSTED_PROXIES_ENV, "").split(",") if p.strip()]
    try:
        TrustedProxies.of(proxies)
    except ValueError as exc:
        raise UsageProblem(f"{TRUSTED_PROXIES_ENV}: {exc}") from exc
    folders = [f for f in os.environ.get(SERVE_PATHS_ENV, "").split(os.pathsep) if f.strip()]
    for folder in folders:
        if not os.path.isabs(folder) or not os.path.isdir(folder):
            raise UsageProblem(f"{SERVE_PATHS_ENV}: {folder!r} is not an absolute path to a folder")
    return proxies, folders


def session_settings() -> SessionSettings:
    """How long a console login lasts, from the environment (see above); UsageProblem
    names a malformed or out-of-bounds value."""
    from messagebox.cli.inputs import UsageError, duration
    from messagebox.console.auth import SessionSettings

    given: dict[str, float] = {}
    for key, env in (("idle", SESSION_IDLE_ENV), ("lifetime", SESSION_LIFETIME_ENV)):
        text = os.environ.get(env, "").strip()
        if text:
            try:
                given[key] = duration(text, env).total_seconds()
            except UsageError as exc:
                raise UsageProblem(str(exc)) from None
    try:
        return SessionSettings(**given)
    except ValueError as exc:
        raise UsageProblem(f"{SESSION_IDLE_ENV}, {SESSION_LIFETIME_ENV}: {exc}") from None


def check_hosts(bind: str, allowed: list[str]) -> None:
    """Refuse a malformed ``--allowed-host`` or ``--bind`` before the store is opened."""
    from messagebox.console.hostcheck import AllowedHosts, split_host

    for name in allowed:
        try:
            split_host(name)
        except ValueError as exc:
            raise UsageProblem(f"--allowed-host: {exc}") from exc
    try:
        AllowedHosts.of(bind)
    except ValueError as exc:
        raise UsageProblem(f"--bind: {exc}") from exc


@contextmanager
def _until_signal() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while inside (the handlers are put back after)."""
    stopped = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda _s, _f: stopped.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    """Serve the console until SIGINT/SIGTERM."""
    from messagebox.cli import remote
    from messagebox.console import create_app
    from messagebox.console.background import BackgroundServer
    from messagebox.engine import MessageBox

    try:
        secret, read = secrets_of(args)
        check_hosts(args.bind, args.allowed_host)
        proxies, folders = serving_settings()
        sessions = session_settings()
    except UsageProblem as exc:
        print(f"messagebox console: error: {exc}", file=sys.stderr)
        return 2
    try:
        box = MessageBox(args.url, create=False)
    except NoSchema as exc:
        print(f"messagebox: {exc}; `messagebox init` creates it", file=sys.stderr)
        return 1
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    from messagebox import logs

    logs.configure("INFO", args.log_format)
    with box:
        if secret is not None:
            mode = "resume, terminate and message contents need the token"
        elif box.has_users():
            mode = f"users log in at /login (no token: {TOKEN_ENV} or --token-file adds one)"
        else:
            mode = f"read-only (set {TOKEN_ENV} or --token-file to enable resume and terminate)"
        app = create_app(
            box,
            token=secret,
            bind=args.bind,
            allowed_hosts=args.allowed_host,
            api_token=secret or remote.new_token(),
            read_token=read,
            trusted_proxies=proxies,
            serve_paths=folders,
            sessions=sessions,
        )
        server = BackgroundServer(app, args.bind, args.port)
        with _until_signal() as stopped:
            try:
                served = server.start()
            except MessageBoxError as exc:
                print(f"messagebox: {exc}", file=sys.stderr)
                return 1
            print(f"console at {served}/ — {mode}", file=sys.stderr, flush=True)
            database = remote.duckdb_file(args.url)
            advertised = (
                None
                if database is None
                else remote.advertise(database, served, app.state.api_token)
            )
            try:
                while not stopped.wait(0.5):
                    pass
            finally:
                if advertised is not None:
                    remote.withdraw(advertised)
                server.stop()
    return 0
