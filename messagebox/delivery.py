"""Delivery in storage (DESIGN.md §8): claims under a lease, completion, failure and
retry, the suspended queue, and the registry of host instances.

Every function runs inside the caller's transaction. On DuckDB the caller holds the
in-process serial lock around each of them (``Store.transaction(serial=True)``): DuckDB
has no row locks, so claims must never interleave. A lease is owned by a host instance
id; completing or failing an entry whose lease another instance has taken since is a
no-op, reported as a lost lease (the other instance delivers it again: at least once).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from messagebox import schema, tracking
from messagebox.dialects import Dialect
from messagebox.errors import UnknownSuspendedEntry
from messagebox.models import (
    CRASHED_HOST,
    DELIVERY_FAILURE,
    INSTANCE_COMPLETED,
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
    HostSettings,
    InstanceInfo,
    State,
)

NOT_RESUMABLE = frozenset({SUBSCRIPTION_REMOVED, INSTANCE_COMPLETED})
"""Reasons whose suspended entries cannot go back on their queue."""

MAX_BACKOFF_SECONDS = 3600.0
MAX_ERROR_CHARS = 8000


@dataclass(frozen=True)
class Claim:
    """A queue entry claimed under a lease; ``attempts`` counts this delivery."""

    id: int
    msg: uuid.UUID
    sub: int
    attempts: int
    priority: int
    instance_id: str | None
    ordered: bool
    enqueued_at: datetime | None = None
    waited: float | None = None
    """Seconds from enqueue to this claim by the database clock, when this is the
    entry's first claim (not after a give-back or a lapsed lease); else ``None``."""
    charges: int = 0
    """Earlier deliveries charged against ``max_attempts``: failures, and deliveries
    marked started whose host then ended."""
    interrupted: bool = False
    """The previous delivery ended with no outcome (a crash, a kill, a lapsed lease)."""
    crashed_by: str | None = None
    """The last host instance that ended while handling it, if any."""


@dataclass(frozen=True)
class Failure:
    """A failed delivery: the error text, and whether to suspend without retrying."""

    claim: Claim
    error: str
    permanent: bool = False
    reason: str = DELIVERY_FAILURE
    retry_after: float | None = None
    """The service's own retry delay (``RetryLater``): retried however many attempts."""
    charge: bool = True
    """Counted against ``max_attempts``; False for ``RetryLater`` and when the engine,
    not the service, failed (the store was unreachable): then retried after
    ``retry_after`` however many times."""


@dataclass
class Finished:
    """What :func:`finish` did."""

    completed: int = 0
    retried: int = 0
    suspended: int = 0
    lost: int = 0
    stopped_subscriptions: tuple[int, ...] = ()


def _claim(row: Any) -> Claim:
    enqueued_at, claimed_at, now = row[7], row[8], row[9]
    first = claimed_at == now  # set by this claim: the database's now() is per transaction
    return Claim(
        id=int(row[0]),
        msg=row[1] if isinstance(row[1], uuid.UUID) else uuid.UUID(str(row[1])),
        sub=int(row[2]),
        attempts=int(row[3]),
        priority=int(row[4]),
        instance_id=row[5],
        ordered=bool(row[6]),
        enqueued_at=enqueued_at,
        waited=max(0.0, (now - enqueued_at).total_seconds()) if first else None,
        charges=int(row[10]),
        interrupted=bool(row[11]),
        crashed_by=row[12],
    )


def claim(
    conn: sa.Connection,
    dialect: Dialect,
    *,
    host: str,
    owner: str,
    n: int,
    lease_seconds: float,
    ordered: bool,
    instances: bool = False,
) -> list[Claim]:
    """Lease up to ``n`` ready entries of ``host``: the heads of its ordered
    subscriptions first (when ``ordered``), then the heads of its service instances
    (when ``instances``; at most half the batch while other entries wait, so neither
    kind starves the other), then the rest by priority and age."""

    def take(sql: str, most: int, **extra: int) -> int:
        params = {**dialect.claim_params(host, owner, most, lease_seconds), **extra}
        got = [_claim(r) for r in conn.exec_driver_sql(sql, params)]
        claims.extend(got)
        return len(got)

    claims: list[Claim] = []
    if ordered:
        take(dialect.claim_ordered_sql, n)
    room = n - len(claims)
    if instances and room and dialect.claim_mixed_sql is not None:
        # one statement for both kinds, interleaved; a claim of one entry alternates
        first = next(_turns) % 2 if room == 1 else 0
        take(dialect.claim_mixed_sql, room, first_kind=first)
        claims.sort(key=lambda c: (-c.priority, c.id))
        return claims
    # half each; a claim of one entry alternates between the kinds
    share = room // 2 if room > 1 else (next(_turns) % 2 if room == 1 else 0)
    heads = take(dialect.claim_instance_sql, share) if instances and share else 0
    if len(claims) < n:
        take(dialect.claim_sql, n - len(claims))
    if instances and heads == share and len(claims) < n:
        take(dialect.claim_instance_sql, n - len(claims))
    claims.sort(key=lambda c: (-c.priority, c.id))
    return claims


