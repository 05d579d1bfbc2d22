"""One clock a test drives, for every time the code reads: the in-memory store's wall
time (:class:`messagebox.memory.Clock`), this process's time of day (a
:data:`messagebox.clock.LocalClock`: ``clock.use_local(c)``) and the hosts' monotonic
time and waits (:class:`messagebox.hosts.timing.Clock`: ``timing.use(c)``).
:meth:`ManualClock.advance` moves them all together.

Waits block until the test moves the clock past their time-out (or their event is set,
or their condition notified): a host's threads idle without moving time, so what is due
at a time happens only once the test has moved the clock there, in every thread alike.
Nothing runs away while a test waits for a condition; a test that needs time to pass
says how much. (``waits_advance=True`` instead returns each wait and sleep at once,
having moved the clock by its time-out: for a part driven alone in the test's thread,
never for threads that idle, whose waits would then race time forward.)

No SQL, no hosts: both the memory store and the hosts import it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EVENT_LOOK_SECONDS = 0.005
"""How often (real seconds) a wait on an event looks whether the clock has ended it: an
event cannot be waited on together with the clock; the event itself wakes the wait at
once."""
LOST_WAKE_SECONDS = 1.0
"""How often (real seconds) a wait on a condition looks at the clock again, should a
notification have been missed; it does not end the wait."""


@dataclass(eq=False)  # each wait is itself: two alike are still two
class _Waiter:
    """A wait until ``deadline`` (the clock's monotonic seconds), on a condition or on
    an event (``condition`` None)."""

    condition: threading.Condition | None
    deadline: float
    fired: bool = False


class ManualClock:
    """A clock that moves only when told: wall time, monotonic time and every wait."""

    def __init__(
        self,
        start: datetime | None = None,
        *,
        monotonic: float = 1000.0,
        waits_advance: bool = False,
    ) -> None:
        self._changed = threading.Condition()
        self._at = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._mono = monotonic
        self._waiters: list[_Waiter] = []
        self.waits_begun = 0
        """How many waits on a condition have begun (for a test: threads that went
        back to waiting since it last looked)."""
        self.waits_advance = waits_advance
        """Whether a wait or a sleep returns at once, having moved the clock by its
        time-out (one thread only; see the module's notes)."""

    # --- readings ---

    def now(self) -> datetime:
        """The wall time (UTC)."""
        with self._changed:
            return self._at

    def __call__(self) -> datetime:
        return self.now()

    def monotonic(self) -> float:
        with self._changed:
            return self._mono

    # --- moving it ---

    def advance(self, seconds: float) -> None:
        """Move both readings ``seconds`` on (never back), and end the waits then due."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._changed:
            self._at += timedelta(seconds=seconds)
            self._mono += seconds
            due = [w for w in self._waiters if w.deadline <= self._mono and not w.fired]
            for w in due:
                w.fired = True
            self._changed.notify_all()
        for w in due:  # outside the clock's lock: a waiter holds its condition's
            if w.condition is not None:
                with w.condition:
                    w.condition.notify_all()

    def set(self, at: datetime) -> None:
        """Set the wall time (it may jump either way, as a machine's can); the monotonic
        time moves on by the same amount if forward."""
        with self._changed:
            ahead = (at - self._at).total_seconds()
        if ahead > 0:
            self.advance(ahead)
        with self._changed:
            self._at = at

    def waiting(self) -> tuple[int, int]:
        """How many threads wait now for the clock (a wait it has not ended), and how
        many waits have begun so far (for a test that moves it once they all wait)."""
        with self._changed:
            return sum(1 for w in self._waiters if not w.fired), self.waits_begun

    # --- waiting (messagebox.hosts.timing.Clock) ---

    def sleep(self, seconds: float) -> None:
        """Return once the clock has moved ``seconds`` on."""
        if self.waits_advance:
            self.advance(seconds)
            return
        with self._changed:
            deadline = self._mono + seconds
            while self._mono < deadline:
                self._changed.wait()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set or the clock has moved ``timeout`` seconds on;
        whether it is set."""
        if event.is_set():
            return True
        if timeout is None:
            return event.wait()
        if self.waits_advance:
            self.advance(timeout)
            return event.is_set()
        waiter = self._begin(None, timeout)
        if waiter is None:
            return event.is_set()
        try:
            while not event.wait(EVENT_LOOK_SECONDS):
                if waiter.fired:
                    return event.is_set()
            return True
        finally:
            self._end(waiter)

    def wait_on(self, condition: threading.Condition, timeout: float) -> bool:
        """``condition.wait`` (its lock held by the caller) until notified or the clock
        has moved ``timeout`` seconds on; whether notified."""
        if self.waits_advance:
            self.advance(timeout)
            return False
        waiter = self._begin(condition, timeout)
        if waiter is None:
            return False
        try:
            while True:
                notified = condition.wait(LOST_WAKE_SECONDS)
                if waiter.fired:
                    return False
                if notified:
                    return True
        finally:
            self._end(waiter)

    def _begin(self, condition: threading.Condition | None, timeout: float) -> _Waiter | None:
        """A wait of ``timeout`` seconds from now, registered; None if it is over."""
        with self._changed:
            if timeout <= 0:
                return None
            waiter = _Waiter(condition, self._mono + timeout)
            self._waiters.append(waiter)
            self.waits_begun += 1
            return waiter

    def _end(self, waiter: _Waiter) -> None:
        with self._changed:
            self._waiters.remove(waiter)
