"""Scheduled queue entries in storage (docs/concepts.md: Scheduled delivery): those not
due yet that were never delivered (``deliver_at``, ``delay``), listed, delivered now, or
cancelled. Every function runs inside the caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.errors import UnknownScheduledEntry
from messagebox.storage import schema, store_clock, tracking
from messagebox.storage.dialects import Dialect
from messagebox.storage.spool import release

CANCELLED = "cancelled while scheduled"
"""The detail of a cancelled entry's ``terminated`` tracked event."""


@dataclass(frozen=True)
class ScheduledEntry:
    """A queue entry not due yet that was never delivered."""

    id: int
    message_id: uuid.UUID
    host: str
    subscription: int
    name: str | None
    """The subscription's name (None if it was removed meanwhile)."""
    due_at: datetime
    enqueued_at: datetime
    expires_at: datetime | None
    held: bool
    """Its service is stopped: due, it waits for the service to start."""


@dataclass(frozen=True)
class ScheduledQuery:
    """Which scheduled entries an operation applies to; every given field must match."""

    ids: tuple[int, ...] | None = None
    host: str | None = None
    subscription: int | None = None
    service: str | None = None

    def where(self) -> list[sa.ColumnElement[bool]]:
        q = schema.queue
        clauses = [q.c.attempts == 0, q.c.available_at > sa.func.now()]
        if self.ids is not None:
            clauses.append(q.c.id.in_(list(self.ids)))
        if self.host is not None:
            clauses.append(q.c.host == self.host)
        if self.subscription is not None:
            clauses.append(q.c.sub == self.subscription)
        if self.service is not None:
            sub = schema.subscription
            clauses.append(q.c.sub.in_(sa.select(sub.c.id).where(sub.c.service == self.service)))
        return clauses


def listing(conn: sa.Connection, query: ScheduledQuery, limit: int) -> list[ScheduledEntry]:
    """The scheduled entries, the first due first."""
    q, s = schema.queue, schema.subscription
    rows = conn.execute(
        sa.select(
            q.c.id,
            q.c.msg,
            q.c.host,
            q.c.sub,
            s.c.name,
            q.c.available_at,
            q.c.enqueued_at,
            q.c.expires_at,
            q.c.state,
        )
        .select_from(q.outerjoin(s, s.c.id == q.c.sub))
        .where(*query.where())
        .order_by(q.c.available_at, q.c.id)
        .limit(limit)
    )
    return [
        ScheduledEntry(
            id=int(r.id),
            message_id=r.msg,
            host=r.host,
            subscription=int(r.sub),
            name=r.name,
            due_at=clock.utc(r.available_at),
            enqueued_at=clock.utc(r.enqueued_at),
            expires_at=None if r.expires_at is None else clock.utc(r.expires_at),
            held=r.state == "held",
        )
        for r in rows
    ]


def _check_ids(conn: sa.Connection, query: ScheduledQuery) -> None:
    """Every id of ``query`` names a scheduled entry, else :class:`UnknownScheduledEntry`."""
    if not query.ids:
        return
    q = schema.queue
    found = set(conn.execute(sa.select(q.c.id).where(*query.where())).scalars())
    missing = [i for i in query.ids if i not in found]
    if missing:
        raise UnknownScheduledEntry(
            f"no scheduled entry {missing[0]} (not on a queue, or due already); nothing was changed"
        )


def deliver_now(conn: sa.Connection, dialect: Dialect, query: ScheduledQuery) -> list[int]:
    """Make the scheduled entries due now (all the given ids or none); their hosts'
    idle instances are woken. Returns their ids."""
    _check_ids(conn, query)
    q = schema.queue
    rows = conn.execute(
        q.update()
        .where(*query.where())
        .values(available_at=sa.func.now())
        .returning(q.c.id, q.c.host)
    ).all()
    dialect.notify(conn, sorted({r.host for r in rows}))
    return sorted(int(r.id) for r in rows)


def cancel(conn: sa.Connection, dialect: Dialect, query: ScheduledQuery) -> list[int]:
    """Delete the scheduled entries (all the given ids or none) and release their
    references: cleanup then deletes a message nothing else refers to. Returns their
    ids."""
    _check_ids(conn, query)
    q = schema.queue
    rows: Sequence[Any] = conn.execute(
        q.delete().where(*query.where()).returning(q.c.id, q.c.msg, q.c.sub, q.c.host)
    ).all()
    release(conn, dialect, (r.msg for r in rows))
    tracking.record_rows(conn, dialect, tracking.TERMINATED, rows, CANCELLED)
    return sorted(int(r.id) for r in rows)


def next_available(conn: sa.Connection, host: str) -> float | None:
    """Seconds until the host's next ready entry that is not due yet becomes due (one
    scheduled, or waiting for its retry), by the database clock; None when there is
    none. One index probe on PostgreSQL (``mb_queue_due``, whose predicate this names)."""
    q = schema.queue
    at = conn.execute(
        sa.select(sa.func.min(q.c.available_at)).where(
            q.c.host == host,
            q.c.available_at > q.c.enqueued_at,
            q.c.available_at > sa.func.now(),
            q.c.state == "ready",
        )
    ).scalar()
    if at is None:
        return None
    return max((clock.utc(at) - store_clock.now(conn)).total_seconds(), 0.0)
