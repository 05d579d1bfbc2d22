"""Search the stored messages with a filter in the filter language
(``orders.Total > 5000 and orders.Region == "EU"``), newest first, each with its state;
and, while tracking is on, the messages cleanup has deleted since (kept as
``mb_tracked_message``: their context, not their parts).

How it is bounded. A search looks at a **window** of publish times (by default the last
24 hours, by the database's clock) and walks it from its newest message back, in the
order of ``(published_at, id)``, which an index holds on PostgreSQL
(``mb_spool_published``, ``mb_tracked_message_published``; DuckDB keeps no secondary
index and skips the row groups outside the window by their zone maps). One call goes
through at most ``scan`` messages (100,000 by default), a page at a time, the first of
1,000 (:mod:`messagebox.ops.search_walk`), and tests each against the filter in Python
(:mod:`messagebox.predicates.stored`: the filter compiled to a test of the stored
properties, which agrees with the reference evaluator). It stops at ``limit`` matches
(50 by default) or at the scan cap, and says where: a cursor (``next``) to go on from
there with ``after=``, and whether the scan cap stopped it (``capped``: narrow the
window, or go on). So the work of one call depends on ``scan`` and ``limit``, never on
the size of the store (on DuckDB, finding a page's ends reads the window's keys).

Pushed down to SQL: a test every message must pass to match. Where each group of the
filter has an equality (or ``in``, ``prefix``, ``exists``) on a property, the pages
read only the messages whose stored context holds one of those values' text (``LIKE``;
a number also in its other type, ``42`` and ``42.0``), so the Python test sees few
messages. A range (``orders.Total > 5000``), ``!=`` and ``not_exists`` are tested in
Python only.

States (:data:`STATES`): ``queued`` (a queue entry ready, scheduled, held or blocked),
``in hand`` (a queue entry leased to a host instance), ``suspended``, ``done`` (stored,
nothing refers to it any more: cleanup deletes it next) and ``deleted`` (kept by
tracking only). A message with several entries shows the first of suspended, in hand,
queued, and counts each.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from messagebox import clock
from messagebox.errors import ValidationError
from messagebox.ops import search_walk as walk
from messagebox.ops.search_walk import Key
from messagebox.predicates.model import Filter
from messagebox.predicates.stored import compile_stored
from messagebox.properties import (
    Value,
    decode_values,
)
from messagebox.storage import arrays, ids, schema, store_clock

LIMIT = 50
MAX_LIMIT = 1_000
SCAN = 100_000
"""Stored messages one search goes through at most, by default."""
MAX_SCAN = 1_000_000
WINDOW = timedelta(hours=24)
"""The window of a search given no start: the last day."""
MAX_FILTER_CHARS = 20_000
"""A search's filter text is refused past this length, before it is read."""
MAX_AGE = timedelta(days=36_525)

QUEUED, IN_HAND, SUSPENDED, DONE, DELETED = "queued", "in hand", "suspended", "done", "deleted"
STATES = (QUEUED, IN_HAND, SUSPENDED, DONE, DELETED)
"""A found message's states, in the order one is shown when it has several entries."""


@dataclass(frozen=True)
class SearchQuery:
    """What to search: messages published from ``since`` (None: :data:`WINDOW` before
    now) to before ``until`` (None: up to now), older than the cursor ``after`` (a
    result's ``next``), matching ``filter`` (None: every one); at most ``limit`` found,
    at most ``scan`` gone through."""

    filter: Filter | None = None
    since: datetime | timedelta | None = None
    """A time, or an age before the database's now (``timedelta(hours=2)``)."""
    until: datetime | timedelta | None = None
    after: str | None = None
    limit: int = LIMIT
    scan: int = SCAN
    cursor: Key | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.filter is not None and not isinstance(self.filter, Filter):
            raise ValidationError(f"filter must be a Filter, not {type(self.filter).__name__}")
        for name, most in (("limit", MAX_LIMIT), ("scan", MAX_SCAN)):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= most:
                raise ValidationError(f"{name} must be an int from 1 to {most:,}, not {value!r}")
        for name in ("since", "until"):
            at = getattr(self, name)
            if isinstance(at, timedelta) and not timedelta(0) <= at <= MAX_AGE:
                raise ValidationError(
                    f"{name}, as an age, must be from zero to {MAX_AGE.days:,} days, not {at}"
                )
            if at is None or isinstance(at, timedelta):
                continue
            if not isinstance(at, datetime) or at.utcoffset() is None:
                raise ValidationError(
                    f"{name} must be a datetime with a time zone or an age (a timedelta), "
                    f"not {at!r}"
                )
        if self.after is not None:
            object.__setattr__(self, "cursor", Key.parse(self.after))


