"""Orchestration instances as an operator sees them (docs/operations.md: Orchestration
instances): listed, found by correlation value, and terminated. Every function runs
inside the caller's transaction. (One instance's messages and history:
:mod:`messagebox.ops.instance_history`.)

An instance is its ``mb_service_instance`` row from its first committed step on. Before
that it is *pending*: routing made its convoy, and its first message waits on the queue
(or was suspended, holding the rest); it is listed with the state ``pending``.

Terminating an instance ends it as ``terminated``: its queued messages and its
suspended entries are terminated (deleted, their messages released), as BizTalk's
terminate of an orchestration instance terminates the messages it references; its
timers, convoy and instance subscriptions go as on completion. A step of it in flight
then commits nothing (its queue entry is gone).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from messagebox.delivery import service_instances
from messagebox.errors import UnknownInstance, ValidationError
from messagebox.models import ENDED, InstanceState
from messagebox.properties import (
    Value,
    decode_context,
    decode_values,
    encode_value,
    values_equal,
)
from messagebox.storage import arrays, schema, spool, store_clock, tracking
from messagebox.storage.dialects import Dialect

PENDING = "pending"
"""The listed state of an instance whose first step has not committed."""
STATES = (*(s.value for s in InstanceState), PENDING)


def terminated_detail(instance_id: str) -> str:
    """The detail of the ``terminated`` events of a terminated instance's messages."""
    return f"its service instance {instance_id} was terminated"


@dataclass(frozen=True)
class ServiceInstanceView:
    """An instance of a long-running service and what it waits for."""

    id: str
    service: str
    host: str
    state: str
    """``running``, ``suspended``, ``completed``, ``terminated``, or ``pending`` (its
    first step has not committed: no saved state yet)."""
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
    correlation: dict[str, Value] = field(default_factory=dict)
    """Its correlation values (BizTalk's correlation set), by property name."""
    suspended: int = 0
    """Its suspended entries (a failed step, zombies)."""


@dataclass(frozen=True)
class Terminated:
    """What terminating an instance did."""

    id: str
    service: str
    entries: tuple[int, ...]
    """Its queued entries, terminated."""
    suspended: tuple[int, ...]
    """Its suspended entries, terminated."""
    timers: int
    """Timers cancelled."""


@dataclass(frozen=True)
class _Row:
    """An instance as read: its stored row, or a pending one's convoy."""

    id: str
    service: str
    host: str
    state: str
    correlation: dict[str, Value]
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    version: int | None
    data: str | None


def _stored(r: Any) -> _Row:
    return _Row(
        r.id,
        r.service,
        r.host,
        r.state,
        decode_values(orjson.loads(r.correlation)),
        r.created_at,
        r.updated_at,
        r.completed_at,
        int(r.version),
        r.data,
    )


# --- listing and finding ---


def list_instances(
    conn: sa.Connection,
    *,
    service: str | None = None,
    state: str | None = None,
    correlation: Mapping[str, Value] | None = None,
    limit: int = 200,
) -> list[ServiceInstanceView]:
    """Instances, newest first, optionally of one service and state, and only those
    whose correlation values include ``correlation``'s."""
    if state is not None and state not in STATES:
        raise ValidationError(f"unknown instance state {state!r}; one of: {', '.join(STATES)}")
    # the pending first: where each statement sees what has committed by then
    # (PostgreSQL), an instance whose first step commits in between is read twice, and
    # its stored row wins, rather than not at all
    found: dict[str, _Row] = {}
    if state in (None, PENDING):
        found.update((r.id, r) for r in _pending_rows(conn, service, correlation or {}, limit))
    if state != PENDING:
        found.update(
            (r.id, r) for r in _stored_rows(conn, service, state, correlation or {}, limit)
        )
    rows = sorted(found.values(), key=lambda r: (r.created_at, r.id), reverse=True)
    return views(conn, rows[:limit])


def _containing(text: str) -> str:
    """A LIKE pattern (escape ``\\``) for what holds ``text``."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _fragment(name: str, value: Value) -> str:
    """A LIKE pattern for a stored correlation holding ``name``: a text value, or (any
    other) the name: those are checked in Python (``42`` is ``42.0``)."""
    if isinstance(value, str):
        return _containing(orjson.dumps({name: ["s", value]}).decode()[1:-1])
    return _containing(orjson.dumps(name).decode())


def _matches(found: Mapping[str, Value], wanted: Mapping[str, Value]) -> bool:
    """Whether ``found`` holds each of ``wanted``'s values (``42`` and ``42.0`` alike)."""
    return all(n in found and values_equal(found[n], v) for n, v in wanted.items())


