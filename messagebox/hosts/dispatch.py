"""What a host instance's threads share while they deliver (see :mod:`messagebox.hosts.instance`):
the claimed batch in hand (:class:`Run`, which the supervisor takes over when a handler
times out), the per-process slot for interrupted entries, permits, and counters.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from messagebox.claims import Claim, Failure
from messagebox.hosts.service import MessageBatch
from messagebox.hosts.timing import SYSTEM, Clock
from messagebox.outcomes import Outcomes


class Settled:
    """A delivery the service completed itself (an orchestration step)."""


class Done:
    """A delivery its service handled: completed with the batch."""


SETTLED = Settled()
DONE = Done()


class Abandoned(Exception):
    """The supervisor took this batch over (a handler timed out): drop it."""


class Run:
    """A claimed batch a dequeue thread handles, shared with the supervisor, which takes
    it over when a handler runs past its time-out."""

    def __init__(self, claims: list[Claim], *, timed: bool = True, clock: Clock = SYSTEM) -> None:
        self.claims = claims
        self._clock = clock
        self._timed = timed
        """Whether its handlers have a time-out: without one it is never abandoned, and
        one delivery's bookkeeping takes no lock."""
        self.worker = threading.current_thread()
        self.abandoned = False
        self._lock = threading.Lock()
        self._done: list[Claim] = []
        self._failed: list[Failure] = []
        self._seen: set[int] = set()  # handed to a handler, or given an outcome
        self._current: list[Claim] = []
        self._deadline: float | None = None

    def begin(self, claims: list[Claim], seconds: float | None) -> None:
        """A handler starts on these claims; it has ``seconds`` (None: no limit)."""
        with self._lock:
            if self.abandoned:
                raise Abandoned
            self._current = claims
            self._seen.update(c.id for c in claims)
            self._deadline = None if seconds is None else self._clock.monotonic() + seconds

    def begin_one(self, c: Claim, seconds: float | None) -> None:
        """:meth:`begin` for one claim (the hot path)."""
        if not self._timed:
            self._seen.add(c.id)  # nothing else reads it meanwhile: never abandoned
            return
        with self._lock:
            if self.abandoned:
                raise Abandoned
            self._current = [c]
            self._seen.add(c.id)
            self._deadline = None if seconds is None else self._clock.monotonic() + seconds

    def end_with(self, c: Claim, outcome: Settled | Done) -> None:
        """:meth:`end` then :meth:`add` of a success, under one lock: no time-out can
        fall between them (the deadline goes with the end)."""
        if not self._timed:
            if isinstance(outcome, Done):
                self._done.append(c)
            return
        with self._lock:
            self._current = []
            self._deadline = None
            if self.abandoned:
                raise Abandoned
            if isinstance(outcome, Done):
                self._done.append(c)

    def end(self) -> None:
        """The handler returned; raises ``Abandoned`` if it was too late."""
        with self._lock:
            self._current = []
            self._deadline = None
            if self.abandoned:
                raise Abandoned

    def add(self, c: Claim, outcome: Failure | Settled | Done) -> None:
        self.add_many([(c, outcome)])

    def add_many(self, outcomes: Sequence[tuple[Claim, Failure | Settled | Done]]) -> None:
        """Hold outcomes, all or (when abandoned) none."""
        with self._lock:
            if self.abandoned:
                raise Abandoned
            for c, outcome in outcomes:
                self._seen.add(c.id)
                if isinstance(outcome, Failure):
                    self._failed.append(outcome)
                elif isinstance(outcome, Done):
                    self._done.append(c)

    def unseen(self) -> list[Claim]:
        """The claims never handed to a handler nor given an outcome."""
        with self._lock:
            return [c for c in self.claims if c.id not in self._seen]

    def take(self) -> tuple[list[Claim], list[Failure]]:
        """The outcomes held so far, to record them."""
        with self._lock:
            if self.abandoned:
                raise Abandoned
            done, failed = self._done, self._failed
            self._done, self._failed = [], []
            return done, failed

    def abandon_if_overdue(
        self, now: float
    ) -> tuple[list[Claim], list[Claim], list[Failure], list[Claim]] | None:
        """If its handler is past its deadline, abandon the batch and return the timed
        out claims, the outcomes held, and the claims never started."""
        with self._lock:
            if self.abandoned or self._deadline is None or now < self._deadline:
                return None
            self.abandoned = True
            current = {c.id for c in self._current}
            unstarted = [c for c in self.claims if c.id not in self._seen]
            timed_out = [c for c in self.claims if c.id in current]
            return timed_out, self._done, self._failed, unstarted