_turns = itertools.count()


def release(conn: sa.Connection, dialect: Dialect, msgs: Iterable[uuid.UUID]) -> None:
    """Log the release of one reference per message given (a message given twice
    releases two)."""
    counts = Counter(msgs)
    if len(counts) == 1:  # one cached statement beats a bulk load for one row
        [(msg, n)] = counts.items()
        conn.execute(schema.ref_release.insert().values(msg=msg, n=n, logged_at=sa.func.now()))
    elif counts:
        now = datetime.now(UTC)  # a log stamp only; nothing compares it with the DB clock
        dialect.insert(
            conn,
            schema.ref_release,
            {"msg": list(counts), "n": list(counts.values()), "logged_at": [now] * len(counts)},
        )


def suspend_rows(
    conn: sa.Connection,
    dialect: Dialect,
    rows: Sequence[Any],
    *,
    reason: str,
    resumable: bool | None = None,
    errors: dict[int, str] | None = None,
    report: Mapping[str, Any] | None = None,
) -> None:
    """Insert suspended entries for deleted queue rows (same ids: resuming keeps order).
    Resumable unless the reason says otherwise; the error defaults to the reason's text."""
    if not rows:
        return
    if resumable is None:
        resumable = reason not in NOT_RESUMABLE
    if errors is None and reason in _REASON_TEXT:
        errors = {r.id: _REASON_TEXT[reason] for r in rows}
    now = conn.execute(sa.select(sa.func.now())).scalar_one()
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
        },
    )
    tracking.record_rows(conn, dialect, tracking.SUSPENDED, rows, reason)


def queue_columns() -> list[sa.Column[Any]]:
    q = schema.queue
    return [
        q.c.id,
        q.c.msg,
        q.c.sub,
        q.c.host,
        q.c.attempts,
        q.c.priority,
        q.c.ordered,
        q.c.instance_id,
        q.c.enqueued_at,
    ]


