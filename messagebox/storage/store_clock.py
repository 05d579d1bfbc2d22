"""The store's clock. Every time a transaction writes (publish, queue, timer and
tracking stamps) is the database's, read once per transaction, so machines whose own
clocks disagree still agree on order, ages and due times. This process's own clock,
which a host reads too, is :mod:`messagebox.clock`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.clock import system_time, utc
from messagebox.storage import capabilities

_KEY = "mb_clock"
"""``conn.info`` key: the transaction's time, once read (``Store.transaction`` sets it)."""


_SAME_MACHINE = "mb_clock_same_machine"
"""``conn.info`` key: true when the database runs in this process (DuckDB), so that its
clock is this machine's and the time is read here, without a statement."""


def begin(conn: sa.Connection, *, same_machine: bool = False) -> None:
    """Start caching the time for a store transaction (``Store.transaction`` calls it)."""
    conn.info[_KEY] = None
    conn.info[_SAME_MACHINE] = same_machine


def end(conn: sa.Connection) -> None:
    """Forget the transaction's time."""
    conn.info.pop(_KEY, None)
    conn.info.pop(_SAME_MACHINE, None)


def seed(conn: sa.Connection, at: datetime) -> None:
    """The transaction's time, read by another statement (a publish's prelude)."""
    if _KEY in conn.info and conn.info[_KEY] is None:
        conn.info[_KEY] = at


def seed_read(conn: sa.Connection, at: datetime) -> None:
    """The transaction's time as a statement read it among its columns (saving the round
    trip of :func:`now`); ignored where the database runs on this machine, whose clock
    :func:`now` reads instead."""
    if not conn.info.get(_SAME_MACHINE):
        seed(conn, utc(at))


def read_among_columns(conn: sa.Connection) -> bool:
    """Whether a statement should read the transaction's time among its columns for
    :func:`seed_read`: not where the database runs on this machine (DuckDB), whose
    clock :func:`now` reads here (a time column costs about 3 us a row there)."""
    return not conn.info.get(_SAME_MACHINE)


def fetchable(conn: sa.Connection, at: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """A time column as a hot statement fetches it: on DuckDB its microseconds since the
    epoch (a time with a zone costs about 3 us a value to fetch there); read it back
    with :func:`messagebox.clock.fetched`. DuckDB's claim statements return their times
    the same way."""
    return sa.func.epoch_us(at) if capabilities.of(conn).times_as_epoch else at


def now(conn: sa.Connection) -> datetime:
    """The database's time for this transaction, in UTC."""
    at: datetime | None = conn.info.get(_KEY)
    if at is None:
        if conn.info.get(_SAME_MACHINE):
            at = system_time()  # the database's clock is this machine's
        else:
            at = utc(conn.execute(sa.select(sa.func.now())).scalar_one())
        if _KEY in conn.info:
            conn.info[_KEY] = at
    return at
