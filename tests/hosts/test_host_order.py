"""Ordered delivery by a host instance on the memory store, across several threads: an
ordered subscription in publish order one at a time; ``ordered_by`` keys in parallel,
each key in order and alone; a failure that stops holds its subscription, or only its
key."""

from __future__ import annotations

import threading

from messagebox.hosts import Delivery
from messagebox.manual_clock import ManualClock
from messagebox.memory import MemoryBox
from messagebox.message import Message
from messagebox.models import DELIVERY_FAILURE, State
from messagebox.predicates import P
from tests.conftest import wait_for
from tests.hosts.conftest import Recorder, Start, drained, msgs, subscribe_all
from tests.integration.keyed_support import KeyRecorder


def test_an_ordered_subscription_is_delivered_in_publish_order_one_at_a_time(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box, ordered=True)
    rec = Recorder(clock)
    start({"svc": rec}, dequeue_threads=4, claim_batch=5)
    for first in range(0, 120, 10):
        box.publish(msgs(10, first))
    wait_for(drained(box), what="the queue to drain")
    assert rec.numbers() == list(range(120))
    assert rec.most == 1


def test_an_ordered_failure_is_suspended_and_the_run_goes_on(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box, ordered=True)
    rec = Recorder(clock, fail=lambda d: d.properties["t.N"] == 3)
    start({"svc": rec}, dequeue_threads=2, max_attempts=2, retry_backoff_seconds=0.0)
    box.publish(msgs(8))
    wait_for(drained(box), what="the queue to drain")
    assert rec.numbers() == [0, 1, 2, 3, 3, 4, 5, 6, 7]
    assert [e.reason for e in box.store.suspended()] == [DELIVERY_FAILURE]


class Marker:
    """Service ``marker`` of its own on the host: a marker published after other
    messages and handled proves the instance has claimed past them (claims take the
    oldest ready entries first), so what is still queued was held back, not late."""

    def __init__(self, box: MemoryBox) -> None:
        self.box = box
        self.sub = box.subscribe("marker", host="h", filter=P("t.Mark") >= 0, name="marker")
        self.handled: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.handled.append(int(d.properties["t.Mark"]))  # type: ignore[arg-type]

    def passes(self, n: int) -> None:
        """Publish marker ``n``; wait until it is handled and its entry completed."""
        self.box.publish([Message(b"marker", promoted={"t.Mark": n})])

        def done() -> bool:
            with self.lock:
                handled = n in self.handled
            return handled and all(e.sub != self.sub.id for e in self.box.store.entries())

        wait_for(done, what=f"marker {n} handled")


def test_an_ordered_failure_that_stops_holds_the_rest_of_its_subscription(
    box: MemoryBox, clock: ManualClock, start: Start
) -> None:
    subscribe_all(box, ordered=True, on_failure="stop")
    rec = Recorder(clock, fail=lambda d: d.properties["t.N"] == 3)
    marker = Marker(box)
    start({"svc": rec, "marker": marker}, dequeue_threads=2, max_attempts=1)
    box.publish(msgs(8))
    wait_for(lambda: len(box.store.suspended()) == 1, what="the suspension")
    marker.passes(1)  # had 4 been claimable, it would have been claimed before the marker
    assert rec.numbers() == [0, 1, 2, 3]
    sub = box.subscription("s")
    assert sub.state is State.STOPPED
    rest = box.store.entries()
    assert [(e.sub, e.state) for e in rest] == [(sub.id, "held")] * 4
    [entry] = box.store.suspended()
    assert entry.reason == DELIVERY_FAILURE


KEYS = "abcdefgh"
PER_KEY = 10


def keyed_box(box: MemoryBox, on_failure: str) -> None:
    box.subscribe(
        "svc",
        host="h",
        filter=P("t.N") >= 0,
        name="by-key",
        ordered_by="t.K",
        on_failure=on_failure,
    )
    for n in range(PER_KEY):
        box.publish([Message(b"x", promoted={"t.K": k, "t.N": n}) for k in KEYS])


def test_keys_are_delivered_in_parallel_each_in_order_and_a_failure_holds_only_its_key(
    box: MemoryBox, start: Start
) -> None:
    keyed_box(box, on_failure="stop")
    service = KeyRecorder(fail=("c", 3))
    gate = threading.Barrier(2, timeout=10)
    met: list[object] = []

    def first_two_at_once(d: Delivery) -> None:
        """The first deliveries of a and b meet: two keys are in hand at once."""
        if d.properties["t.N"] == 0 and d.properties["t.K"] in ("a", "b"):
            met.append(gate.wait())  # raises unless both are in hand at once
        service(d)

    start({"svc": first_two_at_once}, dequeue_threads=4, claim_batch=1, max_attempts=1)
    wait_for(lambda: service.count() == len(KEYS) * PER_KEY - 7, what="all but c's rest")
    wait_for(lambda: len(box.store.suspended()) == 1, what="c's suspension")
    assert service.seen == {k: list(range(PER_KEY)) if k != "c" else [0, 1, 2] for k in KEYS}
    assert service.overlaps == 0
    assert len(met) == 2  # keys a and b were delivered at the same time
    [held] = box.store.suspended()
    assert (held.order_key is not None, held.holds_key) == (True, True)
    assert "RuntimeError: cannot take c 3" in held.error
    assert box.subscription("by-key").state is State.STARTED  # the other keys went on
    # the others' last outcomes are recorded with their threads' next claims
    wait_for(lambda: len(box.store.entries()) == 6, what="the other keys' entries completed")
    assert {e.order_key for e in box.store.entries()} == {held.order_key}


def test_on_failure_suspend_lets_the_key_go_on(box: MemoryBox, start: Start) -> None:
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="by-key", ordered_by="t.K")
    box.publish([Message(b"x", promoted={"t.K": "a", "t.N": n}) for n in range(5)])
    service = KeyRecorder(fail=("a", 1))
    start({"svc": service}, max_attempts=1)
    wait_for(lambda: service.count() == 4, what="the key's other messages")
    wait_for(drained(box), what="the queue to drain")
    assert service.seen == {"a": [0, 2, 3, 4]}
    [suspended] = box.store.suspended()
    assert suspended.reason == DELIVERY_FAILURE
    assert not suspended.holds_key
