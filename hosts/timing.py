"""The hosts' monotonic clock: how long things take and how long to wait (lease
deadlines, handler time-outs, back-offs, heartbeats), as opposed to the time of day
(:mod:`messagebox.clock`). Every part of a host instance is given one, so that a test
can drive time: the one module under ``hosts/`` that reads ``time.monotonic`` or calls
``time.sleep`` (``tests/structure.py`` checks).

    clock = timing.current()        # the system's, unless a test set another
    deadline = clock.monotonic() + 5.0
    clock.wait(stopping, 1.0)       # Event.wait(1.0), as the clock measures it
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Clock(Protocol):
    """Monotonic time and waiting, as the parts of a host instance use them."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass; whether it is set."""
        ...

    def wait_on(self, condition: threading.Condition, timeout: float) -> bool:
        """``condition.wait(timeout)``, its lock held by the caller."""
        ...


class SystemClock:
    """The process's monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)

    def wait_on(self, condition: threading.Condition, timeout: float) -> bool:
        return condition.wait(timeout)


class ManualClock:
    """A clock a test moves: :meth:`advance` moves it on, and a wait or a sleep returns
    at once, having moved it on by its timeout (not at all when its event is set)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            return event.wait()
        self.advance(timeout)
        return event.is_set()

    def wait_on(self, condition: threading.Condition, timeout: float) -> bool:
        self.advance(timeout)
        return False


SYSTEM = SystemClock()
_current: Clock = SYSTEM


def current() -> Clock:
    """The clock host instances built now are given (the system's, unless :func:`use`)."""
    return _current


@contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Give host instances built meanwhile ``clock`` (a test driving time)."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous
