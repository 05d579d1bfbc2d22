"""Leases of host instances on the memory store, driven by the clock: registration and
heartbeats; heartbeats keep the leases of entries in flight; a lapsed lease is
redelivered and its first holder's outcome lost; an instance that vanished is declared
dead after ``dead_after_seconds`` and its entries redelivered, charged when they had
started; a graceful stop waits for its handlers and gives back what it had not begun."""

from __future__ import annotations

import os
import threading
from collections import Counter
from datetime import timedelta

from messagebox.hosts import Delivery
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.models import CRASHED_HOST, InstanceInfo
from tests.conftest import Stalled, wait_for
from tests.hosts.conftest import Recorder, Start, drained, msgs, settled, subscribe_all


def ghost(box: MemoryBox, owner: str, n: int, lease_seconds: float) -> list[int]:
    """Register ``owner``, claim ``n`` entries under a lease and mark the oldest started,
    as an instance does before it vanishes without unregistering; their ids."""
    queue = box.consumer("h", owner)
    now = box.store.now()
    info = InstanceInfo(
        id=owner,
        host="h",
        hostname="gone",
        pid=os.getpid(),
        started_at=now,
        heartbeat_at=now,
        state="running",
    )
    queue.register(info)
    claims, _ = queue.claim(n, lease_seconds, ordered=False, instances=False)
    queue.mark_started([min(claims, key=lambda c: c.id)])
    return sorted(c.id for c in claims)


def test_an_instance_registers_heartbeats_by_the_clock_and_unregisters(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    inst = start({})
    registered = box.store.rows.registered
    assert list(registered) == [inst.id]
    first = registered[inst.id].heartbeat_at
    settled(clock, inst)
    clock.advance(1.0)  # one heartbeat
    wait_for(lambda: registered[inst.id].heartbeat_at == first + timedelta(seconds=1))
    assert inst.stop() is True
    assert registered == {}


def test_heartbeats_keep_the_lease_of_an_entry_in_flight(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    stalled = Stalled()
    inst = start({"svc": stalled}, dequeue_threads=1)
    box.publish(msgs(1))
    assert stalled.entered.wait(10)
    [entry] = box.store.entries()
    for _ in range(15):  # past its first lease (10 s), a heartbeat a second
        settled(clock, inst, busy=1)
        clock.advance(1.0)
        wait_for(lambda: box.store.entries()[0].lease_expires == box.store.later(10.0))
    [entry] = box.store.entries()
    assert entry.leased(box.store.now())
    stalled.release.set()
    wait_for(drained(box), what="the entry completed")
    assert stalled.handled == [entry.id]


def test_a_lapsed_lease_is_redelivered_and_counted_and_its_first_outcome_lost(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    release = threading.Event()
    first: list[Delivery] = []

    def stuck(d: Delivery) -> None:
        first.append(d)
        release.wait(10)

    slow = {"heartbeat_seconds": 30.0, "dead_after_seconds": 60.0}
    a = start({"svc": stuck}, dequeue_threads=1, claim_batch=1, lease_seconds=5.0, **slow)
    box.publish(msgs(1))
    wait_for(lambda: bool(first), what="A's delivery")
    clock.advance(6.0)  # A's lease lapses while A still works on it (no heartbeat yet)
    rec = Recorder(clock)
    b = start({"svc": rec}, **slow)
    wait_for(drained(box), what="B's delivery")
    assert rec.seen == [("s", 0, 2)]  # the second delivery says so
    assert b.stats.snapshot()["redelivered"] == 1
    release.set()
    wait_for(lambda: a.stats.snapshot()["lost_leases"] == 1, what="A's lost lease")
    assert a.stats.snapshot()["completed"] == 0


def test_a_vanished_instances_entries_are_released_after_dead_after_and_redelivered(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    box.publish(msgs(3))
    assert len(ghost(box, "ghost", 3, lease_seconds=3600.0)) == 3
    rec = Recorder(clock)
    inst = start({"svc": rec}, dequeue_threads=1)
    settled(clock, inst)
    assert rec.seen == []  # the ghost holds them all
    clock.advance(2.0)  # not dead yet (3 s)
    settled(clock, inst)
    assert rec.seen == []
    assert "ghost" in box.store.rows.registered
    clock.advance(1.5)  # the next heartbeat finds it dead: its leases are released
    wait_for(drained(box), what="the ghost's entries redelivered")
    assert sorted(rec.seen) == [("s", n, 2) for n in range(3)]  # each attempt counted
    assert "ghost" not in box.store.rows.registered
    assert inst.stats.snapshot()["redelivered"] == 3
    assert box.store.suspended() == []


def test_an_entry_whose_instances_vanished_max_attempts_times_is_suspended_as_crashed_host(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    box.publish(msgs(3))
    for n in range(2):  # two instances end while handling t.N 0: their leases lapse
        ghost(box, f"dead-{n}", 3, lease_seconds=5.0)
        clock.advance(6.0)
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def count(d: Delivery) -> None:
        with lock:
            seen[int(d.properties["t.N"])] += 1  # type: ignore[arg-type]

    inst = start({"svc": count}, max_attempts=2)
    wait_for(drained(box), what="the queue to drain")
    [entry] = box.store.suspended()
    assert entry.reason == CRASHED_HOST
    assert "dead-1" in entry.error
    assert sorted(seen) == [1, 2]  # the poison (t.N 0) is not delivered again
    assert set(seen.values()) == {1}
    assert inst.stats.snapshot()["crashed"] == 1


def test_a_graceful_stop_waits_for_its_handler_and_gives_back_what_it_had_not_begun(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    box.publish(msgs(10))
    slow = Stalled()
    inst = start({"svc": slow}, dequeue_threads=1, claim_batch=10)
    slow.stop_midway(inst)  # the clock never moves: the stop waits for the handler
    assert len(slow.handled) == 1
    assert inst.stats.snapshot()["given_back"] == 9
    rest = box.store.entries()
    assert len(rest) == 9
    assert all(e.attempts == 0 and e.lease_expires is None for e in rest)
    assert box.store.rows.registered == {}
    again: Counter[int] = Counter()
    lock = threading.Lock()

    def count(d: Delivery) -> None:
        with lock:
            again[d.entry_id] += 1

    start({"svc": count})
    wait_for(drained(box), what="the queue to drain")
    assert sorted(again) == sorted(e.id for e in rest)
    assert set(again.values()) == {1}
