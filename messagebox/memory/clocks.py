"""The in-memory store's time: a :class:`Clock` gives wall time (what the SQL stores
read from the database) and monotonic time. :class:`SystemClock` reads this process's
clock (:mod:`messagebox.clock`); :class:`~messagebox.manual_clock.ManualClock` is set by
a test, the one clock that also drives the process's time of day and the hosts' waits."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Protocol

from messagebox.clock import local_now
from messagebox.manual_clock import ManualClock

__all__ = ["Clock", "ManualClock", "SystemClock"]


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
