"""This process's clock, and times as the store returns them. Every time a transaction
writes is the database's (:mod:`messagebox.storage.store_clock`); the few stamps a process takes
from its own clock (instance start, error reports, log lines) come from :func:`local_now`,
the one place a package module reads the time of day. No SQL here: hosts read it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

LocalClock = Callable[[], datetime]
"""A source of this process's own time, in UTC."""


def system_time() -> datetime:
    return datetime.now(UTC)


_local: LocalClock = system_time


def local_now() -> datetime:
    """This process's own time, in UTC: for stamps that decide nothing between machines
    (instance start, error reports, log lines). Every package module reads it here, so
    :func:`use_local` changes it for all of them."""
    return _local()


@contextmanager
def use_local(clock: LocalClock) -> Iterator[None]:
    """Read this process's time from ``clock`` meanwhile (a machine whose clock is off)."""
    global _local
    previous, _local = _local, clock
    try:
        yield
    finally:
        _local = previous


def fetched(at: datetime | int) -> datetime:
    """A time as :func:`messagebox.storage.store_clock.fetchable` gave it: a datetime as it is,
    microseconds since the epoch as the UTC datetime they name. Up to 2100 through a float
    of seconds, exact there (each microsecond is the float's nearest, well within half a
    microsecond): half the cost of adding a timedelta, once per message read and entry claimed."""
    if not isinstance(at, int):
        return at
    if 0 <= at < _EXACT_US:
        return _from_timestamp(at / 1e6, UTC)
    return _EPOCH + timedelta(microseconds=at)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EXACT_US = 4_102_444_800_000_000
"""2100-01-01 in microseconds since the epoch: :func:`fetched`'s float path ends here."""
_from_timestamp = datetime.fromtimestamp


def utc(at: datetime) -> datetime:
    """``at`` in UTC; a time without a zone (as DuckDB returns) is taken as UTC."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
