"""Host instances on the in-memory store (:class:`~messagebox.memory.MemoryBox`), their
time one :class:`~messagebox.manual_clock.ManualClock`: the store's, this process's time
of day and the hosts' waits. Nothing here sleeps: a test moves the clock where time must
pass, and waits (in real time, :func:`tests.conftest.wait_for`) for what follows."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from messagebox import clock as wall
from messagebox.hosts import Delivery, HostInstance, timing
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.message import Message
from messagebox.predicates import P
from tests.conftest import wait_for

SETTINGS: dict[str, Any] = {
    "poll_min_seconds": 0.05,
    "poll_max_seconds": 2.0,
    "retry_backoff_seconds": 1.0,
    "lease_seconds": 10.0,
    "heartbeat_seconds": 1.0,
    "dead_after_seconds": 3.0,
    "cleanup_interval_seconds": 0.0,
    "handler_timeout_seconds": 60.0,
}
"""The host's settings: the manual clock makes each of them exact, none need be short."""

Start = Callable[..., HostInstance]


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    """One manual clock for the store, the process's time of day and the hosts."""
    c = ManualClock()
    with timing.use(c), wall.use_local(c):
        yield c


@pytest.fixture
def box(clock: ManualClock) -> MemoryBox:
    """A memory box with host ``h``, its subscription ``s`` to service ``svc`` taking
    every message with ``t.N``."""
    b = MemoryBox(clock=clock, publisher="tests")
    b.create_host("h", **SETTINGS)
    return b


@pytest.fixture
def start(box: MemoryBox) -> Iterator[Start]:
    """Start host instances of ``h`` (services, then settings); all stopped after."""
    started: list[HostInstance] = []

    def run(services: dict[str, object], **settings: object) -> HostInstance:
        inst = HostInstance(box, "h", services, settings=settings or None).start()
        started.append(inst)
        return inst

    yield run
    for inst in reversed(started):
        inst.stop(5.0)


def msgs(n: int, start: int = 0, **extra: object) -> list[Message]:
    return [
        Message(f"body {i}".encode(), promoted={"t.N": i, **extra}) for i in range(start, start + n)
    ]


def drained(box: MemoryBox) -> Callable[[], bool]:
    """Whether the queue is empty (every entry completed, suspended or dropped)."""
    return lambda: not box.store.entries()


def settled(clock: ManualClock, *instances: HostInstance, busy: int = 0) -> None:
    """Wait until every thread of ``instances`` (dequeue threads, housekeeper,
    supervisor, timer loop) but ``busy`` ones (in a handler that waits) waits for the
    clock, none whose wait the clock ended still on its way back: they have looked and
    found nothing to do until the clock moves. Move the clock only then: a thread between
    two waits would start its next one from the moved clock, missing what fell due. (Not
    a proof of quiet right after a publish, whose wake-up a thread still counted as
    waiting may not have acted on yet.)"""
    threads = sum(i.settings.dequeue_threads + len(i._service_threads) for i in instances)
    wait_for(
        lambda: clock.waiting()[0] >= threads - busy,
        what=f"{threads - busy} threads waiting for the clock",
        timeout=10,
    )


class Recorder:
    """A thread-safe service that records (subscription, ``t.N``, attempt, clock time)
    of each delivery; ``fail(d)`` true raises; it counts deliveries running at once."""

    def __init__(self, clock: ManualClock, fail: Callable[[Delivery], bool] | None = None) -> None:
        self.clock = clock
        self.fail = fail
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, int]] = []
        self.at: list[float] = []
        self.running = 0
        self.most = 0

    def __call__(self, d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        assert d.body == f"body {n}".encode()
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.seen.append((d.subscription.name, n, d.attempt))
            self.at.append(self.clock.monotonic())
        try:
            if self.fail is not None and self.fail(d):
                raise RuntimeError(f"refused {n}")
        finally:
            with self.lock:
                self.running -= 1

    def numbers(self) -> list[int]:
        with self.lock:
            return [n for _, n, _ in self.seen]

    def attempts(self) -> list[int]:
        with self.lock:
            return [a for *_, a in self.seen]


def subscribe_all(box: MemoryBox, **options: Any) -> None:
    """Subscription ``s`` of service ``svc`` to every message with ``t.N``."""
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s", **options)
