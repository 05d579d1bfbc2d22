"""Per-minute rates kept in the store whether or not tracking is on, for the console's
charts: what each process committed (published, routed, delivered, failed, suspended,
expired, resumed, terminated; by host, reason or subscription) and each host's sampled
queue depth.

A process adds each committed transaction's event counts (the same counts as its
Prometheus counters) to a per-minute tally in memory, and writes the tally every
:data:`FLUSH_SECONDS` after a later transaction of its own, and when it closes: one small
insert, not one per transaction. A host instance samples its host's queue depth every
:data:`messagebox.upkeep.DEPTH_SECONDS`. Rows are ``(minute, source, event, label,
n)``; counts of one minute add up over sources, a depth is the largest sample of its
minute. The cleanup job deletes rows older than :data:`KEEP`. Minutes are by each
process's own clock.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from messagebox import clock
from messagebox.storage import schema

FLUSH_SECONDS = 10.0
KEEP = timedelta(hours=24)
MAX_PENDING_MINUTES = 120
"""A process that cannot write keeps this many minutes of tallies, then drops the oldest."""
DEPTH = "depth"
EVENTS = frozenset(
    {"published", "routed", "delivered", "failed", "suspended", "expired", "resumed", "terminated"}
)


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


class Tally:
    """This process's counts per minute, not yet written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Counter[tuple[datetime, str, str]] = Counter()
        self._written = time.monotonic()
        self.source = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    def add(self, counts: Mapping[tuple[str, str], int]) -> None:
        now = minute(clock.local_now())
        with self._lock:
            for (event, label), n in counts.items():
                if event in EVENTS and n:
                    self._pending[(now, event, label or "")] += n

    def due(self) -> bool:
        with self._lock:
            return bool(self._pending) and time.monotonic() - self._written >= FLUSH_SECONDS

    def take(self) -> Counter[tuple[datetime, str, str]]:
        with self._lock:
            taken, self._pending = self._pending, Counter()
            self._written = time.monotonic()
        return taken

    def put_back(self, taken: Counter[tuple[datetime, str, str]]) -> None:
        """Keep what could not be written, for the next try (the newest minutes)."""
        with self._lock:
            self._pending.update(taken)
            minutes = sorted({m for m, _, _ in self._pending})
            if len(minutes) > MAX_PENDING_MINUTES:
                oldest = minutes[-MAX_PENDING_MINUTES]
                self._pending = Counter({k: n for k, n in self._pending.items() if k[0] >= oldest})


def write(conn: sa.Connection, source: str, taken: Mapping[tuple[datetime, str, str], int]) -> None:
    if taken:
        conn.execute(
            schema.rollup.insert(),
            [
                {"minute": m, "source": source, "event": e, "label": label, "n": n}
                for (m, e, label), n in taken.items()
            ],
        )


def sample_depth(conn: sa.Connection, host: str, source: str) -> int:
    """Record ``host``'s queue depth now; returns it."""
    q = schema.queue
    depth = int(
        conn.execute(sa.select(sa.func.count()).select_from(q).where(q.c.host == host)).scalar_one()
    )
    write(conn, source, {(minute(clock.local_now()), DEPTH, host): depth})
    return depth


@dataclass(frozen=True)
class Rates:
    """The last minutes, oldest first: counts per minute by (event, label), and queue
    depth per minute by host (None where no sample was taken)."""

    minutes: list[datetime]
    counts: dict[tuple[str, str], list[int]]
    depths: dict[str, list[int | None]]

    def totals(self, event: str) -> list[int]:
        """Counts of ``event`` per minute, every label added up."""
        out = [0] * len(self.minutes)
        for (e, _), values in self.counts.items():
            if e == event:
                out = [a + b for a, b in zip(out, values, strict=True)]
        return out


def read(conn: sa.Connection, minutes: int) -> Rates:
    """The last ``minutes`` minutes (the current one included)."""
    r = schema.rollup
    last = minute(clock.local_now())
    axis = [last - timedelta(minutes=minutes - 1 - i) for i in range(minutes)]
    index = {m: i for i, m in enumerate(axis)}
    counts: dict[tuple[str, str], list[int]] = {}
    depths: dict[str, list[int | None]] = {}
    rows = conn.execute(
        sa.select(r.c.minute, r.c.event, r.c.label, sa.func.sum(r.c.n), sa.func.max(r.c.n))
        .where(r.c.minute >= axis[0])
        .group_by(r.c.minute, r.c.event, r.c.label)
    )
    for at, event, label, total, largest in rows:
        i = index.get(clock.utc(at))
        if i is None:
            continue
        if event == DEPTH:
            depths.setdefault(label, [None] * minutes)[i] = int(largest)
        else:
            counts.setdefault((event, label), [0] * minutes)[i] = int(total)
    return Rates(axis, counts, depths)


def trim(conn: sa.Connection) -> int:
    """Delete rows older than :data:`KEEP`; how many."""
    r = schema.rollup
    return int(conn.execute(r.delete().where(r.c.minute < clock.local_now() - KEEP)).rowcount or 0)
