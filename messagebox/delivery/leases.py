"""Delivery in storage (docs/concepts.md: Hosts): claims under a lease, completion, failure and
retry. Suspending lives in :mod:`messagebox.storage.suspension`, the registry of host instances
in :mod:`messagebox.delivery.registry`.

Every function runs inside the caller's transaction. On DuckDB the caller holds the
in-process serial lock around each of them (``Store.transaction(serial=True)``): DuckDB
has no row locks, so claims must never interleave. A lease is owned by a host instance
id; completing or failing an entry whose lease another instance has taken since is a
no-op, reported as a lost lease (the other instance delivers it again: at least once).
"""

from __future__ import annotations

import itertools
import operator
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from messagebox.claims import MAX_BACKOFF_SECONDS, Claim, Failure, Finished, in_claim_order
from messagebox.models import (
    CRASHED_HOST,
    DELIVERY_FAILURE,
    SUBSCRIPTION_REMOVED,
    HostSettings,
    State,
)
from messagebox.storage import arrays, ids, schema, tracking
from messagebox.storage.dialects import Dialect
from messagebox.storage.schema import queue_columns
from messagebox.storage.spool import release
from messagebox.storage.suspension import (
    MAX_ERROR_CHARS,
    NOT_RESUMABLE,
    hold,
    orphans,
    suspend_instances,
    suspend_rows,
)

_ID = operator.attrgetter("id")


def _claim(row: Any) -> Claim:
    """A claim statement's row (id, msg, sub, attempts, priority, instance_id, ordered,
    enqueued_at, claimed_at, now(), charges, interrupted, crashed_by) as a claim, its
    values made their Python types (DuckDB may give text and other widths). DuckDB's
    give the three times as microseconds since the epoch: a time with a zone costs
    3 us a value to fetch there, nine a claimed entry."""
    enqueued_at, claimed_at, now = row[7], row[8], row[9]
    # first claimed by this claim: the database's now() is per transaction
    waited = (now - enqueued_at) if claimed_at == now else None
    if waited is not None:
        waited = waited / 1e6 if type(waited) is int else waited.total_seconds()
    return Claim(
        int(row[0]),
        ids.as_uuid(row[1]),
        int(row[2]),
        int(row[3]),
        int(row[4]),
        row[5],
        bool(row[6]),
        enqueued_at,
        None if waited is None else max(0.0, waited),
        int(row[10]),
        bool(row[11]),
        row[12],
    )


_CLAIM_FIELDS = slice(1, 1 + Claim._fields.index("run"))
"""Where a claim's fields are in a ``complete_claim`` row: after its flag, in order
(all but ``run``, as that statement claims no ordered run, and ``publish``)."""


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
    ordered_most: int | None = None,
    rest_most: int | None = None,
    keyed: int = 0,
    per_key: int = 0,
    plain: bool = True,
) -> list[Claim]:
    """Lease up to ``n`` ready entries of ``host``: the run of one of its ordered
    subscriptions first (when ``ordered``; at most ``ordered_most`` entries if given),
    then (at most ``rest_most`` of them, if given) the runs of free keys of its
    subscriptions ordered by a property (at most ``keyed`` entries, ``per_key`` a key:
    :func:`claim_keyed`), the heads of its service instances (when ``instances``; at
    most half the batch while other entries wait, so neither kind starves the other),
    then the rest by priority and age (none of those two without ``plain``)."""

    def take(sql: str, most: int, **extra: int) -> int:
        params = {**dialect.claim_params(host, owner, most, lease_seconds), **extra}
        got = [_claim(r) for r in dialect.lease(conn, sql, params)]
        claims.extend(got)
        return len(got)

    claims: list[Claim] = []
    if ordered:
        most = n if ordered_most is None else min(n, ordered_most)
        claims = claim_run(
            conn, dialect, host=host, owner=owner, n=most, lease_seconds=lease_seconds
        )
    room = n - len(claims) if rest_most is None else min(n - len(claims), rest_most)
    if keyed and room:
        together = plain and not instances and dialect.claims_keyed_with_plain
        got = claim_keyed(
            conn,
            dialect,
            host=host,
            owner=owner,
            n=min(keyed, room),
            per_key=per_key or n,
            lease_seconds=lease_seconds,
            plain=room if together else 0,
        )
        claims.extend(got)
        room -= len(got)
        plain = plain and not together
    if not plain:
        in_claim_order(claims)
        return claims
    n = len(claims) + room
    if instances and room and dialect.claim_mixed_sql is not None:
        # one statement for both kinds, interleaved; a claim of one entry alternates
        first = next(_turns) % 2 if room == 1 else 0
        take(dialect.claim_mixed_sql, room, first_kind=first)
        in_claim_order(claims)
        return claims
    # half each; a claim of one entry alternates between the kinds
    share = room // 2 if room > 1 else (next(_turns) % 2 if room == 1 else 0)
    heads = take(dialect.claim_instance_sql, share) if instances and share else 0
    if len(claims) < n:
        take(dialect.claim_sql, n - len(claims))
    if instances and heads == share and len(claims) < n:
        take(dialect.claim_instance_sql, n - len(claims))
    in_claim_order(claims)
    return claims


