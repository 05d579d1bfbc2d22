"""The arguments of the ``orchestrations`` commands (:mod:`messagebox.cli.orchestrations`)."""

from __future__ import annotations

from typing import Any

INSTANCE_STATES = ("running", "suspended", "completed", "terminated", "pending")


def orchestrations_parser(sub: Any, command: Any, positive: Any) -> None:
    """``orchestrations list|find|show|terminate``: orchestration instances."""
    orchestrations = command(
        sub,
        "orchestrations",
        "orchestration instances: list, find by correlation value, show, terminate",
    )
    orch_sub = orchestrations.add_subparsers(dest="action", metavar="ACTION")
    listing = command(orch_sub, "list", "orchestration instances, newest first")
    find = command(
        orch_sub,
        "find",
        "the instances with correlation values, e.g. orders.OrderId=A123",
        description="The orchestration instances whose correlation values include the "
        "ones given (NAME=VALUE, or NAME:TYPE=VALUE as for publish), newest first. A "
        "value without a type that reads as a number (123) also finds the text '123'.",
    )
    find.add_argument("values", nargs="+", metavar="NAME[:TYPE]=VALUE", help="a correlation value")
    for p in (listing, find):
        p.add_argument("--service", help="only this orchestration's (its service name)")
        p.add_argument("--state", choices=INSTANCE_STATES, help="only instances in this state")
        p.add_argument("--limit", type=positive, default=200, help="at most (default 200)")
    show = command(
        orch_sub,
        "show",
        "one instance: correlation values, saved state, its messages in order with their "
        "outcomes, what it published, timers",
    )
    show.add_argument("id", metavar="ID", help="the instance id")
    terminate = command(
        orch_sub,
        "terminate",
        "end an instance: its queued and suspended messages are terminated",
        description="End an orchestration instance for good, as terminated: its queued "
        "messages and suspended entries are terminated (deleted, their messages "
        "released), its timers, convoy and instance subscriptions removed; a step of it "
        "in flight commits nothing. At a terminal it asks to confirm.",
    )
    terminate.add_argument("id", metavar="ID", help="the instance id")
    terminate.add_argument(
        "--yes", action="store_true", help="at a terminal: do not ask to confirm"
    )
