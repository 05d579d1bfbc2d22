"""Reads for looking around during an incident: the entries on a host's queue (ready,
held, leased), stored messages with a promoted property of a given value, and the
instances of long-running services with what each waits for."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from messagebox import ids, schema
from messagebox.properties import Value, encode_context

QUEUE_STATES = ("ready", "held", "leased")


@dataclass(frozen=True)
class QueueEntry:
    """An entry on a host's queue, as a peek shows it."""

    id: int
    message_id: uuid.UUID
    subscription: int
    state: str
    """``ready``, ``held`` (its subscription is stopped) or ``leased`` (being delivered)."""
    priority: int
    attempts: int
    enqueued_at: datetime
    available_at: datetime
    lease_owner: str | None
    instance_id: str | None


@dataclass(frozen=True)
class FoundMessage:
    id: uuid.UUID
    published_at: datetime
    publisher: str


@dataclass(frozen=True)
class ServiceInstanceView:
    """An instance of a long-running service and what it waits for."""

    id: str
    service: str
    host: str
    state: str
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    waiting_for: tuple[str, ...]
    """The names of the instance subscriptions that route to it: its own, and, while it
    runs, its service's correlated ones (the messages it waits for)."""
    timers: tuple[tuple[str, datetime], ...]
    """Its pending timeouts: (name, due)."""
    queued: int
    """Entries on its queue, not yet handled."""


def peek_queue(conn: sa.Connection, host: str, state: str | None, limit: int) -> list[QueueEntry]:
    """The first ``limit`` entries of ``host``'s queue in claim order (priority, then
    age), optionally of one state."""
    q = schema.queue
    leased = q.c.lease_owner.is_not(None) & (q.c.lease_expires > sa.func.now())
    shown = sa.case((leased, "leased"), (q.c.state == "held", "held"), else_="ready")
    query = (
        sa.select(
            q.c.id,
            q.c.msg,
            q.c.sub,
            shown.label("shown"),
            q.c.priority,
            q.c.attempts,
            q.c.enqueued_at,
            q.c.available_at,
            q.c.lease_owner,
            q.c.instance_id,
        )
        .where(q.c.host == host)
        .order_by(q.c.priority.desc(), q.c.id)
        .limit(limit)
    )
    if state is not None:
        query = query.where(shown == state)
    return [
        QueueEntry(
            int(r.id),
            ids.as_uuid(r.msg),
            int(r.sub),
            r.shown,
            int(r.priority),
            int(r.attempts),
            r.enqueued_at,
            r.available_at,
            r.lease_owner,
            r.instance_id,
        )
        for r in conn.execute(query)
    ]


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def find_by_property(
    conn: sa.Connection, name: str, value: Value, limit: int
) -> list[FoundMessage]:
    """Stored messages whose promoted ``name`` is ``value`` (of its type), newest first.
    Reads the stored contexts (no index): meant for an operator's search, not a hot path."""
    encoded = encode_context({name: value}, {})  # {"promoted":{"NAME":[tag,value]},...}
    fragment = encoded[len('{"promoted":{') : encoded.index('},"written"')]
    s = schema.spool
    pattern = f"%{_like_escaped(fragment)}%"
    rows = conn.execute(
        sa.select(s.c.id, s.c.published_at, s.c.publisher, s.c.context)
        .where(s.c.context.like(pattern, escape="\\"))
        .order_by(s.c.published_at.desc(), s.c.id.desc())
    )
    wanted = json.loads(encoded)["promoted"][name]
    found: list[FoundMessage] = []
    for r in rows:  # the text also matches a written property of that name: look closer
        if json.loads(r.context)["promoted"].get(name) != wanted:
            continue
        found.append(
            FoundMessage(
                ids.as_uuid(r.id),
                r.published_at,
                r.publisher,
            )
        )
        if len(found) >= limit:
            break
    return found


def service_instances(
    conn: sa.Connection, *, service: str | None, state: str | None, limit: int
) -> list[ServiceInstanceView]:
    """Instances of long-running services, newest first, with their instance
    subscriptions, pending timers and queued entries."""
    si, sub, t, q = schema.service_instance, schema.subscription, schema.timer, schema.queue
    query = sa.select(si).order_by(si.c.created_at.desc(), si.c.id).limit(limit)
    if service is not None:
        query = query.where(si.c.service == service)
    if state is not None:
        query = query.where(si.c.state == state)
    rows = list(conn.execute(query))
    ids = [r.id for r in rows]
    if not ids:
        return []
    waiting: dict[str, list[str]] = {}  # by instance id, or by service (correlated)
    services = sorted({r.service for r in rows})
    for instance_id, service, name in conn.execute(
        sa.select(sub.c.instance_id, sub.c.service, sub.c.name)
        .where(
            sub.c.kind == "instance",
            sa.or_(sub.c.instance_id.in_(ids), sub.c.service.in_(services)),
        )
        .order_by(sub.c.id)
    ):
        waiting.setdefault(instance_id or f"service:{service}", []).append(name)
    timers: dict[str, list[tuple[str, datetime]]] = {}
    for instance_id, name, due in conn.execute(
        sa.select(t.c.instance_id, t.c.name, t.c.due_at)
        .where(t.c.instance_id.in_(ids))
        .order_by(t.c.due_at)
    ):
        timers.setdefault(instance_id, []).append((name, due))
    queued = {
        str(instance_id): int(n)
        for instance_id, n in conn.execute(
            sa.select(q.c.instance_id, sa.func.count())
            .where(q.c.instance_id.in_(ids))
            .group_by(q.c.instance_id)
        )
    }
    return [
        ServiceInstanceView(
            r.id,
            r.service,
            r.host,
            r.state,
            r.created_at,
            r.updated_at,
            r.completed_at,
            tuple(waiting.get(r.id, ()))
            + (() if r.state == "completed" else tuple(waiting.get(f"service:{r.service}", ()))),
            tuple(timers.get(r.id, ())),
            int(queued.get(r.id, 0)),
        )
        for r in rows
    ]
