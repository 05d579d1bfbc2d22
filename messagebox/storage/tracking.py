"""Message tracking (BizTalk's tracking database): what happened to each message, as
events written in the same transaction as what they record.

Every place that publishes, routes, delivers, fails, suspends, resumes or terminates
calls :func:`record`. That one funnel does two things:

- when tracking is enabled for the store (:func:`configure`, kept in ``mb_meta``), it
  writes one ``mb_tracking`` row per event; a rolled-back transaction leaves none;
- always, it counts the events for this process's Prometheus counters
  (:mod:`messagebox.metrics`), applied when the transaction commits.

Events are kept for the retention period; the cleanup job trims older ones
(docs/concepts.md: Spool). Each process reads the setting at most every
:data:`SETTINGS_TTL_SECONDS`, so enabling or
disabling tracking reaches running hosts within that time.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from messagebox.errors import ValidationError
from messagebox.storage import ids, schema, store_clock
from messagebox.storage.dialects import Dialect

PUBLISHED = "published"
ROUTED = "routed"
DELIVERED = "delivered"
FAILED = "failed"
SUSPENDED = "suspended"
RESUMED = "resumed"
TERMINATED = "terminated"
EXPIRED = "expired"
"""Not delivered before its expiry (detail: ``suspended`` or ``dropped``; counted for
metrics by subscription name)."""
EVENTS = (PUBLISHED, ROUTED, DELIVERED, FAILED, SUSPENDED, EXPIRED, RESUMED, TERMINATED)
"""Every event kind, in the order they happen to a message."""

DEFAULT_RETENTION = timedelta(days=7)
SETTINGS_TTL_SECONDS = 5.0
MAX_DETAIL_CHARS = 1000
SETTINGS_KEY = "tracking"

MAX_RETENTION = timedelta(days=36_525)
"""A century: a longer retention is taken for a mistake."""

_STATE = "mb_tracking_state"
"""``conn.info`` key: the transaction's :class:`_TxState` (set by ``Store.transaction``)."""


@dataclass(frozen=True)
class TrackingSettings:
    """Whether tracking is on, and how long its events are kept."""

    enabled: bool = False
    retention: timedelta = DEFAULT_RETENTION

    def __post_init__(self) -> None:
        if type(self.enabled) is not bool:
            raise ValidationError(f"tracking enabled must be a bool, not {self.enabled!r}")
        if not isinstance(self.retention, timedelta) or self.retention <= timedelta(0):
            raise ValidationError(
                f"tracking retention must be a positive timedelta, not {self.retention!r}"
            )
        if self.retention > MAX_RETENTION:
            raise ValidationError(
                f"tracking retention must be at most {MAX_RETENTION.days} days, "
                f"not {self.retention.days}"
            )

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "retention_seconds": self.retention.total_seconds()}


@dataclass(frozen=True)
class TrackedEvent:
    """One thing that happened to a message. ``entry`` is the queue or suspended entry
    it concerns; ``detail``: the publisher (published), the host instance (delivered;
    an orchestration step's names its instance too), the error (failed), the reason
    (suspended), the instance terminated (terminated with it)."""

    at: datetime
    event: str
    message_id: uuid.UUID
    subscription: int | None
    host: str | None
    entry: int | None
    detail: str | None


