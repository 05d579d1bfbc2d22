"""A host instance's dequeue threads: those running the dequeue loop, and those whose
handler was abandoned past its time-out and still runs (Python cannot stop a thread:
they end when their handler returns)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.timing import Clock

JOIN_SLICE_SECONDS = 0.05
"""How often a stop waiting for a dequeue thread looks again at which are left."""


class DequeueThreads:
    """Starts, replaces and joins the dequeue threads; owns the lists of running and of
    abandoned threads."""

    def __init__(
        self,
        target: Callable[[], None],
        count: int,
        stats: InstanceStats,
        clock: Clock,
        events: InstanceLog,
    ) -> None:
        self._target = target
        self._count = count
        self._stats = stats
        self._clock = clock
        self._events = events
        self._lock = threading.Lock()
        self._running: list[threading.Thread] = []
        """The dequeue threads (one that timed out or failed is replaced here)."""
        self._abandoned: list[threading.Thread] = []
        """Threads whose handler was abandoned and still runs."""
        self._replacements = 0

    def start(self) -> None:
        """Start ``dequeue_threads`` threads."""
        with self._lock:
            for n in range(self._count):
                t = threading.Thread(
                    target=self._target, name=f"{self._events.host}-dequeue-{n}", daemon=True
                )
                self._running.append(t)
            started = list(self._running)
        for t in started:
            t.start()

    def running(self) -> list[threading.Thread]:
        """The threads running the dequeue loop (alive or not, until replaced)."""
        with self._lock:
            return list(self._running)

    def abandon(self, thread: threading.Thread) -> None:
        """``thread``'s handler was abandoned: it no longer counts as running."""
        with self._lock:
            if thread in self._running:
                self._running.remove(thread)
                self._abandoned.append(thread)

    def replace_ended(self, stopping: threading.Event) -> tuple[int, int] | None:
        """Replace dequeue threads that failed or whose handler was abandoned. Abandoned
        handlers still running count too, up to ``dequeue_threads`` of them: one more,
        and the instance has no thread left to give (a dependency that hangs every call
        must not grow the threads without bound). Returns None, or when it is short of
        threads, how many it wants and how many abandoned ones still run."""
        with self._lock:
            if stopping.is_set():
                return None
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            for t in [t for t in self._running if not t.is_alive()]:
                self._running.remove(t)
                log.warning(
                    "host instance %s: dequeue thread %s ended",
                    self._events.instance,
                    t.name,
                    extra=self._events.fields("thread-ended", dequeue_thread=t.name),
                )
            want = self._count
            running = len(self._running)
            room = min(want - running, 2 * want - running - len(self._abandoned))
            for _ in range(max(room, 0)):
                self._start_replacement()
            short = len(self._running) < want
            abandoned = len(self._abandoned)
        return (want, abandoned) if short else None

    def _start_replacement(self) -> None:
        self._replacements += 1
        t = threading.Thread(
            target=self._target,
            name=f"{self._events.host}-dequeue-r{self._replacements}",
            daemon=True,
        )
        t.start()
        self._running.append(t)
        self._stats.add(threads_replaced=1)
        log.warning(
            "host instance %s: started dequeue thread %s",
            self._events.instance,
            t.name,
            extra=self._events.fields("thread-started", dequeue_thread=t.name),
        )

    def join(self, deadline: float) -> bool:
        """Wait for the dequeue threads to end, until ``deadline`` (the clock's); whether
        they did. A thread whose handler is abandoned meanwhile is not waited for."""
        while True:
            live = [t for t in self.running() if t.is_alive()]
            left = deadline - self._clock.monotonic()
            if not live or left <= 0:
                return not live
            live[0].join(min(left, JOIN_SLICE_SECONDS))
