"""What a running host instance on the memory store does as the clock moves: scheduled
entries delivered when the clock reaches them, not before; expired entries swept by its
heartbeat, never delivered; a publish wakes idle threads with no time passing; how long
it has been idle, by the clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from messagebox.hosts import Delivery, HostInstance
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.message import Message
from messagebox.models import EXPIRED, State
from messagebox.port import HostBox
from messagebox.predicates import P
from tests.conftest import Stalled, wait_for
from tests.hosts.conftest import Recorder, Start, drained, msgs, settled, subscribe_all


def test_a_memory_box_is_a_host_box(box: MemoryBox) -> None:
    assert isinstance(box, HostBox)
    assert box.host("h").settings.heartbeat_seconds == 1.0


def delivered(rec: Recorder, count: int) -> Callable[[], bool]:
    return lambda: len(rec.numbers()) == count


def test_a_running_host_delivers_scheduled_entries_when_the_clock_reaches_them(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    rec = Recorder(clock)
    inst = start({"svc": rec}, dequeue_threads=2)
    settled(clock, inst)
    t0, now = clock.monotonic(), box.store.now()
    due = {n: 10.0 + 5.0 * n for n in range(4)}
    box.publish(
        [
            Message(
                f"body {n}".encode(), promoted={"t.N": n}, deliver_at=now + timedelta(seconds=s)
            )
            for n, s in due.items()
        ]
    )
    assert len(box.store.entries()) == 4  # routed at once, held until due
    for n, seconds in due.items():
        clock.advance(seconds - 0.5 - (clock.monotonic() - t0))
        settled(clock, inst)
        assert rec.numbers() == list(range(n))  # not before its time
        clock.advance(0.51)
        wait_for(delivered(rec, n + 1), what=f"entry {n} delivered")
    assert rec.numbers() == [0, 1, 2, 3]
    # each when the clock first passed its time: within the step, never before
    assert [round(at - t0, 6) for at in rec.at] == [s + 0.01 for s in due.values()]
    wait_for(drained(box), what="the queue to drain")


def test_a_running_hosts_heartbeat_sweeps_expired_entries_as_their_subscriptions_say(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    kept = box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    dropped = box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s-drop", on_expiry="drop")
    box.store.set_state([kept.id, dropped.id], State.STOPPED)  # held: never claimed
    [routed] = box.publish([Message(b"body 0", promoted={"t.N": 0}, ttl=30)])
    inst = start({"svc": Recorder(clock)})
    settled(clock, inst)
    clock.advance(29.0)
    wait_for(lambda: box.store.rows.registered[inst.id].heartbeat_at == box.store.now())
    settled(clock, inst)
    assert len(box.store.entries()) == 2  # swept at that heartbeat: not expired yet
    clock.advance(1.5)  # the next heartbeat sweeps them: one suspended, one dropped
    wait_for(drained(box), what="the expired entries swept")
    [e] = box.store.suspended()
    assert e.reason == EXPIRED
    assert e.sub == kept.id
    assert e.msg == routed.message_id
    assert inst.stats.snapshot()["expired"] == 2


def test_an_entry_that_expires_while_the_host_is_busy_is_never_delivered(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    busy = Stalled()
    seen: list[int] = []

    def service(d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        seen.append(n)
        if n == 0:
            busy(d)

    inst = start({"svc": service}, dequeue_threads=1, claim_batch=1)
    box.publish(msgs(1))
    assert busy.entered.wait(10)
    box.publish([Message(b"body 1", promoted={"t.N": 1}, ttl=5)])
    settled(clock, inst, busy=1)
    clock.advance(6.0)  # expired while the only thread is busy: swept at the heartbeat
    wait_for(lambda: len(box.store.suspended()) == 1, what="the expired entry swept")
    busy.release.set()
    wait_for(drained(box), what="the queue to drain")
    assert seen == [0]
    [e] = box.store.suspended()
    assert e.reason == EXPIRED
    assert inst.stats.snapshot()["expired"] == 1


def test_a_publish_wakes_idle_threads_with_no_time_passing(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    rec = Recorder(clock)
    inst = start({"svc": rec}, dequeue_threads=2, poll_min_seconds=10.0, poll_max_seconds=10.0)
    settled(clock, inst)  # both asleep for 10 s unless woken
    t0 = clock.monotonic()
    box.publish(msgs(3))
    wait_for(drained(box), what="the messages handled")
    assert sorted(rec.numbers()) == [0, 1, 2]
    assert rec.at == [t0] * 3
    assert clock.monotonic() == t0


def test_idle_only_with_nothing_claimed_and_nothing_in_hand_counted_by_the_clock(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box)
    gates = {1: threading.Event(), 2: threading.Event()}
    handled: list[int] = []

    def work(d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        assert gates[n].wait(10)
        handled.append(n)

    box.publish(msgs(1, 1))
    inst = start({"svc": work}, dequeue_threads=2)
    # one thread holds the message while the other's claims come back empty
    wait_for(lambda: inst._parts.idleness.empty_since is not None, what="an empty claim")
    settled(clock, inst, busy=1)
    clock.advance(3.0)
    assert inst.idle_seconds() == 0.0  # exactly: any time counted would show
    gates[1].set()
    wait_for(lambda: handled == [1], what="the message handled")
    settled(clock, inst)
    clock.advance(0.5)
    wait_for(lambda: inst.idle_seconds() >= 0.5, what="the instance idle")
    # new work: busy while in hand, whatever the clock; idle again from its end
    box.publish(msgs(1, 2))
    wait_for(lambda: inst.idle_seconds() == 0.0, what="the instance busy")
    clock.advance(2.0)
    assert inst.idle_seconds() == 0.0
    gates[2].set()
    wait_for(lambda: handled == [1, 2], what="the second message handled")
    settled(clock, inst)
    assert inst.idle_seconds() == 0.0  # counted from the end of the work
    clock.advance(0.5)
    assert inst.idle_seconds() == 0.5


def test_not_idle_before_it_has_looked(box: MemoryBox) -> None:
    instance = HostInstance(box, "h", {})
    assert instance.idle_seconds() == 0.0  # never started: it has not claimed