class SettingsCache:
    """One store's tracking settings, re-read at most every ``ttl`` seconds."""

    def __init__(self, ttl: float = SETTINGS_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._value: TrackingSettings | None = None
        self._expires = 0.0

    def get(self, conn: sa.Connection) -> TrackingSettings:
        with self._lock:
            if self._value is not None and time.monotonic() < self._expires:
                return self._value
        value = read_settings(conn)
        with self._lock:
            self._value, self._expires = value, time.monotonic() + self.ttl
        return value

    def known(self) -> TrackingSettings | None:
        """The settings if read recently enough to use without reading them again."""
        with self._lock:
            return self._value if time.monotonic() < self._expires else None

    def invalidate(self) -> None:
        with self._lock:
            self._value = None


@dataclass
class _TxState:
    cache: SettingsCache
    enabled: bool | None = None
    counts: Counter[tuple[str, str]] | None = None


def begin(conn: sa.Connection, cache: SettingsCache) -> None:
    """Mark the start of a store transaction (``Store.transaction`` calls it)."""
    conn.info[_STATE] = _TxState(cache)


def committed(conn: sa.Connection) -> Counter[tuple[str, str]]:
    """The events the committed transaction recorded, counted by (event, label)."""
    state: _TxState | None = conn.info.pop(_STATE, None)
    return state.counts if state is not None and state.counts else Counter()


def discard(conn: sa.Connection) -> None:
    """Forget a rolled-back transaction's events."""
    conn.info.pop(_STATE, None)


def _enabled(conn: sa.Connection, state: _TxState) -> bool:
    if state.enabled is None:
        state.enabled = state.cache.get(conn).enabled
    return state.enabled


def count(conn: sa.Connection, what: str, labels: Iterable[str]) -> None:
    """Count metrics-only occurrences (e.g. routing failures) for the commit."""
    add(conn, what, Counter(labels))  # counted in C, then once per label


def add(
    conn: sa.Connection, what: str, counts: Mapping[str, int] | Mapping[str | None, int]
) -> None:
    """Add occurrences counted by label (None counts as "") for the commit."""
    state: _TxState | None = conn.info.get(_STATE)
    if state is None:
        return
    if state.counts is None:
        state.counts = Counter()
    total = state.counts
    for label, n in counts.items():
        total[(what, label or "")] += n


def record(
    conn: sa.Connection,
    dialect: Dialect,
    event: str,
    msgs: Sequence[uuid.UUID],
    *,
    subs: Sequence[int | None] | None = None,
    hosts: Sequence[str | None] | None = None,
    entries: Sequence[int | None] | None = None,
    details: Sequence[str | None] | None = None,
    counted: bool | Mapping[str, int] = True,
) -> None:
    """Record ``event`` for each message given (with the matching sub, host, entry and
    detail); unless not ``counted``, count it for metrics by host (or by detail, for
    ``suspended``). ``counted`` may be those counts, where the caller has them."""
    if not msgs:
        return
    state: _TxState | None = conn.info.get(_STATE)
    if state is None:  # a connection outside Store.transaction (tests, tools)
        return
    if isinstance(counted, Mapping):
        add(conn, event, counted)
    elif counted:
        label = details if event == SUSPENDED else hosts
        add(conn, event, {"": len(msgs)} if label is None else Counter(label))
    if not _enabled(conn, state):
        return
    n = len(msgs)
    none: list[Any] = [None] * n
    at = store_clock.now(conn)  # one time for the transaction's events (their order breaks ties)
    dialect.insert(
        conn,
        schema.tracking,
        {
            "tracked_at": [at] * n,
            "event": [event] * n,
            "msg": list(msgs),
            "sub": list(subs) if subs is not None else none,
            "host": list(hosts) if hosts is not None else none,
            "entry": list(entries) if entries is not None else none,
            "detail": none
            if details is None
            else [None if d is None else d[-MAX_DETAIL_CHARS:] for d in details],
        },
    )


def record_rows(
    conn: sa.Connection,
    dialect: Dialect,
    event: str,
    rows: Sequence[Any],
    detail: str | None = None,
    *,
    counted: bool = True,
) -> None:
    """Record ``event`` for queue or suspended rows (each with ``id``, ``msg``, ``sub``
    and ``host``), with one detail for all."""
    record(
        conn,
        dialect,
        event,
        [r.msg for r in rows],
        subs=[r.sub for r in rows],
        hosts=[r.host for r in rows],
        entries=[r.id for r in rows],
        details=None if detail is None else [detail] * len(rows),
        counted=counted,
    )


# --- settings, queries, trimming ---


def read_settings(conn: sa.Connection) -> TrackingSettings:
    m = schema.meta
    found = conn.execute(sa.select(m.c.value).where(m.c.key == SETTINGS_KEY)).scalars().all()
    if not found:  # fetch every row: DuckDB refuses new work while a result is open
        return TrackingSettings()
    raw = found[0]
    data = json.loads(raw)
    return TrackingSettings(
        enabled=bool(data["enabled"]), retention=timedelta(seconds=data["retention_seconds"])
    )


def write_settings(conn: sa.Connection, settings: TrackingSettings) -> None:
    m = schema.meta
    value = json.dumps(settings.to_json())
    done = conn.execute(m.update().where(m.c.key == SETTINGS_KEY).values(value=value)).rowcount
    if not done:
        conn.execute(m.insert().values(key=SETTINGS_KEY, value=value))


@dataclass(frozen=True)
class EventQuery:
    """Which tracked events to return; every given field must match."""

    message_id: uuid.UUID | None = None
    event: str | None = None
    host: str | None = None
    subscription: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 1000

    def __post_init__(self) -> None:
        if self.event is not None and self.event not in EVENTS:
            raise ValidationError(
                f"unknown tracking event {self.event!r}; one of: {', '.join(EVENTS)}"
            )
        if type(self.limit) is not int or self.limit < 1:
            raise ValidationError(f"limit must be a positive int, not {self.limit!r}")


_ORDER = sa.case({e: i for i, e in enumerate(EVENTS)}, value=schema.tracking.c.event)


def query(conn: sa.Connection, q: EventQuery) -> list[TrackedEvent]:
    """Events matching ``q``: a message's whole history oldest first; otherwise the
    newest ``limit`` events, oldest first."""
    t = schema.tracking
    where = []
    if q.message_id is not None:
        where.append(t.c.msg == q.message_id)
    if q.event is not None:
        where.append(t.c.event == q.event)
    if q.host is not None:
        where.append(t.c.host == q.host)
    if q.subscription is not None:
        where.append(t.c.sub == q.subscription)
    if q.since is not None:
        where.append(t.c.tracked_at >= q.since)
    if q.until is not None:
        where.append(t.c.tracked_at < q.until)
    newest = (
        sa.select(t)
        .where(*where)
        .order_by(t.c.tracked_at.desc(), _ORDER.desc(), t.c.entry.desc())
        .limit(q.limit)
    )
    rows = list(conn.execute(newest))
    rows.reverse()
    return [
        TrackedEvent(
            at=r.tracked_at,
            event=r.event,
            message_id=ids.as_uuid(r.msg),
            subscription=r.sub,
            host=r.host,
            entry=r.entry,
            detail=r.detail,
        )
        for r in rows
    ]


def trim(conn: sa.Connection, dialect: Dialect, retention: timedelta) -> int:
    """Delete events older than ``retention`` (by the database clock)."""
    t = schema.tracking
    where = t.c.tracked_at < dialect.now_plus(-retention.total_seconds())
    return int(conn.execute(t.delete().where(where)).rowcount)


def trim_messages(conn: sa.Connection, dialect: Dialect, retention: timedelta) -> int:
    """Delete the contexts of deleted messages (``mb_tracked_message``) published
    before ``retention`` (by the database clock), as their events go."""
    m = schema.tracked_message
    where = m.c.published_at < dialect.now_plus(-retention.total_seconds())
    return int(conn.execute(m.delete().where(where)).rowcount)
