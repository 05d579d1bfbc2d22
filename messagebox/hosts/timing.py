"""The hosts' monotonic clock: how long things take and how long to wait (lease
deadlines, handler time-outs, back-offs, heartbeats), as opposed to the time of day
(:mod:`messagebox.clock`). Every part of a host instance is given one, so that a test
can drive time: the one module under ``hosts/`` that reads ``time.monotonic`` or calls
``time.sleep`` (``tests/structure.py`` checks).

    clock = timing.current()        # the system's, unless a test set another
    deadline = clock.monotonic() + 5.0
    clock.wait(stopping, 1.0)       # Event.wait(1.0), as the clock measures it

A test drives it with :class:`~messagebox.manual_clock.ManualClock` (re-exported here),
whose waits end when the test moves it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from messagebox.manual_clock import ManualClock

__all__ = ["SYSTEM", "Clock", "ManualClock", "SystemClock", "current", "use"]


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
