"""The ``messagebox`` command.

    messagebox [--url URL] init
    messagebox [--url URL] hosts
    messagebox [--url URL] subscriptions
    messagebox [--url URL] queues
    messagebox [--url URL] would-route '{"orders.Region": "EU"}'
    messagebox [--url URL] instances
    messagebox [--url URL] cleanup
    messagebox [--url URL] host run module:app [--threads N] [--duration S]
    messagebox spark route --input PATH --subscriptions URL|FILE --output DIR
    messagebox [--url URL] spark what-if --proposed FILE|URL [--output DIR]

The database URL comes from ``--url``, else ``MESSAGEBOX_URL``, else
``duckdb:///messagebox.duckdb``. Exit codes: 0 success, 1 a messagebox error (the
message says which), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from messagebox.errors import MessageBoxError
from messagebox.store import DEFAULT_URL


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="messagebox",
        description="Content-based publish/subscribe routing (BizTalk MessageBox style).",
        epilog="Environment: MESSAGEBOX_URL (database URL, when --url is not given).",
    )
    parser.add_argument(
        "--url",
        help=f"database URL (default: $MESSAGEBOX_URL, else the host app's, else {DEFAULT_URL})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="create the schema (idempotent)")
    sub.add_parser("hosts", help="list hosts")
    sub.add_parser("subscriptions", help="list subscriptions and their filters")
    sub.add_parser("queues", help="queue depth per host and subscription")
    explain = sub.add_parser("would-route", help="which subscriptions a message would reach")
    explain.add_argument("properties", help='promoted properties as JSON, e.g. {"a.B": 1}')
    sub.add_parser("instances", help="running host instances and their heartbeats")
    cleanup = sub.add_parser(
        "cleanup",
        help="delete unreferenced messages, release dead instances' leases",
    )
    cleanup.add_argument("--batch", type=int, default=10_000, help="messages per transaction")
    host = sub.add_parser("host", help="run host instances")
    host_sub = host.add_subparsers(dest="host_command", required=True)
    run = host_sub.add_parser("run", help="run an instance of a HostApp until SIGINT/SIGTERM")
    run.add_argument("app", help="module:attribute of a hosts.HostApp (attribute: app)")
    run.add_argument("--threads", type=int, help="dequeue threads (default: host setting)")
    run.add_argument("--duration", type=float, help="stop after this many seconds")
    run.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    _spark_parser(sub)
    return parser


def _spark_parser(sub: Any) -> None:
    spark = sub.add_parser("spark", help="batch routing on Spark (needs the 'spark' extra)")
    spark_sub = spark.add_subparsers(dest="spark_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    common.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.memory=8g (repeatable)",
    )
    route = spark_sub.add_parser(
        "route",
        parents=[common],
        help="route a file of messages; write (key, subscription) pairs per subscription",
        description="Route messages (Parquet, CSV or JSON; wide: a key column and one "
        "column per property; long: key, property, value columns) against the "
        "subscriptions of a MessageBox, and write the matching pairs partitioned by "
        "subscription.",
    )
    route.add_argument("--input", required=True, help="a file or folder of messages")
    route.add_argument(
        "--subscriptions",
        help="a MessageBox URL (default: --url, $MESSAGEBOX_URL) or a JSON file of "
        "[{name, service, host, filter}]",
    )
    route.add_argument("--output", required=True, help="the output folder (replaced)")
    route.add_argument(
        "--format",
        default="auto",
        choices=["auto", "parquet", "csv", "json"],
        help="input format (default: from the file names)",
    )
    route.add_argument("--output-format", default="parquet", choices=["parquet", "csv", "json"])
    route.add_argument("--key", default="key", help="the message key column (default key)")
    route.add_argument("--layout", default="auto", choices=["auto", "wide", "long"])
    route.add_argument("--schema", help="the input schema as DDL (default: inferred)")
    route.add_argument(
        "--no-validate", action="store_true", help="skip the duplicate-key check (one pass)"
    )
    whatif = spark_sub.add_parser(
        "what-if",
        parents=[common],
        help="which stored messages would change destination under proposed subscriptions",
    )
    whatif.add_argument(
        "--proposed",
        required=True,
        help="a JSON file of [{name, service, host, filter}] or a MessageBox URL",
    )
    whatif.add_argument(
        "--replace-all",
        action="store_true",
        help="the proposal is the whole new set (default: it replaces the services it names)",
    )
    whatif.add_argument("--output", help="also write the changed messages here (Parquet)")
    whatif.add_argument("--show", type=int, default=20, help="changed messages to print")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from messagebox.engine import MessageBox

    if args.command == "host":
        return _host_run(args)
    args.explicit_url = args.url or os.environ.get("MESSAGEBOX_URL")
    args.url = args.explicit_url or DEFAULT_URL
    if args.command == "spark":
        from pipelines.spark_cli import run

        return run(args)
    try:
        with MessageBox(args.url) as box:
            if args.command == "init":
                print(f"schema ready at {box.url.render_as_string(hide_password=True)}")
            elif args.command == "hosts":
                for h in box.hosts():
                    print(f"{h.name}\t{h.settings.model_dump_json()}")
            elif args.command == "subscriptions":
                for s in box.subscriptions():
                    print(f"{s.id}\t{s.name}\t{s.service}\t{s.host}\t{s.state.value}\t{s.filter}")
            elif args.command == "queues":
                for d in box.queue_depth():
                    print(f"{d.host}\t{d.subscription}\t{d.state}\t{d.depth}")
            elif args.command == "would-route":
                try:
                    props = json.loads(args.properties)
                except json.JSONDecodeError as exc:
                    print(f"messagebox: properties are not JSON: {exc}", file=sys.stderr)
                    return 2
                if not isinstance(props, dict):
                    print("messagebox: properties must be a JSON object", file=sys.stderr)
                    return 2
                for s in box.would_route(props):
                    print(f"{s.id}\t{s.name}\t{s.host}")
            elif args.command == "instances":
                for i in box.instances():
                    print(f"{i.id}\t{i.host}\t{i.state}\t{i.heartbeat_at.isoformat()}")
            elif args.command == "cleanup":
                report = box.cleanup(
                    batch=args.batch, progress=lambda text: print(text, file=sys.stderr)
                )
                print(
                    f"deleted {report.messages} messages and {report.parts} parts; "
                    f"released {report.released_leases} leases of {report.dead_instances} "
                    f"dead instances; purged {report.purged_subscriptions} instance "
                    f"subscriptions in {report.seconds:.2f} s"
                    + (" (skipped: another cleanup is running)" if report.skipped else "")
                )
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    return 0


def _host_run(args: argparse.Namespace) -> int:
    import logging

    from hosts.app import load_app

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings = {} if args.threads is None else {"dequeue_threads": args.threads}
    try:
        app = load_app(args.app)
        url = args.url or os.environ.get("MESSAGEBOX_URL") or app.url or DEFAULT_URL
        instance = app.instance(url, **settings)
        print(f"host instance {instance.id} running; Ctrl-C stops it", file=sys.stderr)
        instance.run(duration=args.duration)
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
