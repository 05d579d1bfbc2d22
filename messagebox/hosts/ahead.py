"""Batches one claim took for an instance's other dequeue threads, or a publish handed
over (:class:`ClaimedAhead`)."""

from __future__ import annotations

import threading
from collections import deque

from messagebox.claims import Claim
from messagebox.outcomes import Outcomes, merged


class ClaimedAhead:
    """Entries one claim took for the instance's other dequeue threads, in batches, and
    the outcomes of the batches handled from them, deferred to the next claim's transaction.

    On DuckDB a claim costs milliseconds whatever its size (measured: 100 entries in
    3.6 ms, 500 in 6.7), and every claim is serialised in-process anyway: one claim for
    several threads' batches does the same work in fewer statements. An outcome waits
    no longer than it does without claiming ahead: until the next claim of the instance.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: deque[tuple[list[Claim], bool]] = deque()
        """Each batch, and whether a publish handed it over (no claim follows it)."""
        self._deferred: list[Outcomes] = []

    def __bool__(self) -> bool:
        """Whether a batch waits for a thread."""
        return bool(self._batches)

    def put(self, batches: list[list[Claim]], *, handed: bool = False) -> None:
        """Batches for the threads; ``handed``: a publish handed them over, and no
        claim follows them (see :meth:`take_with_origin`)."""
        with self._lock:
            self._batches.extend((b, handed) for b in batches)

    def claimed(self) -> bool:
        """Whether a batch a claim took waits (not one handed over)."""
        with self._lock:
            return not all(handed for _, handed in self._batches)

    def take(self) -> list[Claim] | None:
        """A batch claimed ahead (its permits are taken), or None."""
        taken = self.take_with_origin()
        return None if taken is None else taken[0]

    def take_with_origin(self) -> tuple[list[Claim], bool] | None:
        """A batch (its permits are taken) and whether a publish handed it over: then
        no claim of the instance need follow it, and the outcomes it would defer are
        recorded at once. None if none waits."""
        if not self._batches:  # read without the lock: a miss only claims anew
            return None
        with self._lock:
            return self._batches.popleft() if self._batches else None

    def defer_outcomes(self, outcomes: Outcomes) -> None:
        """Leave these to be recorded with the instance's next claim (a batch taken from
        here needed no claim of its own)."""
        with self._lock:
            self._deferred.append(outcomes)

    def take_deferred_outcomes(self, carry: Outcomes | None) -> Outcomes | None:
        """``carry`` with every outcome deferred to a claim, as one (taking them)."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
        if carry is not None:
            deferred.append(carry)
        return merged(deferred)

    def drain(self) -> tuple[list[list[Claim]], list[Outcomes]]:
        """Everything held (at the end): the batches never handed out, and the outcomes
        deferred."""
        with self._lock:
            batches, self._batches = [b for b, _ in self._batches], deque()
            deferred, self._deferred = self._deferred, []
        return batches, deferred
