"""``messagebox suspended resubmit ID [--body FILE] [-p NAME=VALUE …] [--app MODULE:APP]``:
publish a suspended receive failure's input again (``MessageBox.resubmit``), through
the receive location that refused it when it is at hand (running in the process that
serves the store, or declared by a host app given with ``--app``), else as it is."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.hosts.app import HostApp
    from messagebox.hosts.ports import ReceiveLocation


def resubmit_parser(
    sus_sub: Any,
    command: Callable[..., argparse.ArgumentParser],
    entry_id: Callable[[str], int],
    property_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The ``suspended resubmit`` command's arguments."""
    resubmit = command(
        sus_sub,
        "resubmit",
        "publish a receive failure's input again (as stored, or edited)",
        description="Publish a suspended receive failure's input again, once its cause is "
        "fixed: its stored bytes, or --body FILE, with its stored properties and -p over "
        "them (not the error report's ErrorReport.*), through the receive location that "
        "refused it when it runs in the process serving the store or is declared by "
        "--app's host app, else as it is. The suspended entry is terminated in the "
        "transaction that publishes it; a pipeline that refuses it again changes nothing.",
    )
    resubmit.add_argument("id", type=entry_id, help="a suspended entry id (a receive failure)")
    resubmit.add_argument("--body", metavar="FILE", help="publish this file's bytes instead")
    property_options(resubmit)
    resubmit.add_argument(
        "--app",
        action="append",
        default=[],
        metavar="MODULE:APP",
        help="a host app declaring the receive location, to run its pipeline (repeatable)",
    )


def _body(args: argparse.Namespace) -> bytes | None:
    if args.body is None:
        return None
    inputs.check_file(args.body)
    with inputs.open_file(args.body) as f:
        return f.read()


def _apps(args: argparse.Namespace) -> list[HostApp]:
    if not args.app:
        return []
    if inputs.SENT.get() is not None:
        raise inputs.UsageError(
            "--app: the process serving the store uses the receive locations it runs"
        )
    from messagebox.errors import ValidationError
    from messagebox.hosts.app import load_app

    try:
        return [load_app(target) for target in args.app]
    except ValidationError as exc:
        raise inputs.UsageError(f"--app: {exc}") from None


def _location(
    box: MessageBox, origin: tuple[str, str] | None, apps: Sequence[HostApp]
) -> ReceiveLocation | None:
    """The receive location ``origin`` names: running here, else declared by ``apps``."""
    if origin is None:
        return None
    from messagebox.hosts.ports import running_location

    port, name = origin
    found = running_location(box, port, name)
    for app in apps:
        for p in app.receive_ports:
            found = found or next(
                (loc for loc in p.locations if p.name == port and loc.name == name), None
            )
    return found


def suspended_resubmit(args: argparse.Namespace, out: Terminal) -> None:
    """Publish a receive failure's input again (its pipeline's, when at hand)."""
    from messagebox.ops import resubmission

    body = _body(args)
    properties = inputs.properties(args)
    apps = _apps(args)
    with open_box(args) as box:
        entry = box.suspended_entry(args.id)
        resubmission.check(entry)
        origin = resubmission.origin(box.message_summary(entry.message_id).promoted)
        location = _location(box, origin, apps)
        routed = box.resubmit(args.id, body=body, properties=properties, location=location)
        args.audit_count = 1
    how = f"through receive location {location.key}" if location else "as it is"
    if origin is not None and location is None:
        out.note(
            f"note: receive location {'/'.join(origin)} is not running here: published "
            "without its pipeline (--app MODULE:APP runs it)"
        )
    if out.json:
        out.emit(
            {
                "entry": args.id,
                "location": location.key if location else None,
                "messages": [
                    {
                        "message_id": str(r.message_id),
                        "outcome": r.outcome,
                        "subscriptions": list(r.subscriptions),
                    }
                    for r in routed
                ],
            }
        )
        return
    out.say(f"suspended entry {args.id} resubmitted {how}:")
    for r in routed:
        out.say(f"  {r.message_id} {r.outcome} ({len(r.subscriptions)} subscription(s))")
