"""The command line's arguments about time (docs/concepts.md: Scheduled delivery,
Expiry): ``publish --deliver-at/--delay/--expires-at/--ttl``, ``suspended resume
--ttl/--expires-at`` and ``scheduled list|deliver-now|cancel``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import Any

from messagebox.cli import inputs

Command = Callable[..., argparse.ArgumentParser]


def publish_options(publish: argparse.ArgumentParser) -> None:
    """``publish``'s times, for every message it publishes."""
    publish.add_argument(
        "--deliver-at",
        metavar="TIME",
        help="hold the messages' queue entries until this time (ISO 8601 with a zone: "
        "2024-05-01T10:00:00Z); they are routed now",
    )
    publish.add_argument(
        "--delay",
        metavar="AGE",
        help="hold the queue entries this long after the publish (90s, 15m, 2h, 7d; "
        "by the store's clock)",
    )
    publish.add_argument(
        "--expires-at",
        metavar="TIME",
        help="an entry not delivered by this time (ISO 8601 with a zone) expires: "
        "suspended (expired) or dropped, as its subscription says",
    )
    publish.add_argument(
        "--ttl", metavar="AGE", help="expire the entries this long after the publish (2h, 7d)"
    )


def resume_options(resume: argparse.ArgumentParser) -> None:
    """``suspended resume``'s new expiry for the entries it resumes."""
    resume.add_argument(
        "--ttl", metavar="AGE", help="the resumed entries expire this long after the resume"
    )
    resume.add_argument(
        "--expires-at", metavar="TIME", help="the resumed entries expire at this time (ISO 8601)"
    )


def scheduled_parser(sub: Any, command: Command, positive: Callable[[str], int]) -> None:
    """``scheduled list|deliver-now|cancel``."""
    scheduled = command(
        sub, "scheduled", "list, deliver now or cancel queue entries that are not due yet"
    )
    sched_sub = scheduled.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = command(sched_sub, "list", "scheduled entries, the first due first")
    _filters(listing)
    listing.add_argument(
        "--limit", type=positive, default=1000, help="at most this many (default 1000)"
    )
    for action, text in (
        ("deliver-now", "make scheduled entries due now"),
        ("cancel", "delete scheduled entries and release their messages"),
    ):
        act = command(
            sched_sub,
            action,
            text,
            description=f"{text[0].upper()}{text[1:]}: the ids given (all or none), or "
            "every scheduled entry of --host, --subscription or --service.",
        )
        act.add_argument("ids", nargs="*", type=_entry_id, metavar="ID", help="queue entry ids")
        _filters(act)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="only this host's")
    parser.add_argument("--subscription", metavar="REF", help="a subscription id or name")
    parser.add_argument("--service", help="only this service's")


def _entry_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a queue entry id (an integer)") from None


def instant(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time with a zone (``Z`` or an offset), or None; a usage error for
    text that is not one, or names no zone."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise inputs.UsageError(
            f"{option} {text!r}: expected an ISO 8601 time such as 2024-05-01T10:00:00Z"
        ) from None
    if at.tzinfo is None:
        raise inputs.UsageError(
            f"{option} {text!r} has no zone: add Z (UTC) or an offset such as +02:00"
        )
    return at


def seconds(text: str | None, option: str) -> float | None:
    """An age (:func:`inputs.duration`) in seconds, or None."""
    return None if text is None else inputs.duration(text, option).total_seconds()


def subscription_ref(text: str | None) -> int | str | None:
    return None if text is None else inputs.ref(text)
