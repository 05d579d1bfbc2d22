"""How long an idle dequeue thread waits before it claims again: its back-off
(``poll_min_seconds``, doubling on each empty claim up to ``poll_max_seconds``), or
less when an entry of its host becomes due sooner (scheduled, or waiting for its
retry), so that it is claimed within ``poll_min_seconds`` of its time rather than up
to ``poll_max_seconds`` late (docs/concepts.md: Scheduled delivery); and how long an
instance has had nothing to do."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Protocol

from messagebox.errors import MessageBoxError
from messagebox.hosts.timing import Clock
from messagebox.models import HostSettings

SLACK_SECONDS = 0.001
"""Waited past an entry's due time: the claim that follows finds it due."""


class NextDue:
    """The host's next due time as an instance's idle threads share it."""

    def __init__(
        self, lookup: Callable[[], float | None], settings: HostSettings, clock: Clock
    ) -> None:
        self._lookup = lookup
        self._clock = clock
        """Seconds until the host's next entry is due, or None (one query)."""
        self._floor = settings.poll_min_seconds
        self._keep = settings.poll_max_seconds
        self._lock = threading.Lock()
        self._known: tuple[int, float | None, float] | None = None
        """(wake-ups seen, when the next is due, when that was read), monotonic."""

    def wait(self, idle: float, seen: int) -> float:
        """``idle``, or the seconds until the host's next entry is due when that is
        sooner. Looked up only for a wait longer than ``poll_min_seconds``; the answer
        serves the instance's threads until a wake-up (``seen``: the wake-ups counted
        before the claim that found nothing), until the time it names, or for
        ``poll_max_seconds``. A lookup that fails leaves the back-off as it is."""
        if idle <= self._floor:
            return idle
        now = self._clock.monotonic()
        with self._lock:
            known = self._known
        if known is not None and known[0] == seen and now - known[2] < self._keep:
            at = known[1]
            if at is None:
                return idle
            if at > now:
                return min(idle, at - now + SLACK_SECONDS)
        try:
            left = self._lookup()
        except MessageBoxError:
            return idle
        at = None if left is None else now + left
        with self._lock:
            self._known = (seen, at, now)
        return idle if left is None else min(idle, left + SLACK_SECONDS)


class HeldElsewhere(Protocol):
    """What idleness needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    def held_elsewhere(self) -> bool: ...


ELSEWHERE_SECONDS = 1.0
"""How long the store's answer to whether another process holds entries serves."""


class Idleness:
    """Since when the instance's claims came back empty, and whether another process
    holds entries of its host (as last asked)."""

    def __init__(self, queue: HeldElsewhere, clock: Clock, busy: Callable[[], bool]) -> None:
        self._queue = queue
        self._clock = clock
        self._busy = busy
        """Whether a batch is in hand, claimed ahead or being claimed."""
        self.empty_since: float | None = None
        """Since when claims come back empty (monotonic); None while there is work."""
        self._elsewhere_checked: tuple[float, bool] = (-math.inf, False)  # when, and what

    def found_work(self) -> None:
        self.empty_since = None

    def found_nothing(self) -> None:
        if self.empty_since is None:
            self.empty_since = self._clock.monotonic()

    def seconds(self) -> float:
        """How long the instance has had nothing to do: its claims came back empty and
        no batch is in hand (0.0 while it has work, and until its first empty claim),
        and no other process holds entries of its host (one at work, or one that ended,
        whose leases come to this one after ``dead_after_seconds``). An entry waiting
        for its retry, or a timer not yet due, is not work yet."""
        since = self.empty_since
        if since is None or self._busy() or self._held_elsewhere():
            return 0.0
        return max(0.0, self._clock.monotonic() - since)

    def _held_elsewhere(self) -> bool:
        """Whether another process holds entries of the host (asked of the store at most
        once a second; a store that cannot say is taken to say yes)."""
        now = self._clock.monotonic()
        if now - self._elsewhere_checked[0] >= ELSEWHERE_SECONDS:
            try:
                held = self._queue.held_elsewhere()
            except MessageBoxError:
                held = True
            self._elsewhere_checked = (now, held)
        return self._elsewhere_checked[1]