def finish(
    conn: sa.Connection,
    dialect: Dialect,
    owner: str,
    completed: Sequence[Claim],
    failed: Sequence[Failure],
    settings: HostSettings,
    stop_on_failure: set[int],
) -> Finished:
    """Complete and fail claimed entries in one transaction.

    Completing deletes the entry and releases its reference. Failing makes the entry
    available again after a back-off, or past ``max_attempts`` (or when permanent)
    moves it to the suspended queue with the error, keeping its reference. When a
    subscription in ``stop_on_failure`` suspends a message, the subscription is stopped.
    """
    q = schema.queue
    result = Finished()
    if completed:
        gone = conn.execute(
            q.delete()
            .where(q.c.id.in_([c.id for c in completed]), q.c.lease_owner == owner)
            .returning(q.c.id, q.c.msg, q.c.sub, q.c.host)
        ).all()
        result.completed = len(gone)
        result.lost += len(completed) - len(gone)
        release(conn, dialect, (r.msg for r in gone))
        delivered(conn, dialect, gone, owner)
    to_suspend = [
        f
        for f in failed
        if f.permanent
        or (f.charge and f.retry_after is None and f.claim.charges + 1 >= settings.max_attempts)
    ]
    to_retry = [f for f in failed if f not in to_suspend]
    retried: list[tuple[Failure, str]] = []  # with the host, for tracking
    for f in to_retry:
        backoff = min(
            f.retry_after
            if f.retry_after is not None
            else settings.retry_backoff_seconds * 2 ** min(f.claim.charges, 30),
            MAX_BACKOFF_SECONDS,
        )
        hosts = conn.execute(
            q.update()
            .where(q.c.id == f.claim.id, q.c.lease_owner == owner)
            .values(
                lease_owner=None,
                lease_expires=None,
                started_by=None,
                available_at=dialect.now_plus(backoff),
                charges=q.c.charges + int(f.charge),
            )
            .returning(q.c.host)
        ).all()
        retried.extend((f, h.host) for h in hosts)
        result.retried += len(hosts)
        result.lost += 1 - len(hosts)
    _failed(conn, dialect, retried)
    if to_suspend:
        rows = conn.execute(
            q.delete()
            .where(q.c.id.in_([f.claim.id for f in to_suspend]), q.c.lease_owner == owner)
            .returning(*queue_columns())
        ).all()
        by_reason: dict[str, list[Any]] = {}
        reasons = {f.claim.id: f.reason for f in to_suspend}
        for r in _orphans(conn, dialect, rows):  # removed while it was being delivered
            reasons[r.id] = SUBSCRIPTION_REMOVED
        hosts_of = {r.id: r.host for r in rows}
        _failed(
            conn, dialect, [(f, hosts_of[f.claim.id]) for f in to_suspend if f.claim.id in hosts_of]
        )
        for r in rows:
            by_reason.setdefault(reasons[r.id], []).append(r)
        errors = {f.claim.id: f.error[-MAX_ERROR_CHARS:] for f in to_suspend}
        for reason, group in by_reason.items():
            suspend_rows(
                conn,
                dialect,
                group,
                reason=reason,
                resumable=reason not in NOT_RESUMABLE,
                errors=errors,
            )
        result.suspended = len(rows)
        _suspend_instances(
            conn,
            [
                r.instance_id
                for r in rows
                if r.instance_id and reasons[r.id] in (DELIVERY_FAILURE, CRASHED_HOST)
            ],
        )
        result.lost += len(to_suspend) - len(rows)
        stop = sorted({r.sub for r in rows if r.ordered and r.sub in stop_on_failure})
        if stop:
            hold(conn, stop, State.STOPPED)
            result.stopped_subscriptions = tuple(stop)
    return result


def _orphans(conn: sa.Connection, dialect: Dialect, rows: Sequence[Any]) -> list[Any]:
    """The rows whose subscription no longer exists. The rest are locked FOR SHARE
    where there are row locks (PostgreSQL), so that a concurrent removal waits, then
    sees their suspension (on DuckDB both hold the in-process lock)."""
    subs = {r.sub for r in rows}
    if not subs:
        return []
    sub = schema.subscription
    query = sa.select(sub.c.id).where(sub.c.id.in_(sorted(subs)))
    if dialect.supports_skip_locked:  # has row locks
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
            .values(reason=SUBSCRIPTION_REMOVED, resumable=False)
        ).rowcount
    )


def delivered(conn: sa.Connection, dialect: Dialect, rows: Sequence[Any], owner: str) -> None:
    """Track completed deliveries (rows with id, msg, sub and host)."""
    tracking.record_rows(conn, dialect, tracking.DELIVERED, rows, owner)


def _failed(conn: sa.Connection, dialect: Dialect, failures: Sequence[tuple[Failure, str]]) -> None:
    """Track failed attempts (each with its host)."""
    tracking.record(
        conn,
        dialect,
        tracking.FAILED,
        [f.claim.msg for f, _ in failures],
        subs=[f.claim.sub for f, _ in failures],
        hosts=[h for _, h in failures],
        entries=[f.claim.id for f, _ in failures],
        details=[_summary(f.error) for f, _ in failures],
    )


