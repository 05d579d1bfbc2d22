"""The registry of host instances in storage: registration, heartbeats (which extend the
leases in flight) and the release of dead instances' leases. Every function runs inside
the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from messagebox.models import (
    InstanceInfo,
)
from messagebox.storage import arrays, schema
from messagebox.storage.dialects import Dialect


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
        # one array parameter: an IN list of each new length is a new statement text
        mine = sa.and_(q.c.lease_owner == owner, arrays.one_of(conn, q.c.id, sorted(in_flight)))
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
    conn: sa.Connection,
    dialect: Dialect,
    host: str,
    dead_after_seconds: float,
    me: str | None = None,
) -> tuple[list[str], int]:
    """Unregister ``host``'s instances whose heartbeat is stale (never ``me``, which is
    alive if it asks) and release every lease of the host held by an instance that is
    not alive (dead or unregistered). ``lease_owner`` is kept: the next claim sees the
    delivery was interrupted. Returns the dead instance ids and the number of leases
    released. Rows another transaction holds are skipped, never waited for: a process
    frozen in the middle of its heartbeat (SIGSTOP, a partition) holds its own row and
    its leases' rows, and waiting for it stalled this instance's heartbeats until both
    declared each other dead. What it holds is released once it resumes, or once
    PostgreSQL ends its idle transaction (``idle_in_transaction_session_timeout``)."""
    i = schema.instance
    stale = sa.and_(
        i.c.host == host,
        i.c.heartbeat_at < dialect.now_plus(-dead_after_seconds),
        *([i.c.id != me] if me is not None else []),
    )
    found = sa.select(i.c.id).where(stale)
    if dialect.supports_skip_locked:
        found = found.with_for_update(skip_locked=True)
    dead = list(conn.execute(found).scalars())
    if not dead:
        # Leases go with their instance: one that unregisters releases its own, one found
        # dead here has them released in the same transaction. Nothing else to look for
        # (lease_owner has no index: the search reads the host's entries).
        return dead, 0
    conn.execute(i.delete().where(i.c.id.in_(dead)))
    return dead, _release_orphans(conn, dialect, host)


def _release_orphans(conn: sa.Connection, dialect: Dialect, host: str | None) -> int:
    """Release the leases (of ``host``, or of every host) held by an instance that is
    not registered; rows another transaction holds are skipped."""
    i, q = schema.instance, schema.queue
    orphaned = sa.and_(
        q.c.lease_expires.is_not(None),
        q.c.lease_owner.is_not(None),
        q.c.lease_owner.not_in(sa.select(i.c.id)),
        *([q.c.host == host] if host is not None else []),
    )
    if dialect.supports_skip_locked:
        orphaned = q.c.id.in_(
            sa.select(q.c.id).where(orphaned).with_for_update(skip_locked=True).scalar_subquery()
        )
    released = conn.execute(q.update().where(orphaned).values(lease_expires=None)).rowcount
    if released:
        dialect.notify(conn, [host] if host is not None else _hosts(conn))
    return int(released)


def _hosts(conn: sa.Connection) -> list[str]:
    return list(conn.execute(sa.select(schema.host.c.name)).scalars())


def held_elsewhere(conn: sa.Connection, dialect: Dialect, host: str, mine: Sequence[str]) -> bool:
    """Whether a lease of ``host`` not yet expired is held by an instance not in
    ``mine``."""
    q = schema.queue
    found = conn.execute(
        sa.select(q.c.id)
        .where(
            q.c.host == host,
            q.c.lease_expires >= dialect.now_plus(0),
            q.c.lease_owner.is_not(None),
            q.c.lease_owner.not_in(list(mine)),
        )
        .limit(1)
    ).first()
    return found is not None


def release_other_processes(
    conn: sa.Connection, dialect: Dialect, live: Sequence[str]
) -> tuple[list[str], int]:
    """Where one process holds the database (DuckDB), every instance registered but not
    ``live`` in it was a process that ended (a crash, a kill): unregister them and
    release their leases at once, rather than after ``dead_after_seconds``. Returns the
    ids and the number of leases released."""
    i = schema.instance
    gone = list(conn.execute(sa.select(i.c.id).where(i.c.id.not_in(list(live)))).scalars())
    if not gone:
        return gone, 0
    conn.execute(i.delete().where(i.c.id.in_(gone)))
    return gone, _release_orphans(conn, dialect, None)
