"""Whether a store answers, as one process sees it (docs/howto-postgresql.md, High
availability): one log line when its transactions find it unreachable
(``event: store-lost``), one when a transaction commits again (``store-back``, with
``outage_seconds``), instead of a line for every failure in between.

The outage is timed from the first failure the process saw to the first commit after it:
a process that tried nothing meanwhile noticed it later, and says so.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("messagebox.store")


class Outage:
    """The store's reachability for one :class:`~messagebox.storage.store.Store`."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        """The store's URL, without its password."""
        self.count = 0
        """Outages so far: what a host instance compares to know whether the store was
        lost while it held a batch (claims made before may be void: asynchronous
        replication loses the last commits in a failover)."""
        self._since: float | None = None
        self._lock = threading.Lock()
        self._users: dict[str, str] = {}
        """Host instances using the store, with their hosts: named in its lines."""

    def used_by(self, instance: str, host: str) -> None:
        """Name a host instance in the lines (one store may serve several)."""
        with self._lock:
            self._users[instance] = host

    def failed(self, error: BaseException) -> None:
        """A transaction found the store unreachable: logged if it was not already."""
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
            self.count += 1
            fields = self._fields()
        log.error(
            "store %s lost: %s",
            self.shown,
            error,
            extra={"event": "store-lost", "store": self.shown, "error": str(error), **fields},
        )

    def answered(self) -> None:
        """A transaction committed: if the store was lost, it is back (logged)."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._since = self._since, None
            fields = self._fields()
        if since is None:
            return
        seconds = time.monotonic() - since
        log.info(
            "store %s back after %.1f s",
            self.shown,
            seconds,
            extra={
                "event": "store-back",
                "store": self.shown,
                "outage_seconds": round(seconds, 3),
                **fields,
            },
        )

    def _fields(self) -> dict[str, str]:
        if not self._users:
            return {}
        return {
            "host_instance": ", ".join(sorted(self._users)),
            "host": ", ".join(sorted(set(self._users.values()))),
        }
