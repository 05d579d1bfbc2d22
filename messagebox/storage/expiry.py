"""Expiry in storage (docs/concepts.md: Expiry): the hosts' ``message_ttl_seconds`` as a
publish reads them, and the sweep that takes expired entries off their queues.

An entry past its ``expires_at`` is never claimed (every claim statement passes it
over); the sweep moves it, unless it is in hand (leased: that delivery finishes), to
the suspended queue (reason ``expired``, resumable) or deletes it and releases its
reference, as its subscription's ``on_expiry`` says. Host instances sweep their host
at every heartbeat, the cleanup job the hosts with no instance. Every function runs
inside the caller's transaction.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.models import EXPIRED, OnExpiry
from messagebox.storage import schema, subscriptions, tracking
from messagebox.storage.dialects import Dialect
from messagebox.storage.schema import queue_columns
from messagebox.storage.spool import release
from messagebox.storage.suspension import suspend_rows
from messagebox.upkeep import EXPIRY_BATCH, Swept

SETTINGS_TTL_SECONDS = 5.0
"""How long a process uses the hosts' ``message_ttl_seconds`` it read before reading
them again (a change reaches the other processes' publishes within this)."""


_KEY = "mb_host_ttls"
"""``conn.info`` key: the store's :class:`HostTtls` (set by ``Store.transaction``)."""


class HostTtls:
    """One store's hosts' ``message_ttl_seconds`` (only the hosts that have one), read
    at most every :data:`SETTINGS_TTL_SECONDS`: a publish then costs no query for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: dict[str, float] | None = None
        self._read_at = 0.0

    def get(self, conn: sa.Connection) -> dict[str, float]:
        with self._lock:
            if self._value is not None and time.monotonic() - self._read_at < SETTINGS_TTL_SECONDS:
                return self._value
        value = {
            h.name: h.settings.message_ttl_seconds
            for h in subscriptions.list_hosts(conn)
            if h.settings.message_ttl_seconds is not None
        }
        with self._lock:
            self._value, self._read_at = value, time.monotonic()
        return value

    def invalidate(self) -> None:
        """Read them again next time (a host's settings changed in this process)."""
        with self._lock:
            self._value = None


def begin(conn: sa.Connection, ttls: HostTtls) -> None:
    """Mark the start of a store transaction (``Store.transaction`` calls it)."""
    conn.info[_KEY] = ttls


def host_ttls(conn: sa.Connection) -> dict[str, float]:
    """The hosts' ``message_ttl_seconds`` by host name, those that have one."""
    ttls: HostTtls | None = conn.info.get(_KEY)
    return {} if ttls is None else ttls.get(conn)


def sweep(conn: sa.Connection, dialect: Dialect, host: str, limit: int = EXPIRY_BATCH) -> Swept:
    """Take up to ``limit`` of ``host``'s expired entries that are not in hand off the
    queue, earliest expiry first: suspended (``expired``) or dropped, as their
    subscriptions say. Where there are row locks, entries another transaction holds are
    skipped (another instance's sweep, or a claim that took one as it expired)."""
    q = schema.queue
    pick = (
        sa.select(q.c.id)
        .where(
            q.c.host == host,
            q.c.expires_at <= sa.func.now(),
            sa.or_(q.c.lease_expires.is_(None), q.c.lease_expires < sa.func.now()),
        )
        .order_by(q.c.expires_at)
        .limit(limit)
    )
    if dialect.has_row_locks:
        pick = pick.with_for_update(skip_locked=True)
    rows = conn.execute(
        q.delete()
        .where(q.c.id.in_(pick.scalar_subquery()))
        .returning(*queue_columns(), q.c.expires_at)
    ).all()
    return _expired(conn, dialect, rows)


def _expired(conn: sa.Connection, dialect: Dialect, rows: Sequence[Any]) -> Swept:
    """Suspend or drop expired entries deleted from the queue, by subscription."""
    done = Swept()
    if not rows:
        return done
    s = schema.subscription
    subs = {
        r.id: (r.name, r.on_expiry)
        for r in conn.execute(
            sa.select(s.c.id, s.c.name, s.c.on_expiry).where(
                s.c.id.in_(sorted({r.sub for r in rows}))
            )
        )
    }
    drop = [r for r in rows if subs.get(r.sub, ("", ""))[1] == OnExpiry.DROP.value]
    kept = [r for r in rows if subs.get(r.sub, ("", ""))[1] != OnExpiry.DROP.value]
    if kept:
        suspend_rows(
            conn,
            dialect,
            kept,
            reason=EXPIRED,
            resumable=True,
            errors={
                r.id: f"it expired at {clock.utc(r.expires_at).isoformat()} before delivery"
                for r in kept
            },
        )
    if drop:
        release(conn, dialect, (r.msg for r in drop))
    for group, outcome in ((kept, "suspended"), (drop, "dropped")):
        tracking.record(
            conn,
            dialect,
            tracking.EXPIRED,
            [r.msg for r in group],
            subs=[r.sub for r in group],
            hosts=[r.host for r in group],
            entries=[r.id for r in group],
            details=[outcome] * len(group),
            counted=Counter(subs.get(r.sub, (str(r.sub), ""))[0] for r in group),
        )
    done.suspended, done.dropped = len(kept), len(drop)
    return done
