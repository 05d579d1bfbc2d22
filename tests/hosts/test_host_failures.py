"""A host instance on the memory store fails, retries and suspends as on SQL: retries
back off by the clock and stop at ``max_attempts``; a permanent failure is not retried;
the supervisor abandons a handler past its time-out, once the clock passes it."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from messagebox.errors import PermanentFailure
from messagebox.hosts import Delivery
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.models import DELIVERY_FAILURE
from tests.conftest import wait_for
from tests.hosts.conftest import Recorder, Start, drained, msgs, settled, subscribe_all


def test_retries_back_off_by_the_clock_then_suspend_after_max_attempts(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    rec = Recorder(clock, fail=lambda d: True)
    inst = start({"svc": rec}, max_attempts=3, dequeue_threads=1)
    t0 = clock.monotonic()
    [routed] = box.publish(msgs(1))
    wait_for(lambda: len(rec.seen) == 1, what="the first attempt")
    settled(clock, inst)  # recorded: waiting for its back-off (1 s)
    [entry] = box.store.entries()
    assert entry.attempts == 1
    assert entry.lease_expires is None
    assert entry.available_at == box.store.later(1.0)
    clock.advance(0.9)
    settled(clock, inst)  # the thread looked again (or slept on): nothing before its time
    assert len(rec.seen) == 1
    clock.advance(0.11)
    wait_for(lambda: len(rec.seen) == 2, what="the second attempt")
    settled(clock, inst)
    clock.advance(1.9)  # the second back-off: 2 s
    settled(clock, inst)
    assert len(rec.seen) == 2
    clock.advance(0.11)
    wait_for(lambda: len(box.store.suspended()) == 1, what="the suspension")
    [suspended] = box.store.suspended()
    assert suspended.reason == DELIVERY_FAILURE
    assert suspended.resumable
    assert suspended.attempts == 3
    assert "RuntimeError: refused 0" in suspended.error
    assert suspended.msg == routed.message_id
    assert rec.attempts() == [1, 2, 3]
    # each attempt when the clock first passed its back-off, never before
    assert [at - t0 for at in rec.at] == pytest.approx([0.0, 1.01, 3.02])
    assert box.store.entries() == []
    wait_for(lambda: inst.stats.snapshot()["suspended"] == 1, what="the suspension counted")
    assert inst.stats.snapshot()["retried"] == 2


def test_a_permanent_failure_suspends_without_retry(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    tries: list[int] = []

    def refuse(d: Delivery) -> None:
        tries.append(d.attempt)
        raise PermanentFailure("order has no lines")

    start({"svc": refuse})
    box.publish(msgs(1))
    wait_for(lambda: len(box.store.suspended()) == 1, what="the suspension")
    [entry] = box.store.suspended()
    assert entry.attempts == 1
    assert "order has no lines" in entry.error
    assert tries == [1]
    assert box.store.entries() == []


class Hanging:
    """A service whose deliveries of ``t.N`` ``hang`` wait until released."""

    def __init__(self, hang: int) -> None:
        self.hang = hang
        self.lock = threading.Lock()
        self.attempts: Counter[int] = Counter()
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        with self.lock:
            self.attempts[n] += 1
        if n == self.hang:
            self.entered.release()
            self.release.wait(30)


def retry_recorded(box: MemoryBox, attempts: int) -> bool:
    """Whether an entry has failed ``attempts`` times and waits for its retry."""
    return any(e.attempts == attempts and e.lease_expires is None for e in box.store.entries())


def test_a_hung_handler_is_abandoned_once_the_clock_passes_its_time_out(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    service = Hanging(hang=2)
    try:
        inst = start(
            {"svc": service},
            dequeue_threads=2,
            claim_batch=10,
            handler_timeout_seconds=5.0,
            max_attempts=2,
        )
        box.publish(msgs(10))
        assert service.entered.acquire(timeout=10)
        settled(clock, inst, busy=1)
        clock.advance(4.5)  # its time is not up: the handler is left alone
        settled(clock, inst, busy=1)
        assert inst.stats.snapshot()["timed_out"] == 0
        clock.advance(1.0)  # past 5 s: abandoned, its entry fails, its batch goes on
        wait_for(lambda: retry_recorded(box, 1), what="the first time-out recorded")
        assert inst.stats.snapshot()["timed_out"] == 1
        settled(clock, inst)  # the abandoned thread is replaced: it counts no more
        clock.advance(1.01)  # past its retry's back-off
        assert service.entered.acquire(timeout=10)  # delivered again: hangs again
        settled(clock, inst, busy=1)
        clock.advance(5.5)
        wait_for(drained(box), what="every entry completed or suspended")
        [entry] = box.store.suspended()
        assert entry.reason == DELIVERY_FAILURE
        assert "did not return within 5 s" in entry.error
        assert entry.attempts == 2
        assert service.attempts[2] == 2
        assert all(service.attempts[n] == 1 for n in range(10) if n != 2)
        wait_for(lambda: inst.stats.snapshot()["completed"] == 9, what="9 completions counted")
        wait_for(
            lambda: inst.stats.snapshot()["threads_replaced"] == 2, what="both threads replaced"
        )
        assert inst.stats.snapshot()["timed_out"] == 2
    finally:
        service.release.set()
