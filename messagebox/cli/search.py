"""The ``search`` command: the stored messages (and, while tracking is on, those cleanup
deleted since) whose promoted properties match a filter, newest first, each with its
state; bounded by a window, a limit and a scan cap, with a cursor to go on
(:mod:`messagebox.ops.search`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from messagebox.cli import inputs
from messagebox.cli.box import open_box
from messagebox.cli.terminal import Terminal

if TYPE_CHECKING:
    from messagebox.ops.search import FoundMessage, SearchResult


def search_parser(sub: Any, command: Any, positive: Any) -> None:
    """``search [FILTER] [--since] [--until] [--limit] [--scan] [--after]``."""
    search = command(
        sub,
        "search",
        "messages whose properties match a filter, newest first, with their state",
        description="The stored messages whose promoted properties match FILTER (the "
        "filter language: 'orders.Total > 5000 and orders.Region == \"EU\"'; @FILE reads "
        "it from a file; none: every message), and while tracking is on those cleanup "
        "has deleted since; newest first, each with its state: queued, in hand, "
        "suspended, done (nothing refers to it; cleanup deletes it next) or deleted. "
        "One search goes through at most --scan messages of its window, newest first, "
        "and finds at most --limit; where it stopped it prints a cursor: --after CURSOR "
        "goes on from there.",
    )
    search.add_argument(
        "filter",
        nargs="?",
        metavar="FILTER",
        help="a filter, e.g. 'orders.Total > 5000 and orders.Region == \"EU\"' (or @FILE)",
    )
    search.add_argument(
        "--since",
        default="24h",
        metavar="AGE|TIME",
        help="published since: an age (90m, 2h, 7d) or an ISO 8601 time with a zone (default 24h)",
    )
    search.add_argument(
        "--until", metavar="AGE|TIME", help="published before: an age or a time (default: now)"
    )
    search.add_argument(
        "--limit", type=positive, default=50, help="find at most this many (default 50, ≤ 1000)"
    )
    search.add_argument(
        "--scan",
        type=positive,
        default=100_000,
        help="go through at most this many messages (default 100,000, ≤ 1,000,000)",
    )
    search.add_argument(
        "--after", metavar="CURSOR", help="go on from where a search stopped (its cursor)"
    )


def search(args: argparse.Namespace, out: Terminal) -> None:
    """Search, and show what was found and where it stopped."""
    from messagebox.errors import ValidationError
    from messagebox.ops.search import when

    try:
        text = None if args.filter is None else inputs.read_arg(args.filter, "FILTER")
        since = when(args.since, "--since")
        until = None if args.until is None else when(args.until, "--until")
        with open_box(args) as box:
            found = box.search(
                text, since=since, until=until, limit=args.limit, scan=args.scan, after=args.after
            )
    except ValidationError as exc:  # the filter, the window, the cursor, the bounds
        raise inputs.UsageError(str(exc)) from exc
    if out.json:
        out.emit(found)
        return
    shown = _shown_names(text, found)
    out.table(
        ["message", "published", "state", "entries", "publisher", "properties"],
        [
            [
                str(m.id),
                m.published_at.isoformat(timespec="milliseconds"),
                m.state,
                ", ".join(f"{n} {s}" for s, n in m.entries.items()) or "-",
                m.publisher,
                _properties(m, shown),
            ]
            for m in found.found
        ],
        empty="no message found",
    )
    out.note(stopped(found, args.limit, args.after is not None))


def _shown_names(text: str | None, found: SearchResult) -> list[str] | None:
    """The properties a filter names (None: no filter)."""
    from messagebox.predicates.text import parse_filter

    if not text or not text.strip():
        return None
    return sorted(parse_filter(text).properties)


def _properties(m: FoundMessage, names: list[str] | None) -> str:
    """Its promoted properties, those the filter names first."""
    from messagebox.predicates.text import format_value

    first = [n for n in names or () if n in m.promoted]
    order = [*first, *(n for n in m.promoted if n not in first)]
    return ", ".join(f"{k}={format_value(m.promoted[k])}" for k in order) or "-"


def stopped(found: SearchResult, limit: int, continued: bool = False) -> str:
    """Where a search stopped, in words, with the cursor to go on (``continued``: it
    went on from a cursor)."""
    from messagebox.ops.search_walk import Key

    window = f"published since {found.since.isoformat(timespec='seconds')}" + (
        f" until {found.until.isoformat(timespec='seconds')}" if found.until else ""
    )
    if found.next is None and continued:
        return f"(searched the {found.scanned:,} remaining messages {window})"
    if found.next is None:
        return f"(searched all {found.scanned:,} messages {window})"
    if not found.capped:
        return (
            f"(the newest {limit} found, going through {found.scanned:,} messages {window}; "
            f"older ones: --after {found.next})"
        )
    back = Key.parse(found.next).published_at.isoformat(timespec="seconds")
    return (
        f"(went through {found.scanned:,} messages {window}, back to {back}, the most one "
        f"search goes through: --after {found.next} goes on, or narrow the window)"
    )
