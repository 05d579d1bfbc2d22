"""The ``messagebox`` command.

    messagebox [--url URL] init
    messagebox [--url URL] hosts
    messagebox [--url URL] subscriptions
    messagebox [--url URL] queues
    messagebox [--url URL] would-route '{"orders.Region": "EU"}'

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
        default=os.environ.get("MESSAGEBOX_URL", DEFAULT_URL),
        help="database URL (default: $MESSAGEBOX_URL or %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="create the schema (idempotent)")
    sub.add_parser("hosts", help="list hosts")
    sub.add_parser("subscriptions", help="list subscriptions and their filters")
    sub.add_parser("queues", help="queue depth per host and subscription")
    explain = sub.add_parser("would-route", help="which subscriptions a message would reach")
    explain.add_argument("properties", help='promoted properties as JSON, e.g. {"a.B": 1}')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from messagebox.engine import MessageBox

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
    except MessageBoxError as exc:
        print(f"messagebox: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