_turns = itertools.count()


def claim_run(
    conn: sa.Connection, dialect: Dialect, *, host: str, owner: str, n: int, lease_seconds: float
) -> list[Claim]:
    """Lease the run of one of ``host``'s ordered subscriptions (at most ``n`` of its
    oldest entries, when its head is free), in id order (an ``UPDATE ... RETURNING``
    returns its rows in no set order), each claim marked :attr:`Claim.run`."""
    params = dialect.claim_params(host, owner, n, lease_seconds)
    rows = dialect.lease_run(conn, params)
    return sorted((_claim(r)._replace(run=True) for r in rows), key=_ID)


def claim_keyed(
    conn: sa.Connection,
    dialect: Dialect,
    *,
    host: str,
    owner: str,
    n: int,
    per_key: int,
    lease_seconds: float,
    plain: int = 0,
) -> list[Claim]:
    """Lease the runs of free keys of ``host``'s subscriptions ordered by a property: at
    most ``per_key`` of each key's oldest entries, in publish order, up to ``n`` in all
    (a key is free when none of its entries is in hand, none older waits and no
    suspended entry holds it). Each claim carries its :attr:`Claim.key`. With ``plain``
    (where the dialect ``claims_keyed_with_plain``), plain entries too, up to ``plain``
    in all."""
    params = {**dialect.claim_params(host, owner, n, lease_seconds), "per_key": per_key}
    if plain:
        params["plain"] = plain
    rows = dialect.lease_keyed(conn, params)
    return [_claim(r)._replace(key=r[13]) for r in rows]


def complete_and_claim(
    conn: sa.Connection,
    dialect: Dialect,
    *,
    host: str,
    owner: str,
    completed: Sequence[Claim],
    n: int,
    lease_seconds: float,
    keyed: int = 0,
    per_key: int = 0,
) -> tuple[Finished, list[Claim]]:
    """Complete entries (as :func:`finish` does for completions) and lease up to ``n``
    entries in one statement: plain ones (as :func:`claim` does with neither ordered
    subscriptions nor service instances; the dialect's ``complete_claim_sql``), after
    at most ``keyed`` entries of keyed runs (``per_key`` a key, as :func:`claim_keyed`;
    ``complete_claim_keyed_sql``) when ``keyed``."""
    statement = dialect.complete_claim_keyed_sql if keyed else dialect.complete_claim_sql
    assert statement is not None
    params = {
        **dialect.claim_params(host, owner, n, lease_seconds),
        "done": "{" + ",".join([str(c.id) for c in completed]) + "}",
    }
    if keyed:
        params.update(keyed=min(keyed, n), per_key=per_key or n)
    claims: list[Claim] = []
    gone: list[int] = []
    make = Claim._make
    for row in dialect.fetch(conn, statement, params):
        if row[0]:  # typed by the driver already (psycopg), its wait computed
            claims.append(make((*row[_CLAIM_FIELDS], False, (), row[13] if keyed else None)))
        else:
            gone = row[-1]
    result = Finished(completed=len(gone), lost=len(completed) - len(gone))
    if gone:
        _delivered(conn, dialect, completed, gone, [host] * len(gone), owner)
    in_claim_order(claims)
    return result, claims


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
    result = Finished()
    if completed:
        _complete(conn, dialect, owner, completed, result)
    to_suspend = [
        f
        for f in failed
        if f.permanent
        or (f.charge and f.retry_after is None and f.claim.charges + 1 >= settings.max_attempts)
    ]
    _retry(conn, dialect, owner, [f for f in failed if f not in to_suspend], settings, result)
    if to_suspend:
        _suspend(conn, dialect, owner, to_suspend, stop_on_failure, result)
    return result


def complete(
    conn: sa.Connection, dialect: Dialect, owner: str, claims: Sequence[Claim]
) -> Finished:
    """Complete claimed entries (as :func:`finish` does) in the caller's transaction."""
    result = Finished()
    _complete(conn, dialect, owner, claims, result)
    return result


def _complete(
    conn: sa.Connection, dialect: Dialect, owner: str, claims: Sequence[Claim], result: Finished
) -> None:
    """Delete the entries still leased by ``owner`` and release their references. Only
    ids and hosts come back: the claims hold the rest."""
    q = schema.queue
    mine = sa.and_(arrays.one_of(conn, q.c.id, [c.id for c in claims]), q.c.lease_owner == owner)
    gone = conn.execute(q.delete().where(mine).returning(q.c.id, q.c.host)).all()
    result.completed = len(gone)
    result.completed_ids.extend(g.id for g in gone)
    result.lost += len(claims) - len(gone)
    msgs = _delivered(conn, dialect, claims, [g.id for g in gone], [g.host for g in gone], owner)
    release(conn, dialect, msgs)


