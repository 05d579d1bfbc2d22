"""The routing fence: publishes in flight against subscription changes.

A publish routes against the subscriptions its transaction sees, then writes its queue
entries and commits. A change that removes a subscription, unenlists or stops a service
suspends (or holds) the entries waiting for it; a publish that routed before the change
but commits after it would leave entries on a subscription that no longer exists, or
ready on a stopped one. So every transaction that routes holds the fence *shared* from
before it reads the subscriptions until it commits, and every subscription change holds
it *exclusive* from before it reads anything: a change waits for the publishes in
flight, and the publishes that come meanwhile wait for it and route by the new
subscriptions. Nothing else waits: claims, completions and reads never touch the fence.

Where it is held is the dialect's: on PostgreSQL, a transaction-scoped advisory lock on
the store's schema (the publish's first statement takes it shared, with what it reads
before it routes, in one round trip); on DuckDB, one process, :class:`ReadWriteLock`
below, held around the whole transaction (DuckDB's snapshot is taken when the
transaction begins, so a lock taken inside it would come too late).

Order, so that none of this can deadlock: a transaction takes the fence before any row
lock, and before the subscription lock (``Dialect.lock_subscriptions``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum


class Fence(Enum):
    """How a transaction holds the routing fence."""

    ROUTES = "routes"
    """Shared: it routes messages (a publish, a completion or step that publishes)."""
    CHANGES = "changes"
    """Exclusive: it changes subscriptions (apply, unsubscribe, a service's state)."""


class ReadWriteLock:
    """Many readers or one writer. A writer waiting keeps new readers out (a stream of
    publishes cannot starve an apply); a thread that holds it already, either way, may
    take it again at once (a reader's nested read never waits behind a writer)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers: dict[int, int] = {}  # thread id -> depth
        self._writer: int | None = None
        self._writer_depth = 0
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me and me not in self._readers:
                while self._writer is not None or self._writers_waiting:
                    self._cond.wait()
            self._readers[me] = self._readers.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                depth = self._readers.pop(me) - 1
                if depth:
                    self._readers[me] = depth
                elif not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                if me in self._readers:
                    raise RuntimeError("a reader cannot become the writer (it would deadlock)")
                self._writers_waiting += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._writers_waiting -= 1
                    self._cond.notify_all()  # readers held back by this writer look again
                self._writer = me
            self._writer_depth += 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if not self._writer_depth:
                    self._writer = None
                    self._cond.notify_all()
