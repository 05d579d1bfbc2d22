"""The upkeep a host instance runs in-process, as numbers and results: how much cleanup
and an expiry sweep take a transaction, how often a host's queue depth is sampled, what
a sweep did and what a cleanup run removed. The work itself is
:mod:`messagebox.delivery.cleanup`'s, :mod:`messagebox.storage.expiry`'s and
:mod:`messagebox.storage.rollup`'s; no SQL here, so a host (or the in-memory store) reads these
without importing storage."""

from __future__ import annotations

from dataclasses import dataclass

HOST_BATCH = 2_500
"""Messages a transaction when a host instance runs cleanup in-process (``cleanup.run``'s
``batch``; ``messagebox cleanup`` and ``box.cleanup()`` take 10,000). A host instance
lives long and keeps the largest chunk it ever held as resident memory: over a million
deliveries on PostgreSQL (``bench.memory``), chunks of 10,000 left it 10% larger than
after warm-up, chunks of 2,500 6-7% (60,000 messages deleted at once: 6 MB against 3 MB
more, in 2.2 s against 2.7 s; on DuckDB 4.0 s against 4.1 s). A stopping instance also
waits for a smaller chunk."""

DEPTH_SECONDS = 30.0
"""How often a host instance samples its host's queue depth (:mod:`messagebox.storage.rollup`)."""

EXPIRY_BATCH = 1_000
"""Entries an expiry sweep's transaction takes (:func:`messagebox.storage.expiry.sweep`)."""


@dataclass
class Swept:
    """What a sweep did."""

    suspended: int = 0
    dropped: int = 0

    @property
    def total(self) -> int:
        return self.suspended + self.dropped


@dataclass
class CleanupReport:
    """What one cleanup run removed."""

    messages: int = 0
    parts: int = 0
    reference_rows: int = 0
    dead_instances: int = 0
    released_leases: int = 0
    purged_subscriptions: int = 0
    purged_instances: int = 0
    """Completed service instances past their retention (and convoys of instances that
    never started), deleted."""
    discarded_messages: int = 0
    receipts: int = 0
    """Receive-location receipts older than the retention, trimmed."""
    tracking_events: int = 0
    """Tracked events older than the tracking retention, trimmed."""
    tracked_messages: int = 0
    """Deleted messages whose context tracking kept (it was on), for search."""
    tracked_trimmed: int = 0
    """Kept contexts of messages published before the tracking retention, trimmed."""
    expired: int = 0
    """Expired entries of hosts that no instance runs, suspended or dropped (an instance
    sweeps its own host's at every heartbeat)."""
    rollup_rows: int = 0
    """Per-minute rate rows older than a day (:mod:`messagebox.storage.rollup`), trimmed."""
    routing_versions: int = 0
    """Routing-version rows behind the newest
    :data:`~messagebox.storage.subscriptions.VERSIONS_KEPT`, trimmed (a routing index further behind
    than that loads every subscription again)."""
    skipped: bool = False
    """Another cleanup held the lock (PostgreSQL); this run did nothing."""
    stopped: bool = False
    """Asked to stop between two batches; unreferenced messages may be left."""
    seconds: float = 0.0
