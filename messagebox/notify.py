"""In-process wake-ups: a publish wakes the idle host instances of its hosts that run
in the same process at once (on PostgreSQL, other processes are woken by NOTIFY).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

_Key = tuple[str, str]
_waiters: dict[_Key, set[Callable[[], None]]] = {}
_guard = threading.Lock()


def watch(database: str, host: str, wake: Callable[[], None]) -> Callable[[], None]:
    """Call ``wake`` whenever this process publishes to ``host`` in ``database``.
    Returns the function that stops watching."""
    key = (database, host)
    with _guard:
        _waiters.setdefault(key, set()).add(wake)

    def unwatch() -> None:
        with _guard:
            waiters = _waiters.get(key)
            if waiters is not None:
                waiters.discard(wake)
                if not waiters:
                    del _waiters[key]

    return unwatch


def signal(database: str, hosts: Iterable[str]) -> None:
    """Wake this process's watchers of these hosts."""
    with _guard:
        targets = [w for h in set(hosts) for w in _waiters.get((database, h), ())]
    for wake in targets:
        wake()


_AFTER_COMMIT = "messagebox.wake"


def after_commit(conn: Any, names: Iterable[str]) -> None:
    """Signal these names in this process once ``conn``'s transaction commits (the
    store does it: :func:`take` hands them over)."""
    conn.info.setdefault(_AFTER_COMMIT, set()).update(names)


def take(conn: Any) -> set[str]:
    """The names to signal when ``conn``'s transaction commits; forgets them."""
    names: set[str] = conn.info.pop(_AFTER_COMMIT, set())
    return names
