"""What this process keeps about one database: a :class:`DatabaseLocal` per database,
shared by every :class:`~messagebox.storage.store.Store` of it in the process.

Two stores opened on one database (by ``Store.key``: a DuckDB file's absolute path, a
server URL without its password) share it: a publish through one wakes the host
instances watching through the other, both take DuckDB's one write lock and routing
fence, hand out ids from one block, and so on. Its one registry, :data:`_REGISTRY`,
is here; every module asks ``store.local`` instead of keeping a registry of its own.

Lifetimes:

- The object lives while any store of the database does, open *or closed*: the
  registry holds it weakly, each store strongly. A store closed while something still
  uses it (a handler a stopping host instance abandoned, a host watching through a box
  closed under it) thus keeps sharing the write lock, the wake-ups and the host
  instances registered with every store opened later; and nothing is left behind once
  no store of the database is left.
- What only an open store needs goes when the last one closes: the messages kept in
  memory (:attr:`recent`) and the rest of the id block (:attr:`blocks`). Both are
  made anew by the next open, so a database file removed and made anew meanwhile
  starts with neither (an id block kept from the old file would hand out ids its
  sequence hands out again).
- A database every open makes anew (DuckDB's ``:memory:``) gets an object of its own,
  not registered: two such stores are two databases.

Not here, deliberately: a store's transaction groups (:class:`messagebox.storage.sharing.Groups`,
per store, as the leader's store commits the work it takes along), and the process
clock's test hook (``messagebox.clock._local``), process-wide on purpose: a test sets
it for every store and module at once.
"""

from __future__ import annotations

import math
import threading
import weakref
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from messagebox.storage import handover, ids, notify, recent
from messagebox.storage.fence import Fence, ReadWriteLock


class DatabaseLocal:
    """This process's state of one database (see the module): its in-process locks,
    wake-ups, routing change count, host instances, timer hints, and, while a store of
    it is open, its id block and kept messages. Thread-safe."""

    def __init__(self, key: str, *, one_process: bool) -> None:
        self.key = key
        """The database's ``Store.key``."""
        self.one_process = one_process
        """Whether only this process opens the database (DuckDB): then the transactions
        that must not interleave are serialised here, and ids and messages are kept."""
        self.lock = threading.RLock()
        """The in-process write lock (:meth:`serial`)."""
        self.fence = ReadWriteLock()
        """The routing fence where it is this process's (:meth:`hold_routing`)."""
        self.wakes = notify.Waiters()
        """The in-process wake-ups of the database's hosts."""
        self.takers = handover.Takers()
        """The idle host instances a publish hands entries to (one process)."""
        self.routing_changes = 0
        """How many transactions that changed routing committed here (one process: an
        index asks the database only after one did; :mod:`messagebox.storage.routing_index`)."""
        self.blocks: ids.Blocks | None = None
        """The rest of the id block, while a store is open (one process)."""
        self.recent: recent.Recent | None = None
        """The messages kept in memory, while a store is open (one process)."""
        self._stores = 0
        self._live: set[str] = set()
        self._timers: dict[str, float] = {}
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"DatabaseLocal({self.key!r}, stores={self._stores})"

    # --- open stores ---

    @property
    def stores(self) -> int:
        """How many stores of the database are open in this process."""
        return self._stores

    def _opened(self) -> None:
        with self._guard:
            if not self._stores and self.one_process:
                self.blocks = ids.Blocks()
                self.recent = recent.Recent()
            self._stores += 1

    def closed(self) -> None:
        """A store of the database closed: the last one drops the id block and the kept
        messages (the rest stays while a store object does; see the module)."""
        with self._guard:
            self._stores = max(0, self._stores - 1)
            if not self._stores:
                self.blocks = None
                self.recent = None

    # --- locks ---

    def serial(self) -> AbstractContextManager[Any]:
        """Held around a transaction that must not interleave with another of the
        database in this process: the write lock (an ``RLock``) where only this process
        opens it, else nothing."""
        return self.lock if self.one_process else nullcontext()

    def hold_routing(self, fence: Fence) -> AbstractContextManager[Any]:
        """Held around a whole transaction that routes or changes subscriptions, where
        the routing fence is this process's (one process; :mod:`messagebox.storage.fence`).
        Only publishes take it to route: the other transactions that route are serial,
        as every change is, so they cannot overlap one."""
        if not self.one_process:
            return nullcontext()
        return self.fence.writing() if fence is Fence.CHANGES else self.fence.reading()

    def routing_changed(self) -> None:
        """A transaction that changed routing committed (``Store.transaction``)."""
        with self._guard:
            self.routing_changes += 1

    # --- host instances of this process ---

    def instance_registered(self, owner: str) -> list[str]:
        """Note a host instance registered here; every one registered, sorted."""
        with self._guard:
            self._live.add(owner)
            return sorted(self._live)

    def instance_unregistered(self, owner: str) -> None:
        with self._guard:
            self._live.discard(owner)

    def instances(self) -> list[str]:
        """The host instances registered by this process (one process: every other
        registered instance is of a process that ended), sorted."""
        with self._guard:
            return sorted(self._live)

    # --- timers set by steps here ---

    def timer_set(self, host: str, due: float) -> None:
        """A step here set a timer of ``host`` due at ``due`` (seconds since the epoch,
        by this process's clock)."""
        with self._guard:
            self._timers[host] = min(due, self._timers.get(host, math.inf))

    def timers_looked_at(self, host: str) -> None:
        """The host's timers were read: what :meth:`timer_set_before` says starts again."""
        with self._guard:
            self._timers.pop(host, None)

    def timer_set_before(self, host: str, at: float) -> bool:
        """Whether a step here set a timer of ``host`` due before ``at`` since its timers
        were last looked at."""
        with self._guard:
            return self._timers.get(host, math.inf) < at


_REGISTRY: weakref.WeakValueDictionary[str, DatabaseLocal] = weakref.WeakValueDictionary()
"""The one registry: each database of this process by its key, while a store of it is."""
_GUARD = threading.Lock()


def opened(key: str, *, one_process: bool, private: bool = False) -> DatabaseLocal:
    """The state of database ``key`` for a store that opens it (the one every store of
    it shares; ``private``: one of its own, the database being new at each open); give
    it back with :meth:`DatabaseLocal.closed`."""
    with _GUARD:
        local = None if private else _REGISTRY.get(key)
        if local is None:
            local = DatabaseLocal(key, one_process=one_process)
            if not private:
                _REGISTRY[key] = local
    local._opened()
    return local


def found(key: str) -> DatabaseLocal | None:
    """The state of database ``key`` if a store of it is in this process."""
    with _GUARD:
        return _REGISTRY.get(key)