@dataclass(frozen=True)
class FoundMessage:
    """A message a search found: where it stands, its promoted properties and state."""

    id: uuid.UUID
    published_at: datetime
    publisher: str
    state: str
    """One of :data:`STATES`: suspended, in hand or queued (the first it has), done, or
    deleted."""
    entries: dict[str, int]
    """Its entries by state (``queued``, ``in hand``, ``suspended``); empty when done
    or deleted."""
    promoted: dict[str, Value]
    deleted_at: datetime | None = None
    """When cleanup deleted it (``deleted``: tracking kept its context)."""


@dataclass(frozen=True)
class SearchResult:
    """What a search found, newest first, and where it stopped."""

    found: list[FoundMessage]
    since: datetime
    until: datetime | None
    scanned: int
    """Stored messages gone through (from the newest of the window, or the cursor)."""
    capped: bool
    """The scan cap stopped it before the window's start: ``next`` goes on."""
    next: str | None
    """A cursor (``after=``) to go on from where it stopped; None: the window is done."""
    pushed_down: bool = False
    """Whether a test went to SQL (see the module docstring)."""


_AGE_PART = re.compile(r"(\d{1,9}(?:\.\d{1,6})?)([wdhms])")
_UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}


def when(text: str, name: str = "since") -> datetime | timedelta:
    """A search's ``since`` or ``until`` as text: an age before now (``90s``, ``15m``,
    ``2h``, ``7d``, ``1h30m``) or an ISO 8601 time with a zone
    (``2024-05-01T10:00:00Z``); a :class:`ValidationError` naming ``name`` otherwise."""
    compact = text.strip().lower().replace(" ", "")
    parts = _AGE_PART.findall(compact)
    if parts and "".join(n + u for n, u in parts) == compact:
        try:
            return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
        except OverflowError:
            raise ValidationError(f"{name} {text[:80]!r}: too long an age") from None
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        at = None
    if at is None or at.utcoffset() is None:
        raise ValidationError(
            f"{name} {text[:80]!r}: expected an age (90s, 15m, 2h, 7d, 1h30m) or an ISO 8601 "
            "time with a zone (2024-05-01T10:00:00Z)"
        )
    return at


def query(
    filter: object = None,
    *,
    since: datetime | timedelta | None = None,
    until: datetime | timedelta | None = None,
    after: str | None = None,
    limit: int = LIMIT,
    scan: int = SCAN,
) -> SearchQuery:
    """A :class:`SearchQuery` from a filter given as text (the filter language), as a
    filter or a ``P`` expression, or None; bad input is a :class:`ValidationError`
    (:class:`~messagebox.errors.FilterValidationError` for the filter) naming it."""
    from messagebox.predicates.model import to_filter
    from messagebox.predicates.text import parse_filter

    if isinstance(filter, str):
        if len(filter) > MAX_FILTER_CHARS:
            raise ValidationError(
                f"the filter is {len(filter):,} characters long; a search takes at most "
                f"{MAX_FILTER_CHARS:,}"
            )
        filt: Filter | None = parse_filter(filter) if filter.strip() else None
    elif filter is None or isinstance(filter, Filter):
        filt = filter
    else:
        filt = to_filter(filter)
    return SearchQuery(filt, since, until, after, limit, scan)


# --- states ---