def _delivered(
    conn: sa.Connection,
    dialect: Dialect,
    claims: Sequence[Claim],
    gone: Sequence[int],
    hosts: Sequence[str],
    owner: str,
) -> list[uuid.UUID]:
    """Track the completion of the claims whose entries are ``gone`` (ids, with their
    hosts); returns their messages."""
    of = {c.id: c for c in claims}
    done = [of[i] for i in gone]
    msgs = [c.msg for c in done]
    tracking.record(
        conn,
        dialect,
        tracking.DELIVERED,
        msgs,
        subs=[c.sub for c in done],
        hosts=hosts,
        entries=gone,
        details=[owner] * len(done),
    )
    return msgs


def _retry(
    conn: sa.Connection,
    dialect: Dialect,
    owner: str,
    failures: Sequence[Failure],
    settings: HostSettings,
    result: Finished,
) -> None:
    """Make failed entries available again after their back-off."""
    q = schema.queue
    retried: list[tuple[Failure, str]] = []  # with the host, for tracking
    for f in failures:
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


def _suspend(
    conn: sa.Connection,
    dialect: Dialect,
    owner: str,
    failures: Sequence[Failure],
    stop_on_failure: set[int],
    result: Finished,
) -> None:
    """Move failed entries to the suspended queue (by reason; an entry whose
    subscription was removed meanwhile as ``subscription-removed``), suspend their
    service instances, and stop the ordered subscriptions that stop on failure."""
    q = schema.queue
    rows = conn.execute(
        q.delete()
        .where(
            arrays.one_of(conn, q.c.id, [f.claim.id for f in failures]), q.c.lease_owner == owner
        )
        .returning(*queue_columns())
    ).all()
    by_reason: dict[str, list[Any]] = {}
    reasons = {f.claim.id: f.reason for f in failures}
    for r in orphans(conn, dialect, rows):  # removed while it was being delivered
        reasons[r.id] = SUBSCRIPTION_REMOVED
    hosts_of = {r.id: r.host for r in rows}
    _failed(conn, dialect, [(f, hosts_of[f.claim.id]) for f in failures if f.claim.id in hosts_of])
    for r in rows:
        by_reason.setdefault(reasons[r.id], []).append(r)
    errors = {f.claim.id: f.error[-MAX_ERROR_CHARS:] for f in failures}
    # a keyed entry of a subscription that stops on failure holds its key
    holding = [
        r
        for r in rows
        if r.order_key is not None
        and r.sub in stop_on_failure
        and reasons[r.id] not in NOT_RESUMABLE
    ]
    for reason, group in by_reason.items():
        suspend_rows(
            conn,
            dialect,
            group,
            reason=reason,
            resumable=reason not in NOT_RESUMABLE,
            errors=errors,
            holds={r.id for r in holding},
        )
    result.suspended = len(rows)
    suspend_instances(
        conn,
        [
            r.instance_id
            for r in rows
            if r.instance_id and reasons[r.id] in (DELIVERY_FAILURE, CRASHED_HOST)
        ],
    )
    result.lost += len(failures) - len(rows)
    stop = sorted({r.sub for r in rows if r.ordered and r.sub in stop_on_failure})
    if stop:
        hold(conn, stop, State.STOPPED)
        result.stopped_subscriptions = tuple(stop)
    result.held_keys = tuple(sorted({(r.sub, r.order_key) for r in holding}))


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
            q.update()
            .where(arrays.one_of(conn, q.c.id, ids), q.c.lease_owner == owner)
            .values(**values)
        ).rowcount
    return given


def held(conn: sa.Connection, dialect: Dialect, owner: str, claims: Sequence[Claim]) -> set[int]:
    """The ids of ``claims`` whose delivery is still the one ``owner`` claimed (not
    claimed again since, by it or another instance): its attempt, of the same message.
    (A failover that lost the last commits, replicating asynchronously, can give a
    claimed entry's id to a new entry, which ``owner`` may have claimed too.) Locked
    until the transaction ends where there are row locks, so that no claim takes them
    meanwhile."""
    if not claims:
        return set()
    q = schema.queue
    query = sa.select(q.c.id, q.c.attempts, q.c.msg).where(
        arrays.one_of(conn, q.c.id, sorted({c.id for c in claims})), q.c.lease_owner == owner
    )
    if dialect.has_row_locks:
        query = query.with_for_update()
    found = {int(i): (int(n), ids.as_uuid(m)) for i, n, m in conn.execute(query)}
    return {c.id for c in claims if found.get(c.id) == (c.attempts, c.msg)}


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
