"""A host instance's side of the hand-over (:mod:`messagebox.storage.handover`): while its
last claim took all there was, a publish in this process may lease it entries as it stores
them; once that publish commits they reach the dequeue threads as a claim for them all
would leave them, without a claim."""

from __future__ import annotations

import threading
from collections.abc import Callable

from messagebox.claims import Claim
from messagebox.hosts.claiming import Claimer
from messagebox.hosts.timing import Clock
from messagebox.hosts.wakeups import WakeUps
from messagebox.models import HostSettings
from messagebox.port import HostStore


class HandOver:
    """What a publish hands this instance over (a :class:`messagebox.port.Taker`)."""

    def __init__(
        self,
        owner: str,
        settings: HostSettings,
        claimer: Claimer,
        stopping: threading.Event,
        clock: Clock,
        give_back: Callable[[list[Claim]], None],
    ) -> None:
        self._owner = owner
        self._settings = settings
        self._claimer = claimer
        self._stopping = stopping
        self._clock = clock
        self._give_back = give_back
        """Gives back entries handed over once the stop gave back the rest."""
        self._cond = threading.Condition()
        self._open = 0
        """Reservations whose publish has not ended yet."""
        self._closed = False
        self._late = False
        """The stop has given back what waited: what comes now is given back at once."""
        self._unwatch: Callable[[], None] | None = None

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def lease_seconds(self) -> float:
        return self._settings.lease_seconds

    def watch(self, queue: HostStore) -> None:
        """Take what this process's publishes hand over (where they can)."""
        self._unwatch = queue.hand_over_to(self)

    @property
    def watching(self) -> bool:
        """Whether this process's publishes to the host hand entries over to it."""
        return self._unwatch is not None and not self._closed

    def claim_needless(self, seen: int, wakeups: WakeUps) -> bool:
        """Whether a claim after a batch would find nothing: the instance takes what is
        handed over, its last claim took all there was, no batch waits, nothing was
        published to the host since the batch was taken (``seen``: the wake-ups then),
        and every entry of the host is plain (a completion frees no run, key or service
        instance). An entry due later (a retry, a schedule) is claimed after the
        back-off, as ever."""
        return (
            self.watching
            and self._claimer.drained
            and not self._claimer.ahead
            and wakeups.seen() == seen
            and self._claimer.only_plain()
        )

    def reserve(self, n: int, *, busy: bool = False) -> int:
        """Up to ``n`` permits (a batch a thread at most), without waiting, while the
        instance has no backlog: every entry of its host is plain and its last claim
        took fewer entries than it asked for (none older is left ready to overtake), and
        no batch a claim took waits (one handed over may); unless ``busy``, also a
        thread free (fewer batches in flight than threads: a publish offers its entries
        to the instances with a free thread first); else 0."""
        with self._cond:
            if (
                self._closed
                or self._stopping.is_set()
                or not self._claimer.drained
                or self._claimer.ahead.claimed()
                or not self._claimer.only_plain()
                or not (busy or self._claimer.thread_free())
            ):
                return 0
            s = self._settings
            most = min(n, s.claim_batch * s.dequeue_threads)
            got = self._claimer.permits.take(most, self._stopping, wait=False)
            if got:
                self._open += 1
            return got

    def accept(self, claims: list[Claim], age: float) -> None:
        """Take the entries handed over; given back at once once the stop gave back the
        rest, or when their lease may have lapsed already (a publish in a transaction
        held open for half of ``lease_seconds``: a claim may have taken them)."""
        with self._cond:
            late = self._late or age > self._settings.lease_seconds / 2
            if not late:  # the stop's last give-back (finish) takes them if it must
                self._claimer.handed(claims)
            self._open -= 1
            self._cond.notify_all()
        if late:
            self._claimer.permits.give(len(claims))
            self._give_back(claims)

    def cancel(self, n: int) -> None:
        self._claimer.permits.give(n)
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def close(self, deadline: float) -> None:
        """At the stop: take nothing more, and wait (until ``deadline``, monotonic) for
        the publishes that reserved to end, so that what they hand over is among the
        batches the stop gives back."""
        if self._unwatch is not None:
            self._unwatch()
        with self._cond:
            self._closed = True
            while self._open > 0:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    break
                self._clock.wait_on(self._cond, left)

    def finish(self) -> None:
        """After the stop gave back what waited: a publish still open (past the close's
        deadline) gives back what it hands over itself."""
        with self._cond:
            self._late = True
