"""The upkeep a host instance runs in-process, as numbers and results: how much cleanup
and an expiry sweep take a transaction, how often a host's queue depth is sampled, what
a sweep did. The work itself is :mod:`messagebox.cleanup`'s, :mod:`messagebox.expiry`'s
and :mod:`messagebox.rollup`'s; no SQL here, so a host reads these without importing
storage."""

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
"""How often a host instance samples its host's queue depth (:mod:`messagebox.rollup`)."""

EXPIRY_BATCH = 1_000
"""Entries an expiry sweep's transaction takes (:func:`messagebox.expiry.sweep`)."""


@dataclass
class Swept:
    """What a sweep did."""

    suspended: int = 0
    dropped: int = 0

    @property
    def total(self) -> int:
        return self.suspended + self.dropped
