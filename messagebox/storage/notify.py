"""In-process wake-ups: a publish wakes the idle host instances of its hosts that run
in the same process at once (on PostgreSQL, other processes are woken by NOTIFY). A
transaction names the hosts to wake (:func:`after_commit`); once it commits, its store
signals them through the database's :class:`Waiters` (``store.local.wakes``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


class Waiters:
    """The wake-ups of one database in this process, by host (or channel): kept by its
    :class:`~messagebox.storage.database_local.DatabaseLocal`, so that a publish through any
    store of the database wakes the watchers of every other."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[Callable[[], None]]] = {}
        self._guard = threading.Lock()

    def watch(self, host: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever this process publishes to ``host`` in the database.
        Returns the function that stops watching."""
        with self._guard:
            self._waiters.setdefault(host, set()).add(wake)

        def unwatch() -> None:
            with self._guard:
                waiters = self._waiters.get(host)
                if waiters is not None:
                    waiters.discard(wake)
                    if not waiters:
                        del self._waiters[host]

        return unwatch

    def signal(self, hosts: Iterable[str]) -> None:
        """Wake this process's watchers of these hosts."""
        with self._guard:
            targets = [w for h in set(hosts) for w in self._waiters.get(h, ())]
        for wake in targets:
            wake()

    def __len__(self) -> int:
        """How many hosts are watched."""
        with self._guard:
            return len(self._waiters)


_AFTER_COMMIT = "messagebox.wake"


def after_commit(conn: Any, names: Iterable[str]) -> None:
    """Signal these names in this process once ``conn``'s transaction commits (the
    store does it: :func:`take` hands them over)."""
    conn.info.setdefault(_AFTER_COMMIT, set()).update(names)


def take(conn: Any) -> set[str]:
    """The names to signal when ``conn``'s transaction commits; forgets them."""
    names: set[str] = conn.info.pop(_AFTER_COMMIT, set())
    return names
