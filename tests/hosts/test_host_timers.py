"""Timers of service instances on a running host instance on the memory store: an
orchestration's ``wait_for`` timer fires when the clock reaches it, not before, and its
``@timeout`` step runs on the host."""

from __future__ import annotations

import threading

from pydantic import BaseModel

from messagebox.hosts import Delivery, Orchestration, activate, timeout
from messagebox.hosts.orchestration_service import OrchestrationService
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.message import Message
from messagebox.predicates import P
from tests.conftest import wait_for
from tests.hosts.conftest import Start, settled

WAIT_SECONDS = 10.0


class Nothing(BaseModel):
    pass


class Reminder(Orchestration[Nothing]):
    """An order waits for itself ``WAIT_SECONDS``; on the time-out it publishes ``late``
    and completes (no correlation: the memory store does not correlate)."""

    name = "reminder"

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.wait_for("order", timeout=WAIT_SECONDS)

    @timeout("order")
    def late(self) -> None:
        self.publish(Message(b"late", promoted={"t.Kind": "late"}))
        self.complete()


def test_a_timer_fires_on_a_running_host_when_the_clock_reaches_it(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    service = OrchestrationService(Reminder)
    for spec in service.subscription_specs():
        box.subscribe(host="h", **spec)
    box.subscribe("sink", host="h", filter=P("t.Kind") == "late", name="sink")
    late: list[float] = []
    lock = threading.Lock()

    def sink(d: Delivery) -> None:
        with lock:
            late.append(clock.monotonic())

    inst = start({service.name: service, "sink": sink})
    t0 = clock.monotonic()
    box.publish([Message(b"order", promoted={"t.Kind": "order"})])
    wait_for(lambda: bool(box.store.timers()), what="the timer set")
    [timer] = box.store.timers()
    assert timer.due_at == box.store.later(WAIT_SECONDS)
    settled(clock, inst)
    clock.advance(WAIT_SECONDS - 0.1)
    settled(clock, inst)
    assert late == []  # not before its time
    assert box.store.timers() == [timer]
    steps = 0
    while not late and steps < 10:  # each step: the clock 0.05 s on, the threads settled
        clock.advance(0.05)
        steps += 1
        settled(clock, inst)
    wait_for(lambda: bool(late), what="the time-out step's message")
    assert WAIT_SECONDS <= late[0] - t0 <= WAIT_SECONDS + 0.3
    wait_for(lambda: not box.store.entries(), what="the queue to drain")
    assert box.store.timers() == []
    assert inst.stats.snapshot()["timers_fired"] == 1
    [instance_id] = box.store.rows.instances
    stored = box.store.instance(instance_id)
    assert stored is not None
    assert stored.state.value == "completed"
