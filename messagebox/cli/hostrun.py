"""``messagebox host run APP [APP ...]``: host instances of one or more apps in this
process, until SIGINT/SIGTERM (or ``--duration``, or ``--until-idle``: once there is
nothing left to do).

The process serves the console and the management API (:mod:`messagebox.cli.remote`)
at ``--console [ADDR:]PORT``; on a DuckDB store it always does (on ``127.0.0.1`` at a
free port unless told otherwise, ``--console off`` to not), and writes the endpoint file
beside the database, so that every command of the command line works on the store
while the hosts run. The console's actions need the console token
(``MESSAGEBOX_CONSOLE_TOKEN`` or ``--token-file``); the API needs the token written in
the endpoint file (the console token when there is one, else a new one per run). The
console's settings ``MESSAGEBOX_CONSOLE_TRUSTED_PROXIES``, ``MESSAGEBOX_SERVE_PATHS`` and
the session times apply (:mod:`messagebox.console.cli`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from messagebox.defaults import DEFAULT_URL
from messagebox.errors import HostExhausted, MessageBoxError

if TYPE_CHECKING:
    from messagebox.hosts.instance import HostInstance

log = logging.getLogger("messagebox.hosts")


def console_address(text: str) -> tuple[str, int] | None:
    """``PORT``, ``ADDR:PORT`` or ``[V6]:PORT`` (``off``: None); ValueError when malformed."""
    if text == "off":
        return None
    addr, sep, port = text.rpartition(":")
    if not sep:
        addr, port = "127.0.0.1", text
    addr = addr.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not PORT, ADDR:PORT or off")
    return addr, int(port)


def run(args: argparse.Namespace) -> int:
    """Run the instances; the exit code."""
    from messagebox import logs
    from messagebox.cli.box import url_problem
    from messagebox.cli.remote import duckdb_file
    from messagebox.hosts.app import load_app

    try:
        logs.configure(args.log_level, args.log_format)
        console = None if args.console is None else console_address(args.console)
    except ValueError as exc:
        print(f"messagebox host run: error: {exc}", file=sys.stderr)
        return 2
    settings = {} if args.threads is None else {"dequeue_threads": args.threads}
    try:
        apps = [load_app(target) for target in args.app]
        hosts = [a.host for a in apps]
        if len(set(hosts)) != len(hosts):
            raise MessageBoxError(f"host run: two apps of one host ({', '.join(hosts)})")
        url = args.url or os.environ.get("MESSAGEBOX_URL") or _app_url(apps) or DEFAULT_URL
        problem = url_problem(str(url))
        if problem is not None:
            print(f"messagebox host run: error: {problem}", file=sys.stderr)
            return 2
        database = duckdb_file(str(url))
        if args.console is None and database is not None:
            console = ("127.0.0.1", 0)
        with ExitStack() as stack:
            instances: list[HostInstance] = []
            for app in apps:
                instance = app.instance(url, **settings)
                stack.callback(instance.box.close)  # until started: stop() closes it then
                instances.append(instance)
            if args.metrics_port is not None:
                _serve_metrics(args, instances[0])
            advertise = None
            if console is not None:
                advertise = _serve_console(stack, args, str(url), console, instances)
            _announce(args, instances)
            _run(instances, args.duration, started=advertise, until_idle=args.until_idle)
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    return 0


def _app_url(apps: list[Any]) -> str | None:
    urls = {a.url for a in apps if a.url}
    if len(urls) > 1:
        raise MessageBoxError(
            f"host run: the apps name different stores ({', '.join(sorted(urls))}); "
            "give one with --url"
        )
    return next(iter(urls), None)


def _serve_metrics(args: argparse.Namespace, instance: HostInstance) -> None:
    from prometheus_client import start_http_server

    from messagebox.engine import MessageBox
    from messagebox.metrics import registry

    box = instance.box
    if not isinstance(box, MessageBox):  # the CLI opens a MessageBox: never met
        raise MessageBoxError("host run: metrics need a MessageBox")
    try:
        start_http_server(args.metrics_port, addr=args.metrics_bind, registry=registry(box))
    except OSError as exc:
        raise MessageBoxError(
            f"cannot serve metrics on {args.metrics_bind}:{args.metrics_port}: {exc}"
        ) from exc
    log.info(
        "metrics at http://%s:%d/metrics",
        args.metrics_bind,
        args.metrics_port,
        extra={"event": "metrics-serving", "address": args.metrics_bind, "port": args.metrics_port},
    )


def _serve_console(
    stack: ExitStack,
    args: argparse.Namespace,
    url: str,
    address: tuple[str, int],
    instances: list[HostInstance],
) -> Callable[[], None]:
    """Serve the console and the management API; returns what advertises them (on
    DuckDB, the endpoint file), to call once the instances have started: a command
    sent as soon as the file appears then finds them registered."""
    from messagebox.cli import remote
    from messagebox.console import create_app
    from messagebox.console.background import BackgroundServer
    from messagebox.console.cli import (
        UsageProblem,
        check_hosts,
        secrets_of,
        serving_settings,
        session_settings,
    )
    from messagebox.engine import MessageBox

    bind, port = address
    try:
        secret, read = secrets_of(args)
        check_hosts(bind, [])
        proxies, folders = serving_settings()
        sessions = session_settings()
    except UsageProblem as exc:
        raise MessageBoxError(f"host run --console: {exc}") from exc
    api_token = secret or remote.new_token()
    box = stack.enter_context(MessageBox(url))

    def describe() -> dict[str, Any]:
        return {
            "instances": [
                {"id": i.id, "host": i.host, "counts": i.stats.snapshot()} for i in instances
            ]
        }

    server = BackgroundServer(
        create_app(
            box,
            token=secret,
            bind=bind,
            api_token=api_token,
            describe=describe,
            read_token=read,
            trusted_proxies=proxies,
            serve_paths=folders,
            sessions=sessions,
        ),
        bind,
        port,
    )
    served = server.start()
    stack.callback(server.stop)

    def advertise() -> None:
        database = remote.duckdb_file(url)
        where = ""
        if database is not None:
            path = remote.advertise(database, served, api_token)
            stack.callback(remote.withdraw, path)
            where = f"; commands on {database} are sent here ({path})"
        log.info(
            "console and management API at %s/%s",
            served,
            where,
            extra={"event": "console-serving", "url": served, "endpoint_file": where or None},
        )

    return advertise


def _announce(args: argparse.Namespace, instances: list[HostInstance]) -> None:
    for instance in instances:
        running = f"host instance {instance.id} running; Ctrl-C stops it"
        if args.log_format == "json":  # every line of a JSON log is JSON
            log.info(
                running,
                extra={
                    "event": "host-running",
                    "host_instance": instance.id,
                    "host": instance.host,
                },
            )
        else:
            print(running, file=sys.stderr)


def _run(
    instances: list[HostInstance],
    duration: float | None,
    *,
    started: Callable[[], None] | None = None,
    until_idle: float | None = None,
) -> None:
    """Start every instance, call ``started``, wait for a signal, ``duration``, or
    every instance idle for ``until_idle`` seconds; stop them all."""
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda _s, _f: stop.set())
    running: list[HostInstance] = []
    try:
        for instance in instances:
            instance.start()
            running.append(instance)
        if started is not None:
            started()
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.wait(0.05 if until_idle is not None else 0.2):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if any(i.exhausted is not None for i in running):
                break  # every instance stops: the process ends, to be restarted
            if until_idle is not None and all(i.idle_seconds() >= until_idle for i in running):
                log.info(
                    "every instance idle for %gs: stopping",
                    until_idle,
                    extra={"event": "idle-stop", "seconds": until_idle},
                )
                break
    finally:
        stoppers = [threading.Thread(target=i.stop, name=f"stop-{i.host}") for i in running]
        for t in stoppers:  # in parallel: each within its own timeout
            t.start()
        for t in stoppers:
            t.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    exhausted = [i.exhausted for i in running if i.exhausted is not None]
    if exhausted:
        raise HostExhausted("; ".join(exhausted))
