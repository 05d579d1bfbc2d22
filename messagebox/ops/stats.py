"""Operational queries: queue statistics and whole-box counts (for the CLI and consoles).

Portable SQLAlchemy Core, the same on every dialect. Times are the database clock's:
the age of a queue's oldest entry is measured against ``now()`` in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.models import HostStats, QueueState, QueueStats, Stats, Throughput
from messagebox.storage import schema, store_clock, subscriptions, suspension
from messagebox.storage.tracking import EVENTS


def _leased() -> sa.ColumnElement[bool]:
    q = schema.queue
    return sa.and_(q.c.lease_expires.is_not(None), q.c.lease_expires > sa.func.now())


def scheduled() -> sa.ColumnElement[bool]:
    """An entry not due yet that was never delivered (``deliver_at``, ``delay``): not
    one waiting for its retry, which was."""
    q = schema.queue
    return sa.and_(q.c.attempts == 0, q.c.available_at > sa.func.now())


def _states() -> tuple[sa.ColumnElement[bool], ...]:
    """Of the unleased entries, apart: scheduled (not due yet), held (the service is
    stopped) and blocked (ready, but a suspended step of their service instance holds
    them, :func:`suspension.holding`, or a suspended entry of their key,
    :func:`suspension.key_held`). The rest of the unleased ones are ready."""
    q = schema.queue
    free = sa.not_(_leased())
    later = sa.and_(scheduled(), free)
    held = sa.and_(q.c.state == QueueState.HELD.value, free, sa.not_(later))
    blocked = sa.and_(
        q.c.state == QueueState.READY.value,
        free,
        sa.not_(later),
        sa.or_(q.c.instance_id.in_(suspension.holding()), suspension.key_held()),
    )
    return later, held, blocked


def _count(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(sa.func.sum(sa.case((condition, 1), else_=0)), 0)


def queue_stats(conn: sa.Connection, host: str | None = None) -> list[QueueStats]:
    """Entries per host and subscription: how many, in which state, the oldest, and
    when the next scheduled one is due."""
    q, s = schema.queue, schema.subscription
    leased = _leased()
    later, held, blocked = _states()
    query = (
        sa.select(
            q.c.host,
            q.c.sub,
            s.c.name,
            s.c.service,
            sa.func.count().label("depth"),
            _count(leased).label("leased"),
            _count(held).label("held"),
            _count(later).label("scheduled"),
            sa.func.min(sa.case((later, q.c.available_at))).label("next_due"),
            _count(blocked).label("blocked"),
            sa.func.min(q.c.enqueued_at).label("oldest"),
        )
        .select_from(q.outerjoin(s, s.c.id == q.c.sub))
        .group_by(q.c.host, q.c.sub, s.c.name, s.c.service)
        .order_by(q.c.host, q.c.sub)
    )
    if host is not None:
        query = query.where(q.c.host == host)
    now = store_clock.now(conn)
    out = []
    for r in conn.execute(query):
        depth, n_leased, n_held = int(r.depth), int(r.leased), int(r.held)
        n_later, n_blocked = int(r.scheduled), int(r.blocked)
        out.append(
            QueueStats(
                host=r.host,
                subscription=int(r.sub),
                name=r.name,
                service=r.service,
                depth=depth,
                ready=depth - n_leased - n_held - n_later - n_blocked,
                held=n_held,
                blocked=n_blocked,
                leased=n_leased,
                oldest_enqueued_at=r.oldest,
                # enqueued by a transaction that began after this one: never a negative age
                oldest_age_seconds=max((now - clock.utc(r.oldest)).total_seconds(), 0.0),
                scheduled=n_later,
                next_due_at=None if r.next_due is None else clock.utc(r.next_due),
            )
        )
    return out


def heartbeat_ages(conn: sa.Connection) -> list[tuple[str, str, float]]:
    """Every registered host instance as (host, instance id, seconds since its last
    heartbeat), by the database clock."""
    i = schema.instance
    now = store_clock.now(conn)
    rows = conn.execute(sa.select(i.c.host, i.c.id, i.c.heartbeat_at).order_by(i.c.host, i.c.id))
    return [
        (r.host, r.id, max((now - clock.utc(r.heartbeat_at)).total_seconds(), 0.0)) for r in rows
    ]


def host_stats(conn: sa.Connection) -> list[HostStats]:
    """Every host, by name, with its instances, queued and suspended entries."""
    per = {
        column.table.name: _by(conn, column)
        for column in (schema.instance.c.host, schema.queue.c.host, schema.suspended.c.host)
    }
    return [
        HostStats(
            name=h.name,
            settings=h.settings,
            created_at=h.created_at,
            instances=per[schema.instance.name].get(h.name, 0),
            queued=per[schema.queue.name].get(h.name, 0),
            suspended=per[schema.suspended.name].get(h.name, 0),
            repairs=h.repairs,
        )
        for h in subscriptions.list_hosts(conn)
    ]


def _by(conn: sa.Connection, column: sa.Column[Any]) -> dict[str, int]:
    rows = conn.execute(sa.select(column, sa.func.count()).group_by(column).order_by(column))
    return {str(key): int(n) for key, n in rows}


def _total(conn: sa.Connection, table: sa.Table) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def counts(conn: sa.Connection) -> Stats:
    """Counts of every kind of thing the box holds."""
    q, p = schema.queue, schema.part
    later, held, blocked = _states()
    total, n_leased, n_held, n_later, n_blocked = conn.execute(
        sa.select(
            sa.func.count(),
            _count(_leased()),
            _count(held),
            _count(later),
            _count(blocked),
        ).select_from(q)
    ).one()
    parts, part_bytes = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(p.c.size), 0)).select_from(p)
    ).one()
    return Stats(
        messages=_total(conn, schema.spool),
        parts=int(parts),
        part_bytes=int(part_bytes),
        queued={
            "ready": int(total) - int(n_leased) - int(n_held) - int(n_later) - int(n_blocked),
            "held": int(n_held),
            "blocked": int(n_blocked),
            "leased": int(n_leased),
            "scheduled": int(n_later),
        },
        suspended=_by(conn, schema.suspended.c.reason),
        subscriptions=_by(conn, schema.subscription.c.state),
        hosts=_total(conn, schema.host),
        host_instances=_total(conn, schema.instance),
        service_instances=_by(conn, schema.service_instance.c.state),
    )


def throughput(conn: sa.Connection, windows: Sequence[float]) -> list[Throughput]:
    """Tracked events per kind within each window (seconds back from the database's
    ``now()``), one pass over the longest window."""
    t = schema.tracking
    now = store_clock.now(conn)
    starts = [now - timedelta(seconds=w) for w in windows]
    if not starts:
        return []
    query = (
        sa.select(t.c.event, *(_count(t.c.tracked_at >= start) for start in starts))
        .where(t.c.tracked_at >= min(starts))
        .group_by(t.c.event)
    )
    found = {row[0]: row[1:] for row in conn.execute(query)}
    return [
        Throughput(
            seconds=float(w),
            events={e: int(found[e][i]) if e in found else 0 for e in EVENTS},
        )
        for i, w in enumerate(windows)
    ]