def states(conn: sa.Connection, msgs: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """The entries of each stored message of ``msgs`` by state: ``queued``, ``in hand``
    (leased, the lease not lapsed), ``suspended``; those with none are left out."""
    if not msgs:
        return {}
    q, s = schema.queue, schema.suspended
    leased = q.c.lease_owner.is_not(None) & (q.c.lease_expires > sa.func.now())
    counts: dict[uuid.UUID, dict[str, int]] = {}
    for msg, in_hand, n in conn.execute(
        sa.select(q.c.msg, sa.func.sum(sa.case((leased, 1), else_=0)), sa.func.count())
        .where(arrays.one_of(conn, q.c.msg, list(msgs)))
        .group_by(q.c.msg)
    ):
        entries = counts.setdefault(ids.as_uuid(msg), {})
        if int(n) - int(in_hand):
            entries[QUEUED] = int(n) - int(in_hand)
        if int(in_hand):
            entries[IN_HAND] = int(in_hand)
    for msg, n in conn.execute(
        sa.select(s.c.msg, sa.func.count())
        .where(arrays.one_of(conn, s.c.msg, list(msgs)))
        .group_by(s.c.msg)
    ):
        counts.setdefault(ids.as_uuid(msg), {})[SUSPENDED] = int(n)
    return counts


def _state(entries: dict[str, int], deleted: bool) -> str:
    if deleted:
        return DELETED
    return next((s for s in (SUSPENDED, IN_HAND, QUEUED) if entries.get(s)), DONE)


# --- the search ---


@dataclass(frozen=True)
class _Match:
    key: Key
    promoted: dict[str, Value]
    gone: bool


def _matching(filt: Filter | None, pages: Iterator[list[Any]], limit: int) -> list[_Match]:
    """The rows of ``pages`` whose promoted properties match, up to ``limit`` (the
    pages after are not read)."""
    found: list[_Match] = []
    seen: set[bytes | uuid.UUID | str] = set()
    test = compile_stored(filt) if filt is not None else None
    loads = orjson.loads
    for page in pages:
        for raw_id, at, context, gone in page:
            if raw_id in seen:  # deleted as the search read: in the spool, then in tracking
                continue
            seen.add(raw_id)
            pairs = loads(context)["promoted"]
            if test is not None and not test(pairs):
                continue
            key = Key(clock.utc(clock.fetched(at)), ids.as_uuid(raw_id))
            found.append(_Match(key, decode_values(pairs), bool(gone)))
            if len(found) == limit:
                return found
    return found


def _details(conn: sa.Connection, found: list[_Match]) -> dict[uuid.UUID, tuple[str, Any]]:
    """Each found message's publisher and, when deleted, when."""
    out: dict[uuid.UUID, tuple[str, Any]] = {}
    for t in walk.SOURCES:
        msgs = [m.key.id for m in found if m.gone == (t is schema.tracked_message)]
        if not msgs:
            continue
        deleted = t.c.deleted_at if t is schema.tracked_message else sa.null()
        for msg, publisher, at in conn.execute(
            sa.select(t.c.id, t.c.publisher, deleted).where(arrays.one_of(conn, t.c.id, msgs))
        ):
            out[ids.as_uuid(msg)] = (publisher, None if at is None else clock.utc(at))
    return out


def _resolved(conn: sa.Connection, q: SearchQuery) -> tuple[datetime, datetime | None]:
    """The window's times: ages taken back from the database's now."""

    def at(given: datetime | timedelta) -> datetime:
        try:
            return (
                clock.utc(given) if isinstance(given, datetime) else store_clock.now(conn) - given
            )
        except OverflowError:
            raise ValidationError(
                f"the window reaches outside the years 1 to 9999 ({given})"
            ) from None

    since = at(WINDOW if q.since is None else q.since)
    until = None if q.until is None else at(q.until)
    if until is not None and since >= until:
        raise ValidationError(
            f"the window is empty: since {since.isoformat()} is not before "
            f"until {until.isoformat()}"
        )
    return since, until


def search(conn: sa.Connection, q: SearchQuery) -> SearchResult:
    """Run a search (see the module docstring)."""
    since, until = _resolved(conn, q)
    texts = walk.pushdown(q.filter)
    window = walk.Window(since, until, q.cursor)
    like = walk.like(texts) if texts else None
    scan = walk.Walk(conn, replace(window, like=like), q.scan)
    found = _matching(q.filter, scan.pages(), q.limit)
    stopped = found[-1].key if len(found) == q.limit else None
    if stopped is not None:
        scanned = walk.count(conn, replace(window, down_to=stopped))
        after: Key | None = stopped
    elif scan.edge is not None:
        scanned, after = q.scan, scan.edge
    else:
        scanned, after = walk.count(conn, window), None
    held = states(conn, [m.key.id for m in found if not m.gone])
    details = _details(conn, found)
    return SearchResult(
        found=[
            FoundMessage(
                id=m.key.id,
                published_at=m.key.published_at,
                publisher=details.get(m.key.id, ("?", None))[0],
                state=_state(held.get(m.key.id, {}), m.gone),
                entries=held.get(m.key.id, {}),
                promoted=m.promoted,
                deleted_at=details.get(m.key.id, ("?", None))[1],
            )
            for m in found
        ],
        since=since,
        until=until,
        scanned=scanned,
        capped=stopped is None and scan.edge is not None,
        next=None if after is None else after.text(),
        pushed_down=texts is not None,
    )