class OneAtATime:
    """Held by the one batch of a process delivering an interrupted entry (so that a
    process that ends meanwhile charges that entry and no other interrupted one)."""

    def __init__(self) -> None:
        self._owner: Run | None = None
        self._cond = threading.Condition()

    def acquire(self, run: Run, wait: float, clock: Clock) -> bool:
        """Take it, waiting at most ``wait`` seconds for another batch to let it go."""
        deadline = clock.monotonic() + wait
        with self._cond:
            while self._owner is not None and self._owner is not run:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return False
                clock.wait_on(self._cond, left)
            self._owner = run
            return True

    def release(self, run: Run) -> None:
        with self._cond:
            if self._owner is run:
                self._owner = None
                self._cond.notify_all()


ALONE = OneAtATime()
"""One per process: every host instance in it shares it."""

ALONE_WAIT_SECONDS = 1.0
"""How long an interrupted entry waits for another to finish before it is given back
(still interrupted) for a later claim, here or by another instance."""


@dataclass
class Pending:
    """Outcomes that could not be written, kept to be written later."""

    outcomes: Outcomes
    since: float


@dataclass
class Counters:
    """Thread-safe counters: subclasses declare them as ``int`` fields."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


@dataclass
class InstanceStats(Counters):
    """Counters of one host instance (read them any time; they only grow)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    """Handler errors (each is retried or suspended)."""
    retried: int = 0
    suspended: int = 0
    redelivered: int = 0
    """Claims of an entry delivered before (attempt > 1): a retry or a lost lease."""
    lost_leases: int = 0
    """Completions or failures that found the entry leased by another instance."""
    given_back: int = 0
    zombies: int = 0
    """Messages that reached a completed service instance (suspended, not resumable)."""
    timers_fired: int = 0
    timed_out: int = 0
    """Handlers abandoned past ``handler_timeout_seconds`` (their entries failed)."""
    crashed: int = 0
    """Entries suspended because host processes ended while handling them."""
    engine_failures: int = 0
    """Deliveries failed by the store, not the service (retried, not charged)."""
    threads_replaced: int = 0
    """Dequeue threads replaced (their handler timed out, or the thread failed)."""
    expired: int = 0
    """Entries of the host that expired before delivery (suspended or dropped)."""


class Permits:
    """At most ``max_in_flight`` claimed-but-unfinished entries per instance."""

    def __init__(self, n: int, clock: Clock = SYSTEM) -> None:
        self._n = n
        self._clock = clock
        self._free = n
        self._cond = threading.Condition()

    def taken(self) -> int:
        """Permits taken now (entries claimed or being claimed, not yet finished)."""
        return self._n - self._free

    def take(
        self,
        most: int,
        stopping: threading.Event,
        *,
        wait: bool = True,
        unless: Callable[[], bool] | None = None,
    ) -> int:
        """Up to ``most`` permits, waiting for one unless ``wait`` is False (or
        stopping, or ``unless()``: checked again on each :meth:`recheck_waiters`)."""
        with self._cond:
            while (
                wait
                and self._free == 0
                and not stopping.is_set()
                and not (unless is not None and unless())
            ):
                self._clock.wait_on(self._cond, 0.2)
            n = min(most, self._free)
            self._free -= n
            return n

    def give(self, n: int) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify_all()

    def recheck_waiters(self) -> None:
        """Wake the threads waiting for a permit to check their ``unless`` again."""
        with self._cond:
            self._cond.notify_all()


class Pace:
    """Entries a host instance's threads finished over the last ``window`` seconds:
    how much work claimed ahead would wait for a thread, at that pace."""

    def __init__(self, window: float = 1.0, clock: Clock = SYSTEM) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._finished: deque[tuple[float, int]] = deque()
        self._total = 0
        self.begin()

    def begin(self) -> None:
        """Start pacing now (a young instance's pace is over its life so far)."""
        with self._lock:
            self._since = self._clock.monotonic()
            self._finished.clear()
            self._total = 0

    def add(self, n: int) -> None:
        now = self._clock.monotonic()
        with self._lock:
            self._finished.append((now, n))
            self._total += n
            self._trim(now)

    def per_second(self) -> float:
        now = self._clock.monotonic()
        with self._lock:
            self._trim(now)
            return self._total / max(min(self._window, now - self._since), 0.05)

    def _trim(self, now: float) -> None:
        while self._finished and self._finished[0][0] < now - self._window:
            self._total -= self._finished.popleft()[1]


class SharedReads:
    """Batches of one claim that read their messages together (one query for several
    batches), each until a thread takes it up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # by id(batch), with the batch itself: held here, its id names no other list
        self._of: dict[int, tuple[list[Claim], MessageBatch]] = {}

    def share(self, batches: list[list[Claim]], read: MessageBatch) -> None:
        with self._lock:
            for batch in batches:
                self._of[id(batch)] = (batch, read)

    def take(self, batch: list[Claim]) -> MessageBatch | None:
        """The read ``batch`` shares, if any (once)."""
        with self._lock:
            held = self._of.pop(id(batch), None)
        return None if held is None else held[1]
