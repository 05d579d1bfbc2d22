"""How long an idle dequeue thread waits before it claims again: its back-off
(``poll_min_seconds``, doubling on each empty claim up to ``poll_max_seconds``), or
less when an entry of its host becomes due sooner (scheduled, or waiting for its
retry), so that it is claimed within ``poll_min_seconds`` of its time rather than up
to ``poll_max_seconds`` late (docs/concepts.md: Scheduled delivery)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from messagebox.errors import MessageBoxError
from messagebox.models import HostSettings

SLACK_SECONDS = 0.001
"""Waited past an entry's due time: the claim that follows finds it due."""


class NextDue:
    """The host's next due time as an instance's idle threads share it."""

    def __init__(self, lookup: Callable[[], float | None], settings: HostSettings) -> None:
        self._lookup = lookup
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
        now = time.monotonic()
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
