"""Publish throttling (docs/concepts.md: Hosts): a host whose queue is deeper than its
``throttle_queue_depth`` slows its publishers down instead of growing without bound.

Depths and host settings are cached briefly so that an unthrottled publish costs no
extra query most of the time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa

from messagebox.errors import Throttled
from messagebox.storage import capabilities, schema, subscriptions
from messagebox.storage.store import Store


def queue_depths(conn: sa.Connection, hosts: Sequence[str]) -> dict[str, int]:
    """Entries waiting per host (every state), for throttling: those of ``hosts``, and on
    DuckDB every host's (a scan counts them all at once, without the filter: 180,000
    entries in 2.5 ms against 4.0)."""
    q = schema.queue
    query = sa.select(q.c.host, sa.func.count()).group_by(q.c.host)
    if capabilities.of(conn).counts_host_by_index:
        query = query.where(q.c.host.in_(list(hosts)))
    depths = dict.fromkeys(hosts, 0)
    depths.update({h: int(n) for h, n in conn.execute(query).all()})
    return depths


DEPTH_TTL_SECONDS = 0.5
SETTINGS_TTL_SECONDS = 5.0


class Throttle:
    """Per-MessageBox throttle state: cached depths and thresholds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limits: dict[str, int] = {}
        self._limits_at = -SETTINGS_TTL_SECONDS
        self._depths: dict[str, tuple[float, int]] = {}

    def _thresholds(self, conn: sa.Connection) -> dict[str, int]:
        now = time.monotonic()
        with self._lock:
            if now - self._limits_at < SETTINGS_TTL_SECONDS:
                return self._limits
        limits = {h.name: h.settings.throttle_queue_depth for h in subscriptions.list_hosts(conn)}
        with self._lock:
            self._limits, self._limits_at = limits, now
        return limits

    def _current(self, conn: sa.Connection, hosts: Iterable[str], fresh: bool) -> dict[str, int]:
        now = time.monotonic()
        wanted = sorted(set(hosts))
        cached: dict[str, int] = {}
        if not fresh:
            with self._lock:
                for h in wanted:
                    entry = self._depths.get(h)
                    if entry is not None and now - entry[0] < DEPTH_TTL_SECONDS:
                        cached[h] = entry[1]
        stale = [h for h in wanted if h not in cached]
        if stale:
            found = queue_depths(conn, stale)  # may count other hosts too: kept
            with self._lock:
                for h, d in found.items():
                    self._depths[h] = (now, d)
            cached.update((h, found[h]) for h in stale)
        return cached

    def over(self, conn: sa.Connection, hosts: Iterable[str], fresh: bool = False) -> list[str]:
        """The hosts among ``hosts`` whose queue is deeper than their threshold."""
        limits = self._thresholds(conn)
        depths = self._current(conn, [h for h in hosts if h in limits], fresh)
        return sorted(h for h, d in depths.items() if d > limits[h])

    def check(self, conn: sa.Connection, hosts: set[str]) -> None:
        """Raise :class:`Throttled` if a host of a publish is over its threshold."""
        over = self.over(conn, hosts)
        if over:
            depth = self._depths[over[0]][1]
            raise Throttled(
                f"host {over[0]!r} has {depth} entries waiting, more than its "
                f"throttle_queue_depth {self._limits[over[0]]}; publishing is throttled",
                hosts=over,
            )

    def added(self, entries: Mapping[str, int]) -> None:
        """Count entries this process just queued into the cached depths."""
        with self._lock:
            for host, n in entries.items():
                cached = self._depths.get(host)
                if cached is not None:
                    self._depths[host] = (cached[0], cached[1] + n)

    def wait(self, store: Store, hosts: Iterable[str], deadline: float) -> None:
        """Sleep until these hosts are under their thresholds or the deadline passes."""
        pause = 0.05
        while time.monotonic() < deadline:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            with store.transaction() as conn:
                if not self.over(conn, hosts, fresh=True):
                    return
            pause = min(pause * 2, 1.0)