def _stored_rows(
    conn: sa.Connection,
    service: str | None,
    state: str | None,
    correlation: Mapping[str, Value],
    limit: int,
) -> list[_Row]:
    si = schema.service_instance
    query = sa.select(si).order_by(si.c.created_at.desc(), si.c.id)
    if service is not None:
        query = query.where(si.c.service == service)
    if state is not None:
        query = query.where(si.c.state == state)
    for name, value in correlation.items():  # narrowed in SQL, checked here
        query = query.where(si.c.correlation.like(_fragment(name, value), escape="\\"))
    if not correlation:
        return [_stored(r) for r in conn.execute(query.limit(limit))]
    found = []
    for r in conn.execute(query):
        row = _stored(r)
        if _matches(row.correlation, correlation):
            found.append(row)
            if len(found) >= limit:
                break
    return found


def _pending_rows(
    conn: sa.Connection, service: str | None, correlation: Mapping[str, Value], limit: int
) -> list[_Row]:
    """Instances routing made (a convoy) whose first step has not committed."""
    c, si = schema.convoy, schema.service_instance
    query = (
        sa.select(c.c.instance_id, c.c.service, c.c.created_at)
        .where(~sa.exists().where(si.c.id == c.c.instance_id))
        .order_by(c.c.created_at.desc(), c.c.instance_id)
    )
    if service is not None:
        query = query.where(c.c.service == service)
    for value in correlation.values():
        if isinstance(value, str):  # the key holds ["s", value]
            text = json.dumps(["s", value], separators=(",", ":"), ensure_ascii=False)
            query = query.where(c.c.key.like(_containing(text), escape="\\"))
    if not correlation:
        query = query.limit(limit)
    rows = conn.execute(query).all()
    if not rows:
        return []
    first = _first_messages(conn, [r.instance_id for r in rows])
    services = _services(conn, sorted({r.service for r in rows}))
    found = []
    for r in rows:
        row = _pending(r.instance_id, r.service, r.created_at, services, first)
        if correlation and not _matches(row.correlation, correlation):
            continue
        found.append(row)
        if len(found) >= limit:
            break
    return found


def _pending(
    instance_id: str,
    service: str,
    created_at: datetime,
    services: Mapping[str, tuple[str, list[str]]],
    first: Mapping[str, tuple[str, dict[str, Value]]],
) -> _Row:
    """A pending instance: its correlation values are its first message's, as its
    first step would store them."""
    host, names = services.get(service, ("", []))
    props = first.get(instance_id, ("", {}))[1]
    values = {n: props[n] for n in names if n in props}
    return _Row(
        instance_id, service, host, PENDING, values, created_at, created_at, None, None, None
    )


def _first_messages(
    conn: sa.Connection, instance_ids: Sequence[str]
) -> dict[str, tuple[str, dict[str, Value]]]:
    """Each pending instance's first message (its oldest queued or suspended entry's):
    its host and promoted properties."""
    q, s, sp = schema.queue, schema.suspended, schema.spool
    entries = sa.union_all(
        sa.select(q.c.id, q.c.msg, q.c.host, q.c.instance_id).where(
            arrays.one_of(conn, q.c.instance_id, instance_ids)
        ),
        sa.select(s.c.id, s.c.msg, s.c.host, s.c.instance_id).where(
            arrays.one_of(conn, s.c.instance_id, instance_ids)
        ),
    ).subquery()
    rows = conn.execute(
        sa.select(entries.c.instance_id, entries.c.host, sp.c.context)
        .join(sp, sp.c.id == entries.c.msg)
        .order_by(entries.c.instance_id, entries.c.id.desc())
    ).all()
    first: dict[str, tuple[str, dict[str, Value]]] = {}
    for r in rows:  # the oldest entry last: it stays
        first[r.instance_id] = (r.host or "", decode_context(r.context)[0])
    return first


def _services(conn: sa.Connection, services: Sequence[str]) -> dict[str, tuple[str, list[str]]]:
    """Each service's host and correlation property names (its correlated
    subscriptions': an orchestration's are all on one host)."""
    sub = schema.subscription
    found: dict[str, tuple[str, list[str]]] = {}
    for service, host, text in conn.execute(
        sa.select(sub.c.service, sub.c.host, sub.c.correlation)
        .where(sub.c.service.in_(list(services)), sub.c.correlation.is_not(None))
        .order_by(sub.c.id)
    ):
        names = found.setdefault(service, (host, []))[1]
        names += [n for n in json.loads(text) if n not in names]
    return found


