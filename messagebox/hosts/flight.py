"""The claimed batches of a host instance not yet recorded: the only entries whose
leases its heartbeats extend."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from messagebox.claims import Claim


class InFlight:
    """Claimed batches not yet recorded, by ``id()`` of the batch's list (a batch in and
    out is one dict operation each; an entry may be in two batches, delivered again
    meanwhile), and the claims running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, Sequence[Claim]] = {}
        self._claiming = 0

    def add(self, claims: Sequence[Claim]) -> None:
        """A batch is in flight until :meth:`remove`: heartbeats extend its leases."""
        with self._lock:
            self._batches[id(claims)] = claims

    def remove(self, claims: Sequence[Claim]) -> None:
        """This batch's deliveries are over: heartbeats stop extending its leases."""
        with self._lock:
            self._batches.pop(id(claims), None)

    def entry_ids(self) -> list[int]:
        """The ids of the entries in flight, each once, in order."""
        with self._lock:
            return sorted({c.id for claims in self._batches.values() for c in claims})

    def batches_holding(self, entry_id: int) -> list[Sequence[Claim]]:
        """The batches in flight that hold entry ``entry_id``."""
        with self._lock:
            return [b for b in self._batches.values() if any(c.id == entry_id for c in b)]

    @contextmanager
    def claiming(self) -> Iterator[None]:
        """A claim runs meanwhile (the instance is not idle)."""
        with self._lock:
            self._claiming += 1
        try:
            yield
        finally:
            with self._lock:
                self._claiming -= 1

    def __len__(self) -> int:
        """How many batches are in flight (handled, or waiting for a thread)."""
        return len(self._batches)  # one read of a dict's size: no lock needed

    def busy(self) -> bool:
        """Whether a batch is in flight or a claim runs."""
        with self._lock:
            return bool(self._batches) or self._claiming > 0
