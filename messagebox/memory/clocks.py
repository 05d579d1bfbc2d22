"""The in-memory store's time: a :class:`Clock` gives wall time (what the SQL stores
read from the database) and monotonic time. :class:`SystemClock` reads this process's
clock (:mod:`messagebox.clock`); :class:`ManualClock` is set by a test, both readings
moving together with :meth:`ManualClock.advance`."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from messagebox.clock import local_now


class Clock(Protocol):
    """A source of wall time (UTC) and of monotonic seconds."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """This process's clock."""

    def now(self) -> datetime:
        return local_now()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told: wall and monotonic time advance together.
    Callable, it is a :data:`messagebox.clock.LocalClock` too (``clock.use_local``)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._at = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._mono = 1000.0

    def now(self) -> datetime:
        with self._lock:
            return self._at

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def __call__(self) -> datetime:
        return self.now()

    def advance(self, seconds: float) -> None:
        """Move both readings ``seconds`` on (never back)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._lock:
            self._at += timedelta(seconds=seconds)
            self._mono += seconds

    def set(self, at: datetime) -> None:
        """Set the wall time (it may jump either way, as a machine's can); the monotonic
        time moves on by the same amount if forward."""
        with self._lock:
            ahead = (at - self._at).total_seconds()
            self._at = at
            self._mono += max(ahead, 0.0)
