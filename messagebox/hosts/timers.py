"""A host instance's timer loop (where it runs service instances): it fires the host's
due timers (service instances' timeouts), sleeping until the next is due, or until a
step in this process sets one due sooner."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from messagebox import clock as wall_clock
from messagebox.errors import MessageBoxError
from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.events import InstanceLog
from messagebox.hosts.timing import Clock
from messagebox.models import HostSettings

TIMERS_LOOK_SECONDS = 60.0
"""Where every timer is set by a step in this process (DuckDB: one process), which
wakes the timer loop when it sets one due sooner than the loop looks, the loop looks
at the timers at most this long apart (rather than every ``poll_max_seconds``): a look
cost a statement, 11% of the statement time of a ``bench.orchestrate`` run that set no
timers."""


class TimerQueue(Protocol):
    """What the timer loop needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    @property
    def timers_set_here(self) -> bool: ...

    def next_due(self) -> float | None: ...

    def fire_timers(self) -> Counter[str]: ...

    def timer_set_before(self, at: float) -> bool: ...

    def watch_timers(self, wake: Callable[[], None]) -> Callable[[], None]: ...


class TimerLoop:
    """Owns when the loop looks next and the event that wakes it sooner."""

    def __init__(
        self,
        queue: TimerQueue,
        settings: HostSettings,
        stats: InstanceStats,
        *,
        clock: Clock,
        stopping: threading.Event,
        events: InstanceLog,
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._stats = stats
        self._clock = clock
        self._stopping = stopping
        self._events = events
        self.wake_event = threading.Event()
        """Set to make the loop look now."""
        self.look_at = math.inf
        """When the loop looks next (seconds since the epoch; inf while it looks)."""
        self._unwatch: Callable[[], None] | None = None

    def watch(self) -> None:
        """Be woken when a step in this process sets a timer (:meth:`timer_set`)."""
        self._unwatch = self._queue.watch_timers(self.timer_set)

    def unwatch(self) -> None:
        if self._unwatch is not None:
            self._unwatch()

    def wake(self) -> None:
        """Look now (the instance stops)."""
        self.wake_event.set()

    def timer_set(self) -> None:
        """A step in this process set timers: look again, unless the loop looks before
        the earliest is due anyway."""
        if self._queue.timer_set_before(self.look_at):
            self.wake_event.set()

    def run(self) -> None:
        """Fire the due timers; sleep until the next is due, at most
        ``poll_max_seconds`` (another process may set one; else
        :data:`TIMERS_LOOK_SECONDS`), or until a step in this process sets one due
        sooner."""
        longest = self._settings.poll_max_seconds
        if self._queue.timers_set_here:
            longest = max(longest, TIMERS_LOOK_SECONDS)
        while not self._stopping.is_set():
            self.look_at = math.inf  # looking: any timer set now wakes it
            wait = self._fire_due(longest)
            if wait is None:
                continue
            look_at = wall_clock.local_now().timestamp() + wait
            self.look_at = look_at
            if not self._queue.timer_set_before(look_at):  # none due sooner set meanwhile
                self._clock.wait(self.wake_event, wait)
            self.wake_event.clear()
            # steps that set timers wake this loop; look again at most this often
            self._clock.wait(self._stopping, self._settings.poll_min_seconds)

    def _fire_due(self, longest: float) -> float | None:
        """Fire the timers due now; how long to wait for the next (None: some fired,
        look again at once)."""
        wait = longest
        try:
            due = self._queue.next_due()
            if due is not None and due <= 0:
                hosts = self._queue.fire_timers()
                if hosts:
                    self._stats.add(timers_fired=sum(hosts.values()))
                    return None
            if due is not None:
                wait = min(wait, max(due, self._settings.poll_min_seconds))
        except MessageBoxError as exc:
            self._events.store_failed("firing timers", exc, "timers-failed")
        return wait
