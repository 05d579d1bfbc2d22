"""Wake-ups of a host instance's idle dequeue threads: a publish that touched the host
(in this process, or another's through the store's notifications), or entries claimed
ahead for them."""

from __future__ import annotations

import threading

from messagebox.hosts.timing import Clock


class WakeUps:
    """A count of wake-ups, and the threads waiting for the next one.

    A thread reads :meth:`seen` before it claims; if the claim finds nothing it waits
    (:meth:`wait`) unless a wake-up came meanwhile, so that none is missed."""

    def __init__(self, clock: Clock, stopping: threading.Event) -> None:
        self._clock = clock
        self._stopping = stopping
        self._cond = threading.Condition()
        self._count = 0

    def wake(self) -> None:
        """Wake the waiting threads."""
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def seen(self) -> int:
        """The wake-ups so far (for :meth:`wait`)."""
        with self._cond:
            return self._count

    def wait(self, seen: int, seconds: float) -> None:
        """Wait up to ``seconds`` for a wake-up, unless one came since ``seen`` was read
        or the instance is stopping."""
        with self._cond:
            if self._count == seen and not self._stopping.is_set():
                self._clock.wait_on(self._cond, seconds)
