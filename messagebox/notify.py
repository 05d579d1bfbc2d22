"""In-process wake-ups: a publish wakes the idle host instances of its hosts that run
in the same process at once (on PostgreSQL, other processes are woken by NOTIFY).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

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