def _summary(error: str) -> str:
    """The last line of an error (a traceback ends with the exception)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else error


def give_back(conn: sa.Connection, owner: str, claims: Sequence[Claim]) -> int:
    """Release leases of entries that were claimed but never handed to a service (their
    attempt is not counted). An interrupted entry stays interrupted (its ``lease_owner``
    is kept): its next delivery is handled alone too."""
    q = schema.queue
    given = 0
    for interrupted in (False, True):
        ids = [c.id for c in claims if c.interrupted is interrupted]
        if not ids:
            continue
        values: dict[str, Any] = {
            "lease_expires": None,
            "started_by": None,
            "attempts": q.c.attempts - 1,
        }
        if not interrupted:
            values["lease_owner"] = None
        given += conn.execute(
            q.update().where(q.c.id.in_(ids), q.c.lease_owner == owner).values(**values)
        ).rowcount
    return given


def held(conn: sa.Connection, dialect: Dialect, owner: str, claims: Sequence[Claim]) -> set[int]:
    """The ids of ``claims`` whose delivery is still the one ``owner`` claimed (not
    claimed again since, by it or another instance). Locked until the transaction ends
    where there are row locks, so that no claim takes them meanwhile."""
    if not claims:
        return set()
    q = schema.queue
    query = sa.select(q.c.id, q.c.attempts).where(
        q.c.id.in_(sorted({c.id for c in claims})), q.c.lease_owner == owner
    )
    if dialect.supports_skip_locked:
        query = query.with_for_update()
    attempts = {int(i): int(n) for i, n in conn.execute(query)}
    return {c.id for c in claims if attempts.get(c.id) == c.attempts}


def mark_started(conn: sa.Connection, owner: str, claims: Sequence[Claim]) -> int:
    """Record durably that the deliveries of these claims start now: should the host
    end before their outcome is recorded, the next claim charges them an attempt.
    Returns how many are still leased by ``owner``."""
    if not claims:
        return 0
    q = schema.queue
    return int(
        conn.execute(
            q.update()
            .where(q.c.id.in_([c.id for c in claims]), q.c.lease_owner == owner)
            .values(started_by=owner)
        ).rowcount
    )


def hold(conn: sa.Connection, sub_ids: Sequence[int], state: State) -> None:
    """Set subscriptions' state; their waiting entries follow: held while stopped,
    ready once started."""
    s, q = schema.subscription, schema.queue
    conn.execute(s.update().where(s.c.id.in_(list(sub_ids))).values(state=state.value))
    if state is State.STARTED:
        conn.execute(
            q.update().where(q.c.sub.in_(list(sub_ids)), q.c.state == "held").values(state="ready")
        )
    elif state is State.STOPPED:
        conn.execute(
            q.update().where(q.c.sub.in_(list(sub_ids)), q.c.state == "ready").values(state="held")
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


def _suspend_instances(conn: sa.Connection, instance_ids: Sequence[str]) -> None:
    """A step of these instances failed past its retries: hold their other messages
    (the claim skips suspended instances) until the entry is resumed or terminated."""
    if instance_ids:
        si = schema.service_instance
        conn.execute(
            si.update()
            .where(si.c.id.in_(sorted(set(instance_ids))), si.c.state == "running")
            .values(state="suspended")
        )


def _unsuspend_instances(conn: sa.Connection, instance_ids: Iterable[str | None]) -> None:
    ids = sorted({i for i in instance_ids if i})
    if ids:
        si = schema.service_instance
        conn.execute(
            si.update().where(si.c.id.in_(ids), si.c.state == "suspended").values(state="running")
        )


_REASON_TEXT = {
    SUBSCRIPTION_REMOVED: "its subscription was removed before it was delivered",
    SERVICE_UNENLISTED: "its service was unenlisted before it was delivered",
    INSTANCE_COMPLETED: "its service instance completed before consuming it",
}


# --- the suspended queue ---


@dataclass(frozen=True)
class SuspendedQuery:
    """Which suspended entries an operation applies to; every given field must match."""

    ids: tuple[int, ...] | None = None
    reason: str | None = None
    host: str | None = None
    service: str | None = None
    subscription: int | None = None
    message_id: uuid.UUID | None = None
    before: datetime | None = None
    id_range: tuple[int, int] | None = None  # (above, through): one batch of a bulk run

    def where(self) -> list[sa.ColumnElement[bool]]:
        s = schema.suspended
        clauses: list[sa.ColumnElement[bool]] = []
        if self.ids is not None:
            clauses.append(s.c.id.in_(list(self.ids)))
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


def resume(
    conn: sa.Connection, dialect: Dialect, query: SuspendedQuery, limit: int | None = None
) -> list[int]:
    """Put resumable suspended entries back on their queues, with their original ids
    (an ordered subscription gets them back in order). An entry whose service is not
    started is queued held. Non-resumable entries are refused by id and skipped in bulk;
    ``limit`` resumes at most that many of a bulk query, lowest ids first."""
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
        )
        .join(sub, sub.c.id == s.c.sub, isouter=True)
        .where(*query.where())
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
    now = conn.execute(sa.select(sa.func.now())).scalar_one()
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
            "state": ["ready" if r.state == State.STARTED.value else "held" for r in rows],
            "attempts": [0] * len(rows),
            "available_at": [now] * len(rows),
            "enqueued_at": [now] * len(rows),  # queued again: its wait starts now
            "instance_id": [r.instance_id for r in rows],
            "ordered": [bool(r.ordered) for r in rows],
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
    where = query.where()
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


# --- host instances ---


def register(conn: sa.Connection, info: InstanceInfo) -> None:
    conn.execute(
        schema.instance.insert().values(
            id=info.id,
            host=info.host,
            hostname=info.hostname,
            pid=info.pid,
            started_at=sa.func.now(),
            heartbeat_at=sa.func.now(),
            state=info.state,
        )
    )


def heartbeat(
    conn: sa.Connection,
    dialect: Dialect,
    owner: str,
    lease_seconds: float,
    in_flight: Sequence[int] = (),
) -> bool:
    """Prove ``owner`` alive and extend the leases of the entries it has ``in_flight``
    (only those: an entry whose outcome could not be recorded lapses and is delivered
    again). False if it was declared dead. Rows another transaction holds (a completion
    deleting them) are skipped, never waited for: no deadlock with it."""
    i, q = schema.instance, schema.queue
    alive = conn.execute(
        i.update().where(i.c.id == owner).values(heartbeat_at=sa.func.now())
    ).rowcount
    if alive and in_flight:
        mine = sa.and_(q.c.lease_owner == owner, q.c.id.in_(sorted(in_flight)))
        if dialect.supports_skip_locked:
            mine = q.c.id.in_(
                sa.select(q.c.id)
                .where(mine)
                .order_by(q.c.id)
                .with_for_update(skip_locked=True)
                .scalar_subquery()
            )
        conn.execute(q.update().where(mine).values(lease_expires=dialect.now_plus(lease_seconds)))
    return bool(alive)


def set_instance_state(conn: sa.Connection, owner: str, state: str) -> None:
    i = schema.instance
    conn.execute(i.update().where(i.c.id == owner).values(state=state))


def unregister(conn: sa.Connection, owner: str) -> int:
    """Remove an instance; leases it still holds are released (their next delivery is
    an interrupted one: ``lease_owner`` is kept). Returns how many."""
    q, i = schema.queue, schema.instance
    released = conn.execute(
        q.update()
        .where(q.c.lease_owner == owner, q.c.lease_expires.is_not(None))
        .values(lease_expires=None)
    ).rowcount
    conn.execute(i.delete().where(i.c.id == owner))
    return int(released)


def instances(conn: sa.Connection, host: str | None = None) -> list[InstanceInfo]:
    i = schema.instance
    query = sa.select(i).order_by(i.c.host, i.c.started_at)
    if host is not None:
        query = query.where(i.c.host == host)
    return [
        InstanceInfo(
            id=r.id,
            host=r.host,
            hostname=r.hostname,
            pid=r.pid,
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
            state=r.state,
        )
        for r in conn.execute(query)
    ]


def release_dead(
    conn: sa.Connection, dialect: Dialect, host: str, dead_after_seconds: float
) -> tuple[list[str], int]:
    """Unregister ``host``'s instances whose heartbeat is stale and release every lease
    of the host held by an instance that is not alive (dead or unregistered).
    ``lease_owner`` is kept: the next claim sees the delivery was interrupted.
    Returns the dead instance ids and the number of leases released."""
    i, q = schema.instance, schema.queue
    stale = i.c.heartbeat_at < dialect.now_plus(-dead_after_seconds)
    dead = list(conn.execute(sa.select(i.c.id).where(i.c.host == host, stale)).scalars())
    if dead:
        conn.execute(i.delete().where(i.c.id.in_(dead)))
    live = sa.select(i.c.id).where(i.c.host == host)
    released = conn.execute(
        q.update()
        .where(
            q.c.host == host,
            q.c.lease_expires.is_not(None),
            q.c.lease_owner.is_not(None),
            q.c.lease_owner.not_in(live),
        )
        .values(lease_expires=None)
    ).rowcount
    if released:
        dialect.notify(conn, [host])
    return dead, int(released)


def queue_depths(conn: sa.Connection, hosts: Sequence[str]) -> dict[str, int]:
    """Entries waiting per host (every state), for throttling."""
    q = schema.queue
    rows = conn.execute(
        sa.select(q.c.host, sa.func.count()).where(q.c.host.in_(list(hosts))).group_by(q.c.host)
    )
    depths = dict.fromkeys(hosts, 0)
    depths.update({h: int(n) for h, n in rows})
    return depths
