"""The suspended queue in storage: entries suspended (by failure, removal or
unenlisting), resumed onto their queues again, or terminated. Every function runs inside
the caller's transaction."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.errors import Conflict, UnknownSuspendedEntry, ValidationError
from messagebox.models import (
    INSTANCE_COMPLETED,
    RECEIVE_FAILURE,
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
    InstanceState,
    QueueState,
    State,
)
from messagebox.storage import arrays, schema, store_clock, tracking
from messagebox.storage.dialects import Dialect
from messagebox.storage.schema import queue_columns
from messagebox.storage.spool import release

NOT_RESUMABLE = frozenset({SUBSCRIPTION_REMOVED, INSTANCE_COMPLETED})
"""Reasons whose suspended entries cannot go back on their queue."""


MAX_ERROR_CHARS = 8000


def suspend_rows(
    conn: sa.Connection,
    dialect: Dialect,
    rows: Sequence[Any],
    *,
    reason: str,
    resumable: bool | None = None,
    errors: dict[int, str] | None = None,
    report: Mapping[str, Any] | None = None,
    holds: set[int] | frozenset[int] = frozenset(),
) -> None:
    """Insert suspended entries for deleted queue rows (same ids: resuming keeps order).
    Resumable unless the reason says otherwise; the error defaults to the reason's text.
    Those of ``holds`` (ids) hold their key: its later entries wait for them."""
    if not rows:
        return
    if resumable is None:
        resumable = reason not in NOT_RESUMABLE
    if errors is None and reason in _REASON_TEXT:
        errors = {r.id: _REASON_TEXT[reason] for r in rows}
    now = store_clock.now(conn)
    errors = errors or {}
    dialect.insert(
        conn,
        schema.suspended,
        {
            "id": [r.id for r in rows],
            "msg": [r.msg for r in rows],
            "sub": [r.sub for r in rows],
            "host": [r.host for r in rows],
            "resumable": [resumable] * len(rows),
            "reason": [reason] * len(rows),
            "error": [errors.get(r.id) for r in rows],
            "report": [None if report is None else json.dumps(report)] * len(rows),
            "attempts": [r.attempts for r in rows],
            "suspended_at": [now] * len(rows),
            "priority": [r.priority for r in rows],
            "ordered": [bool(r.ordered) for r in rows],
            "instance_id": [r.instance_id for r in rows],
            "enqueued_at": [r.enqueued_at for r in rows],
            "order_key": [r.order_key for r in rows],
            "holds_key": [r.id in holds for r in rows],
        },
    )
    tracking.record_rows(conn, dialect, tracking.SUSPENDED, rows, reason)


def orphans(conn: sa.Connection, dialect: Dialect, rows: Sequence[Any]) -> list[Any]:
    """The rows whose subscription no longer exists. The rest are locked FOR SHARE
    where there are row locks (PostgreSQL), so that a concurrent removal waits, then
    sees their suspension (on DuckDB both hold the in-process lock)."""
    subs = {r.sub for r in rows}
    if not subs:
        return []
    sub = schema.subscription
    query = sa.select(sub.c.id).where(sub.c.id.in_(sorted(subs)))
    if dialect.has_row_locks:
        query = query.with_for_update(read=True)
    kept = set(conn.execute(query).scalars())
    return [r for r in rows if r.sub not in kept]


def orphan_suspended(conn: sa.Connection, sub_ids: Sequence[int]) -> int:
    """Resumable suspended entries of removed subscriptions can no longer be resumed:
    they become ``subscription-removed`` (re-routable), keeping their error."""
    if not sub_ids:
        return 0
    s = schema.suspended
    return int(
        conn.execute(
            s.update()
            .where(s.c.sub.in_(list(sub_ids)), s.c.resumable == sa.true())
            .values(reason=SUBSCRIPTION_REMOVED, resumable=False, holds_key=False)
        ).rowcount
    )


def hold(conn: sa.Connection, sub_ids: Sequence[int], state: State) -> None:
    """Set subscriptions' state; their waiting entries follow: held while stopped,
    ready once started."""
    s, q = schema.subscription, schema.queue
    conn.execute(s.update().where(s.c.id.in_(list(sub_ids))).values(state=state.value))
    if state is State.STARTED:
        conn.execute(
            q.update()
            .where(q.c.sub.in_(list(sub_ids)), q.c.state == QueueState.HELD.value)
            .values(state=QueueState.READY.value)
        )
    elif state is State.STOPPED:
        conn.execute(
            q.update()
            .where(q.c.sub.in_(list(sub_ids)), q.c.state == QueueState.READY.value)
            .values(state=QueueState.HELD.value)
        )


def suspend_waiting(
    conn: sa.Connection, dialect: Dialect, sub_ids: Sequence[int], reason: str
) -> int:
    """Move the unleased entries of these subscriptions to the suspended queue (for
    subscriptions that are removed or unenlisted). Leased ones finish their delivery."""
    if not sub_ids:
        return 0
    q = schema.queue
    rows = conn.execute(
        q.delete()
        .where(
            q.c.sub.in_(list(sub_ids)),
            sa.or_(q.c.lease_expires.is_(None), q.c.lease_expires < sa.func.now()),
        )
        .returning(*queue_columns())
    ).all()
    suspend_rows(
        conn,
        dialect,
        rows,
        reason=reason,
        resumable=reason in (SERVICE_UNENLISTED,),
        errors={r.id: _REASON_TEXT[reason] for r in rows},
    )
    return len(rows)


def suspend_instances(conn: sa.Connection, instance_ids: Sequence[str]) -> None:
    """A step of these instances failed past its retries: hold their other messages
    (the claim skips suspended instances) until the entry is resumed or terminated."""
    if instance_ids:
        si = schema.service_instance
        conn.execute(
            si.update()
            .where(
                si.c.id.in_(sorted(set(instance_ids))), si.c.state == InstanceState.RUNNING.value
            )
            .values(state=InstanceState.SUSPENDED.value)
        )


def holding() -> sa.Select[tuple[str | None]]:
    """The service instances a suspended (resumable) entry holds: their queued entries
    wait, the claim passing them over, until it is resumed or terminated."""
    s = schema.suspended
    return sa.select(s.c.instance_id).where(
        s.c.resumable == sa.true(), s.c.instance_id.is_not(None)
    )


def key_held() -> sa.ColumnElement[bool]:
    """Whether a queue entry's key is held: a suspended entry of its subscription with
    its key holds it (ordered by a property, stopping on failure), until that one is
    resumed or terminated."""
    s, q = schema.suspended, schema.queue
    return sa.and_(
        q.c.order_key.is_not(None),
        sa.exists().where(
            s.c.holds_key == sa.true(), s.c.sub == q.c.sub, s.c.order_key == q.c.order_key
        ),
    )


def _unsuspend_instances(conn: sa.Connection, instance_ids: Iterable[str | None]) -> None:
    ids = sorted({i for i in instance_ids if i})
    if ids:
        si = schema.service_instance
        conn.execute(
            si.update()
            .where(si.c.id.in_(ids), si.c.state == InstanceState.SUSPENDED.value)
            .values(state=InstanceState.RUNNING.value)
        )


_REASON_TEXT = {
    SUBSCRIPTION_REMOVED: "its subscription was removed before it was delivered",
    SERVICE_UNENLISTED: "its service was unenlisted before it was delivered",
    INSTANCE_COMPLETED: "its service instance completed before consuming it",
}


@dataclass(frozen=True)
class SuspendedQuery:
    """Which suspended entries an operation applies to; every given field must match.

    ``ids`` names entries one by one (each must exist); ``among`` is a failure group's
    entries, a filter like the others. ``group`` names a failure group, which
    :class:`~messagebox.ops.operations.Operations` turns into ``among`` before a query."""

    ids: tuple[int, ...] | None = None
    reason: str | None = None
    host: str | None = None
    service: str | None = None
    subscription: int | None = None
    message_id: uuid.UUID | None = None
    before: datetime | None = None
    error: str | None = None
    """Text the error contains, in any case."""
    group: str | None = None
    among: tuple[int, ...] | None = None
    id_range: tuple[int, int] | None = None  # (above, through): one batch of a bulk run

    def where(self, conn: sa.Connection) -> list[sa.ColumnElement[bool]]:
        s = schema.suspended
        clauses: list[sa.ColumnElement[bool]] = []
        if self.group is not None:
            raise ValueError("a failure group is resolved to its entries before a query")
        if self.ids is not None:
            clauses.append(s.c.id.in_(list(self.ids)))
        if self.among is not None:
            clauses.append(arrays.one_of(conn, s.c.id, self.among) if self.among else sa.false())
        if self.id_range is not None:
            clauses.append(s.c.id > self.id_range[0])
            clauses.append(s.c.id <= self.id_range[1])
        if self.reason is not None:
            clauses.append(s.c.reason == self.reason)
        if self.host is not None:
            clauses.append(s.c.host == self.host)
        if self.subscription is not None:
            clauses.append(s.c.sub == self.subscription)
        if self.message_id is not None:
            clauses.append(s.c.msg == self.message_id)
        if self.before is not None:
            clauses.append(s.c.suspended_at < self.before)
        if self.error is not None:
            found = sa.func.strpos(sa.func.lower(s.c.error), sa.func.lower(self.error))
            clauses.append(found > 0)
        if self.service is not None:
            sub = schema.subscription
            clauses.append(s.c.sub.in_(sa.select(sub.c.id).where(sub.c.service == self.service)))
        return clauses


def _check_ids(conn: sa.Connection, ids: Sequence[int] | None) -> None:
    if ids:
        s = schema.suspended
        known = set(conn.execute(sa.select(s.c.id).where(s.c.id.in_(list(ids)))).scalars())
        missing = [i for i in ids if i not in known]
        if missing:
            raise UnknownSuspendedEntry(f"no suspended entry {missing[0]}")


@dataclass(frozen=True)
class NewExpiry:
    """The expiry resumed entries get: ``ttl`` seconds from the resume (database time),
    or ``at``; neither: none."""

    ttl: float | None = None
    at: datetime | None = None

    def of(self, now: datetime) -> datetime | None:
        """The expiry for a resume at ``now``; :class:`ValidationError` if it has passed."""
        end = self.at if self.ttl is None else now + timedelta(seconds=self.ttl)
        if end is not None and end <= now:
            raise ValidationError(
                f"expires_at {end.isoformat()} has passed (the store's time is "
                f"{now.isoformat()}); nothing was resumed"
            )
        return end


NO_EXPIRY = NewExpiry()
"""Resumed entries never expire (the default)."""


def resume(
    conn: sa.Connection,
    dialect: Dialect,
    query: SuspendedQuery,
    limit: int | None = None,
    expiry: NewExpiry = NO_EXPIRY,
) -> list[int]:
    """Put resumable suspended entries back on their queues, with their original ids
    (an ordered subscription gets them back in order) and the expiry ``expiry`` gives
    (none by default). An entry whose service is not started is queued held.
    Non-resumable entries are refused by id and skipped in bulk; ``limit`` resumes at
    most that many of a bulk query, lowest ids first."""
    s, sub = schema.suspended, schema.subscription
    _check_ids(conn, query.ids)
    select = (
        sa.select(
            s.c.id,
            s.c.msg,
            s.c.sub,
            s.c.resumable,
            sub.c.host,
            sub.c.priority,
            sub.c.ordered,
            sa.func.coalesce(s.c.instance_id, sub.c.instance_id).label("instance_id"),
            sub.c.state,
            s.c.order_key,
        )
        .join(sub, sub.c.id == s.c.sub, isouter=True)
        .where(*query.where(conn))
        .order_by(s.c.id)
    )
    if query.ids is None:  # bulk: only what can be resumed, so that a limit counts those
        select = select.where(s.c.resumable == sa.true(), sub.c.host.is_not(None))
        if limit is not None:
            select = select.limit(limit)
    rows = conn.execute(select).all()
    if query.ids is not None:
        for r in rows:
            if not r.resumable:
                raise UnknownSuspendedEntry(
                    f"suspended entry {r.id} is not resumable ({_reason(conn, r.id)}); "
                    "terminate it, or re-route it if its subscription was removed"
                )
            if r.host is None:
                raise UnknownSuspendedEntry(
                    f"suspended entry {r.id}: its subscription {r.sub} no longer exists"
                )
    rows = [r for r in rows if r.resumable and r.host is not None]
    if not rows:
        return []
    now = store_clock.now(conn)
    expires_at = expiry.of(clock.utc(now))
    conn.execute(s.delete().where(s.c.id.in_([r.id for r in rows])))
    dialect.insert(
        conn,
        schema.queue,
        {
            "id": [r.id for r in rows],
            "msg": [r.msg for r in rows],
            "sub": [r.sub for r in rows],
            "host": [r.host for r in rows],
            "priority": [r.priority for r in rows],
            "state": [
                (QueueState.READY if r.state == State.STARTED.value else QueueState.HELD).value
                for r in rows
            ],
            "attempts": [0] * len(rows),
            "available_at": [now] * len(rows),
            "enqueued_at": [now] * len(rows),  # queued again: its wait starts now
            "instance_id": [r.instance_id for r in rows],
            "ordered": [bool(r.ordered) for r in rows],
            "expires_at": [expires_at] * len(rows),
            "order_key": [r.order_key for r in rows],
        },
    )
    _unsuspend_instances(conn, (r.instance_id for r in rows))
    tracking.record_rows(conn, dialect, tracking.RESUMED, rows)
    dialect.notify(conn, sorted({r.host for r in rows}))
    return [r.id for r in rows]


def _reason(conn: sa.Connection, entry: int) -> str:
    s = schema.suspended
    return str(conn.execute(sa.select(s.c.reason).where(s.c.id == entry)).scalar_one())


def terminate(
    conn: sa.Connection, dialect: Dialect, query: SuspendedQuery, limit: int | None = None
) -> list[int]:
    """Delete suspended entries and release their references; ``limit`` deletes at most
    that many, lowest ids first."""
    s = schema.suspended
    _check_ids(conn, query.ids)
    where = query.where(conn)
    if limit is not None:
        first = sa.select(s.c.id).where(*where).order_by(s.c.id).limit(limit)
        where = [s.c.id.in_(first)]
    rows = conn.execute(
        s.delete().where(*where).returning(s.c.id, s.c.msg, s.c.instance_id, s.c.sub, s.c.host)
    ).all()
    release(conn, dialect, (r.msg for r in rows))
    tracking.record_rows(conn, dialect, tracking.TERMINATED, rows)
    _unsuspend_instances(conn, (r.instance_id for r in rows))  # the instance goes on without it
    return sorted(r.id for r in rows)


def withdraw(conn: sa.Connection, dialect: Dialect, entry_id: int, message_id: uuid.UUID) -> None:
    """Terminate receive failure ``entry_id`` (its input is being published again in
    this transaction); refused unless it is still suspended, as a receive failure of
    ``message_id``."""
    s = schema.suspended
    row = conn.execute(sa.select(s.c.reason, s.c.msg).where(s.c.id == entry_id)).first()
    if row is None:
        raise UnknownSuspendedEntry(f"no suspended entry {entry_id}")
    if row.reason != RECEIVE_FAILURE or row.msg != message_id:
        raise Conflict(f"suspended entry {entry_id} changed meanwhile; nothing was published")
    terminate(conn, dialect, SuspendedQuery(ids=(entry_id,)))
