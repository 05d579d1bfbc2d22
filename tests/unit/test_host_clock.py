"""The parts of a host instance read time from the clock they are given
(:mod:`messagebox.hosts.timing`): a test drives it, and nothing waits for real."""

from __future__ import annotations

import threading
import uuid

import pytest

from messagebox.claims import Claim
from messagebox.errors import BackendUnavailable
from messagebox.hosts import timing
from messagebox.hosts.dispatch import InstanceStats, Run
from messagebox.hosts.events import InstanceLog
from messagebox.hosts.idle import Idleness
from messagebox.hosts.recording import RECORD_TRIES, OutcomeRecorder
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.supervisor import Supervisor
from messagebox.hosts.threads import DequeueThreads
from messagebox.hosts.timing import ManualClock
from messagebox.models import HostSettings, Subscription
from messagebox.outcomes import Outcomes, Recorded

EVENTS = InstanceLog("h@test", "h")


class NoSubscriptions:
    def subscriptions(self, *, host: str | None = None) -> list[Subscription]:
        return []


class FailingQueue:
    """A store that cannot record anything."""

    def __init__(self) -> None:
        self.tries = 0

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> Recorded:
        self.tries += 1
        raise BackendUnavailable("the store is gone")


def claim(n: int) -> Claim:
    return Claim(n, uuid.uuid4(), 1, 1, 0, None, False)


def recorder(queue: FailingQueue, clock: ManualClock, settings: HostSettings) -> OutcomeRecorder:
    subs = HostSubscriptions(NoSubscriptions(), "h", {}, uses_instances=False, events=EVENTS)
    return OutcomeRecorder(queue, settings, subs, InstanceStats(), clock, EVENTS)


def test_outcomes_are_tried_again_after_pauses_then_kept_until_their_leases_lapse() -> None:
    clock, queue = ManualClock(waits_advance=True), FailingQueue()  # one thread: sleeps move it
    settings = HostSettings(lease_seconds=10.0)
    outcomes = recorder(queue, clock, settings)
    start = clock.monotonic()
    outcomes.record_batch([claim(1)], [], [])
    assert queue.tries == RECORD_TRIES
    assert clock.monotonic() - start == pytest.approx(0.05 + 0.1 + 0.2 + 0.4)  # slept
    assert outcomes.has_unwritten()
    clock.advance(5.0)  # within the lease: kept
    outcomes.retry_unwritten()
    assert outcomes.has_unwritten()
    clock.advance(5.0)  # past it: given up (the entries are delivered again)
    outcomes.retry_unwritten()
    assert not outcomes.has_unwritten()


class HeldNowhere:
    def __init__(self) -> None:
        self.asked = 0

    def held_elsewhere(self) -> bool:
        self.asked += 1
        return False


def test_idleness_counts_the_clocks_seconds_and_asks_the_store_once_a_second() -> None:
    clock, queue = ManualClock(), HeldNowhere()
    idle = Idleness(queue, clock, busy=lambda: False)
    assert idle.seconds() == 0.0  # no empty claim yet
    idle.found_nothing()
    clock.advance(3.0)
    assert idle.seconds() == 3.0
    assert idle.seconds() == 3.0
    assert queue.asked == 1
    clock.advance(1.0)
    assert idle.seconds() == 4.0
    assert queue.asked == 2
    idle.found_work()
    assert idle.seconds() == 0.0


class OneRun:
    def __init__(self, run: Run) -> None:
        self.runs = [run]
        self.released: list[Run] = []

    def in_hand(self) -> list[Run]:
        return list(self.runs)

    def release(self, run: Run) -> None:
        self.runs.remove(run)
        self.released.append(run)


def test_the_supervisor_abandons_a_handler_once_the_clock_passes_its_time_out() -> None:
    clock, queue = ManualClock(waits_advance=True), FailingQueue()  # one thread: sleeps move it
    settings = HostSettings(handler_timeout_seconds=2.0, dequeue_threads=1)
    stats = InstanceStats()
    run = Run([claim(1), claim(2)], clock=clock)
    run.begin_one(run.claims[0], settings.handler_timeout_seconds)
    batches = OneRun(run)
    threads = DequeueThreads(lambda: None, 1, stats, clock, EVENTS)
    subs = HostSubscriptions(NoSubscriptions(), "h", {}, uses_instances=False, events=EVENTS)
    supervisor = Supervisor(
        settings,
        batches,
        threads,
        recorder(queue, clock, settings),
        subs,
        (),
        stats,
        EVENTS,
        clock=clock,
        stopping=threading.Event(),
        workers_ended=threading.Event(),
        on_exhausted=lambda: None,
    )
    supervisor._abandon_overdue()
    assert not run.abandoned  # its time is not up
    clock.advance(2.5)
    supervisor._abandon_overdue()
    assert run.abandoned
    assert batches.released == [run]
    assert stats.snapshot()["timed_out"] == 1
    assert queue.tries == RECORD_TRIES  # its outcomes were recorded (the store failing)


def test_instances_built_meanwhile_are_given_the_clock_a_test_uses() -> None:
    clock = ManualClock()
    assert timing.current() is timing.SYSTEM
    with timing.use(clock):
        assert timing.current() is clock
    assert timing.current() is timing.SYSTEM