def views(conn: sa.Connection, rows: Sequence[_Row]) -> list[ServiceInstanceView]:
    """The rows with what each waits for: instance subscriptions, timers, entries."""
    sub, t, q, s = schema.subscription, schema.timer, schema.queue, schema.suspended
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
    queued, suspended = (
        {
            str(i): int(n)
            for i, n in conn.execute(
                sa.select(table.c.instance_id, sa.func.count())
                .where(table.c.instance_id.in_(ids))
                .group_by(table.c.instance_id)
            )
        }
        for table in (q, s)
    )
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
            + (() if r.state in ENDED else tuple(waiting.get(f"service:{r.service}", ()))),
            tuple(timers.get(r.id, ())),
            queued.get(r.id, 0),
            r.correlation,
            suspended.get(r.id, 0),
        )
        for r in rows
    ]


def read(conn: sa.Connection, instance_id: str) -> _Row:
    """One instance, stored or pending; :class:`UnknownInstance` when nothing names it."""
    si = schema.service_instance
    row = conn.execute(sa.select(si).where(si.c.id == instance_id)).first()
    if row is not None:
        return _stored(row)
    c = schema.convoy
    convoy = conn.execute(
        sa.select(c.c.service, c.c.created_at).where(c.c.instance_id == instance_id)
    ).first()
    if convoy is None:
        raise UnknownInstance(f"no service instance {instance_id}")
    first = _first_messages(conn, [instance_id])
    services = _services(conn, [convoy.service])
    return _pending(instance_id, convoy.service, convoy.created_at, services, first)


# --- terminating ---


def terminate(conn: sa.Connection, dialect: Dialect, instance_id: str) -> Terminated:
    """End an instance as terminated (see the module's docstring), in the caller's
    serial transaction. :class:`UnknownInstance` when nothing names it; an instance that
    has ended already is refused (:class:`ValidationError`), changing nothing.

    In the order a step takes its rows (its queue entry, then the instance): a step in
    flight either commits first, or finds its entry gone and commits nothing."""
    q, s, si = schema.queue, schema.suspended, schema.service_instance
    before = _open(read(conn, instance_id))  # a read: no lock taken out of order
    queued = conn.execute(
        q.delete().where(q.c.instance_id == instance_id).returning(*schema.queue_columns())
    ).all()
    now = store_clock.now(conn)
    ended = conn.execute(
        si.update()
        .where(si.c.id == instance_id, si.c.state.not_in(sorted(ENDED)))
        .values(state=InstanceState.TERMINATED.value, updated_at=now, completed_at=now)
        .returning(si.c.service)
    ).first()
    if ended is None:  # pending, unless its step committed meanwhile (and it ended)
        _open(read(conn, instance_id))
        _store_terminated(conn, before, now)  # its first message is gone by now
    service = before.service
    suspended = conn.execute(
        s.delete()
        .where(s.c.instance_id == instance_id)
        .returning(s.c.id, s.c.msg, s.c.sub, s.c.host)
    ).all()
    t = schema.timer
    timers = conn.execute(
        sa.select(sa.func.count()).select_from(t).where(t.c.instance_id == instance_id)
    ).scalar_one()
    gone = [*queued, *suspended]
    spool.release(conn, dialect, [r.msg for r in gone])
    detail = terminated_detail(instance_id)
    tracking.record_rows(conn, dialect, tracking.TERMINATED, gone, detail)
    service_instances.complete(conn, dialect, {instance_id: service}, now)  # timers, convoy…
    return Terminated(
        instance_id,
        service,
        tuple(sorted(r.id for r in queued)),
        tuple(sorted(r.id for r in suspended)),
        int(timers),
    )


def _open(row: _Row) -> _Row:
    """``row``, unless it has ended (:class:`ValidationError`: nothing is terminated)."""
    if row.state in ENDED:
        raise ValidationError(
            f"service instance {row.id} has {row.state} already ({row.completed_at}); "
            "nothing was terminated"
        )
    return row


def _store_terminated(conn: sa.Connection, row: _Row, now: datetime) -> None:
    """Store a pending instance as terminated: its first step never committed, so it
    has no saved state (``data`` is an empty object)."""
    conn.execute(
        schema.service_instance.insert().values(
            id=row.id,
            service=row.service,
            host=row.host,
            state=InstanceState.TERMINATED.value,
            correlation=orjson.dumps(
                {k: encode_value(v) for k, v in row.correlation.items()}
            ).decode(),
            data="{}",
            version=0,
            created_at=row.created_at,
            updated_at=now,
            completed_at=now,
        )
    )
