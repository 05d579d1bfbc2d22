"""The commands on scheduled queue entries (docs/concepts.md: Scheduled delivery):
``scheduled list|deliver-now|cancel``."""

from __future__ import annotations

import argparse

from messagebox.cli import inputs, time_args
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal


def scheduled_list(args: argparse.Namespace, out: Terminal) -> None:
    """The entries not due yet that were never delivered, the first due first."""
    with open_box(args) as box:
        found = box.scheduled(
            host=inputs.known_host(box, args.host),
            subscription=time_args.subscription_ref(args.subscription),
            service=args.service,
            limit=args.limit,
        )
    if out.json:
        out.emit(found)
        return
    out.table(
        ["id", "due", "host", "subscription", "message", "expires", "held"],
        [
            [
                e.id,
                e.due_at.isoformat(timespec="seconds"),
                e.host,
                f"{e.name} ({e.subscription})" if e.name else str(e.subscription),
                str(e.message_id),
                "-" if e.expires_at is None else e.expires_at.isoformat(timespec="seconds"),
                "yes" if e.held else "",
            ]
            for e in found
        ],
        empty="no scheduled entries",
    )


def scheduled_act(args: argparse.Namespace, out: Terminal) -> None:
    """Deliver scheduled entries now, or cancel them: the ids given (all or none), or
    every one of ``--host``, ``--subscription`` or ``--service``."""
    given = [args.host, args.subscription, args.service]
    if args.ids and any(f is not None for f in given):
        raise inputs.UsageError("give entry ids, or --host/--subscription/--service, not both")
    if not args.ids and all(f is None for f in given):
        raise inputs.UsageError(
            "name the entries: give their ids, or --host, --subscription or --service"
        )
    with open_box(args) as box:
        run = box.deliver_now if args.action == "deliver-now" else box.cancel_scheduled
        done = run(
            *args.ids,
            host=inputs.known_host(box, args.host),
            subscription=time_args.subscription_ref(args.subscription),
            service=args.service,
        )
        args.audit_count = len(done)
    past = "delivered now" if args.action == "deliver-now" else "cancelled"
    if out.json:
        out.emit({past.replace(" ", "_"): done, "count": len(done)})
        return
    shown = ", ".join(map(str, done[:20])) + (", …" if len(done) > 20 else "")
    out.say(
        f"{past} {len(done)} entr{'ies' if len(done) != 1 else 'y'}"
        + (f": {shown}" if done else "")
    )
