"""Host instances and delivery (docs/concepts.md: Hosts), on both backends: exactly-once handling
within a host, retries and the suspended queue, ordered delivery, service states,
throttling, graceful stop, leases and dead instances."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox, State, Throttled
from messagebox.claims import Claim
from messagebox.delivery import leases
from messagebox.errors import (
    PermanentFailure,
    UnknownSuspendedEntry,
    ValidationError,
)
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import (
    DELIVERY_FAILURE,
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
)
from messagebox.predicates import P
from messagebox.routing import throttle
from messagebox.storage import schema as mb_schema
from tests.conftest import (
    FAST_HOST,
    Stalled,
    claim,
    complete,
    fail_for_good,
    table_counts,
    wait_for,
)

FAST = FAST_HOST


def drained(box: MessageBox) -> Callable[[], bool]:
    return lambda: not box.queue_depth()


def msgs(n: int, start: int = 0, **extra: object) -> list[Message]:
    return [
        Message(f"body {i}".encode(), promoted={"t.N": i, **extra}) for i in range(start, start + n)
    ]


def run(
    instances: list[HostInstance],
    box: MessageBox,
    host: str,
    services: dict[str, object],
    **settings: object,
) -> HostInstance:
    inst = HostInstance(box, host, services, settings={**FAST, **settings}).start()
    instances.append(inst)
    return inst


class Recorder:
    """A thread-safe service that records what it is given."""

    def __init__(self, fail: Callable[[Delivery], bool] | None = None) -> None:
        self.seen: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()
        self.fail = fail

    def __call__(self, d: Delivery) -> None:
        n = d.properties["t.N"]
        assert d.body == f"body {n}".encode()
        with self.lock:
            self.seen.append((d.subscription.name, int(n), d.attempt))  # type: ignore[arg-type]
        if self.fail is not None and self.fail(d):
            raise RuntimeError(f"refused {n}")


class Marker:
    """A service of its own on the host, for marker messages. A marker published after
    other messages, once handled and its entry completed, proves the host instance has
    claimed past them: claims take ordered subscriptions' heads first, then ready
    entries oldest first. So what is still queued then was held back, not just late."""

    def __init__(self, box: MessageBox, host: str = "h") -> None:
        self.box = box
        self.sub = box.subscribe("marker", host=host, filter=P("t.Mark") >= 0, name="marker")
        self.handled: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.handled.append(int(d.properties["t.Mark"]))  # type: ignore[arg-type]

    def passes(self, n: int) -> None:
        """Publish marker ``n`` and wait until it is handled and its entry completed."""
        self.box.publish([Message(b"marker", promoted={"t.Mark": n})])

        def done() -> bool:
            with self.lock:
                handled = n in self.handled
            return handled and all(d.subscription != self.sub.id for d in self.box.queue_depth())

        wait_for(done, what=f"marker {n} to be handled")


def test_every_pair_is_handled_once_and_cleanup_empties_storage(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    # not declared dead while starved of the CPU by other test workers: this test is
    # about concurrent claims, not about dead instances
    box.create_host("h", **{**FAST, "dead_after_seconds": 10.0})
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all")
    box.subscribe("svc", host="h", filter=P("t.N") < 50, name="low")
    rec = Recorder()
    inst = run(instances, box, "h", {"svc": rec}, dequeue_threads=3, claim_batch=7)
    routed = box.publish(msgs(100))
    assert [len(r.subscriptions) for r in routed] == [2] * 50 + [1] * 50
    wait_for(drained(box), what="the queue to drain")
    assert Counter((s, n) for s, n, _ in rec.seen) == Counter(
        [("all", n) for n in range(100)] + [("low", n) for n in range(50)]
    )
    assert all(attempt == 1 for *_, attempt in rec.seen)
    inst.stop()  # a worker counts its entries just after their commit: let it finish
    assert inst.stats.snapshot()["completed"] == 150
    assert all(box.references(r.message_id) == 0 for r in routed)
    report = box.cleanup()
    assert report.messages == 100
    assert report.parts == 100
    counts = table_counts(box)
    for table in (
        "mb_spool",
        "mb_part",
        "mb_message_part",
        "mb_ref_add",
        "mb_ref_release",
        "mb_queue",
    ):
        assert counts[table] == 0, table


def test_instance_registers_and_unregisters(box: MessageBox, instances: list[HostInstance]) -> None:
    box.create_host("h", **FAST)
    inst = run(instances, box, "h", {})
    [info] = box.instances("h")
    assert info.id == inst.id
    assert info.state == "running"
    first = info.heartbeat_at
    wait_for(lambda: box.instances("h")[0].heartbeat_at > first, what="a heartbeat")
    assert inst.stop() is True
    assert box.instances("h") == []


def test_retry_then_suspend_then_resume_delivers(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    healthy = threading.Event()
    rec = Recorder(fail=lambda d: not healthy.is_set())
    inst = run(instances, box, "h", {"svc": rec}, max_attempts=3)
    [routed] = box.publish(msgs(1))
    wait_for(lambda: len(box.suspended()) == 1, what="the suspension")
    [entry] = box.suspended()
    assert entry.reason == DELIVERY_FAILURE
    assert entry.resumable
    assert entry.attempts == 3
    assert entry.error is not None
    assert "RuntimeError: refused 0" in entry.error
    assert [a for *_, a in rec.seen] == [1, 2, 3]
    assert box.references(routed.message_id) == 1  # the suspended entry holds it
    assert inst.stats.snapshot()["retried"] == 2
    healthy.set()
    assert box.resume(entry.id) == [entry.id]
    wait_for(drained(box), what="delivery after resume")
    assert rec.seen[-1] == ("s", 0, 1)  # attempts start again
    assert box.suspended() == []
    assert box.references(routed.message_id) == 0


def test_permanent_failure_suspends_without_retry(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")

    def refuse(d: Delivery) -> None:
        raise PermanentFailure("order has no lines")

    run(instances, box, "h", {"svc": refuse})
    box.publish(msgs(1))
    wait_for(lambda: len(box.suspended()) == 1)
    [entry] = box.suspended()
    assert entry.attempts == 1
    assert "order has no lines" in (entry.error or "")


def test_terminate_releases_the_reference(box: MessageBox, instances: list[HostInstance]) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    run(instances, box, "h", {"svc": Recorder(fail=lambda d: True)}, max_attempts=1)
    routed = box.publish(msgs(3))
    wait_for(lambda: len(box.suspended()) == 3)
    first = box.suspended()[0]  # oldest suspension first: any of the three
    assert box.terminate(first.id) == [first.id]
    assert box.references(first.message_id) == 0
    rest = [e.id for e in box.suspended(service="svc")]
    assert len(rest) == 2
    assert box.terminate(service="svc") == sorted(rest)
    assert box.suspended() == []
    assert all(box.references(r.message_id) == 0 for r in routed)
    assert box.cleanup().messages == 3
    with pytest.raises(UnknownSuspendedEntry, match="no suspended entry 12345"):
        box.terminate(12345)
    with pytest.raises(ValidationError, match="name the suspended entries"):
        box.terminate()


def test_bulk_resume_by_filter(box: MessageBox, instances: list[HostInstance]) -> None:
    box.create_host("h", **FAST)
    box.subscribe("a", host="h", filter=P("t.N") >= 0, name="sa")
    box.subscribe("b", host="h", filter=P("t.N") >= 0, name="sb")
    healthy = threading.Event()
    rec_a = Recorder(fail=lambda d: not healthy.is_set())
    rec_b = Recorder(fail=lambda d: not healthy.is_set())
    run(instances, box, "h", {"a": rec_a, "b": rec_b}, max_attempts=1)
    box.publish(msgs(4))
    wait_for(lambda: len(box.suspended()) == 8)
    healthy.set()
    assert len(box.resume(service="a")) == 4
    wait_for(lambda: len(box.suspended()) == 4 and not box.queue_depth())
    assert {e.subscription for e in box.suspended()} == {box.subscription("sb").id}
    assert len(box.resume(reason=DELIVERY_FAILURE)) == 4
    wait_for(drained(box))
    assert box.suspended() == []


def test_bulk_resume_in_batches_takes_each_entry_once_though_it_fails_again(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    run(instances, box, "h", {"svc": Recorder(fail=lambda d: True)}, max_attempts=1)
    box.publish(msgs(12))
    wait_for(lambda: len(box.suspended()) == 12)
    before = sorted(e.id for e in box.suspended())
    calls: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total))
        assert len(calls) <= 3, f"more batches than entries: {calls}"
        wait_for(lambda: len(box.suspended()) == 12, "the batch to fail again")

    # each batch is suspended again before the next: a batch must not take it twice
    done = box.resume(reason=DELIVERY_FAILURE, batch=5, progress=progress)
    assert done == before
    assert calls == [(5, 12), (10, 12), (12, 12)]


def test_ordered_subscription_keeps_publish_order(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ord", ordered=True)
    rec = Recorder()
    run(instances, box, "h", {"svc": rec}, dequeue_threads=4, claim_batch=5)
    for start in range(0, 120, 10):
        box.publish(msgs(10, start))
    wait_for(drained(box))
    assert [n for _, n, _ in rec.seen] == list(range(120))


def test_ordered_failure_suspends_and_goes_on(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ord", ordered=True)
    rec = Recorder(fail=lambda d: d.properties["t.N"] == 3)
    run(instances, box, "h", {"svc": rec}, dequeue_threads=2, max_attempts=2)
    box.publish(msgs(8))
    wait_for(drained(box))
    assert [n for _, n, _ in rec.seen] == [0, 1, 2, 3, 3, 4, 5, 6, 7]
    assert [e.reason for e in box.suspended()] == [DELIVERY_FAILURE]


def test_ordered_failure_can_stop_the_service(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="ord", ordered=True, on_failure="stop"
    )
    healthy = threading.Event()
    rec = Recorder(fail=lambda d: d.properties["t.N"] == 3 and not healthy.is_set())
    marker = Marker(box)
    run(instances, box, "h", {"svc": rec, "marker": marker}, dequeue_threads=2, max_attempts=1)
    box.publish(msgs(8))
    wait_for(lambda: len(box.suspended()) == 1)
    # a later marker is handled: had 4 been claimable, it would have been claimed first
    marker.passes(1)
    assert [n for _, n, _ in rec.seen] == [0, 1, 2, 3]
    assert box.subscription("ord").state is State.STOPPED
    ord_id = box.subscription("ord").id
    assert [(d.subscription, d.state, d.depth) for d in box.queue_depth()] == [(ord_id, "held", 4)]
    healthy.set()
    [entry] = box.suspended()
    box.resume(entry.id)  # back at the head of the queue, held while stopped
    box.set_service_state("svc", "started")
    wait_for(drained(box))
    assert [n for _, n, _ in rec.seen] == [0, 1, 2, 3, 3, 4, 5, 6, 7]


class Overlaps(Recorder):
    """A Recorder that also counts how many deliveries ran at once, at most."""

    def __init__(self, fail: Callable[[Delivery], bool] | None = None) -> None:
        super().__init__(fail)
        self.running = 0
        self.most = 0

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.001)  # the handler's work: room for another to overlap it
            super().__call__(d)
        finally:
            with self.lock:
                self.running -= 1


def test_an_ordered_correlated_subscription_keeps_publish_order_across_its_instances(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """An ordered subscription that is also correlated delivers strictly in publish
    order, one at a time, though its entries belong to more service instances than a
    run holds: no instance's head is claimed beside the run. (Claimed as heads, they
    ran out of order, several at once.)"""
    box.create_host("h", **FAST)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="conv", ordered=True, correlation=["t.K"]
    )
    box.publish(
        [Message(f"body {i}".encode(), promoted={"t.N": i, "t.K": i % 20}) for i in range(80)]
    )
    rec = Overlaps()
    run(instances, box, "h", {"svc": rec}, dequeue_threads=4, claim_batch=5)
    wait_for(drained(box))
    assert [n for _, n, _ in rec.seen] == list(range(80))
    assert rec.most == 1


def test_a_suspended_message_of_an_ordered_correlated_subscription_holds_its_instance(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """A message of an ordered, correlated subscription that is suspended holds its
    instance's later messages until it is resumed, as any instance's; the other
    instances' messages go on, in publish order. Resumed, the instance goes on in
    order."""
    box.create_host("h", **FAST)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="conv", ordered=True, correlation=["t.K"]
    )
    healthy = threading.Event()
    rec = Recorder(fail=lambda d: d.properties["t.N"] == 3 and not healthy.is_set())
    run(instances, box, "h", {"svc": rec}, dequeue_threads=2, max_attempts=1)
    box.publish(
        [Message(f"body {i}".encode(), promoted={"t.N": i, "t.K": i % 3}) for i in range(9)]
    )
    wait_for(
        lambda: (
            [n for _, n, _ in rec.seen][-1:] == [8] and [d.depth for d in box.queue_depth()] == [1]
        ),
        what="the last message handled, one left queued",
    )
    # 6 is instance 0's, like 3: held, though 7 and 8 after it were handled
    assert [n for _, n, _ in rec.seen] == [0, 1, 2, 3, 4, 5, 7, 8]
    healthy.set()
    [entry] = box.suspended()
    box.resume(entry.id)
    wait_for(drained(box))
    assert [n for _, n, _ in rec.seen] == [0, 1, 2, 3, 4, 5, 7, 8, 3, 6]


def _run(box: MessageBox, n: int = 10) -> list[Claim]:
    """The ordered run a claim takes now for host ``h``."""
    with box.store.transaction(serial=True) as conn:
        return leases.claim_run(
            conn, box.store.dialect, host="h", owner="t", n=n, lease_seconds=30.0
        )


def test_an_ordered_subscription_held_by_a_suspended_instance_holds_no_other(
    box: MessageBox,
) -> None:
    """Every message left to an ordered, correlated subscription waits for an instance
    that a suspended message holds: a claim takes the run of another ordered
    subscription of the host, with younger messages (it chose the held one, older, and
    took nothing), and the held one's again once the suspended message is resumed."""
    box.create_host("h", **FAST)
    box.subscribe(
        "svc", host="h", filter=P("t.Kind") == "a", name="conv", ordered=True, correlation=["t.K"]
    )
    box.subscribe("svc", host="h", filter=P("t.Kind") == "b", name="ord", ordered=True)
    first, second = box.publish(msgs(2, start=0, **{"t.Kind": "a", "t.K": 7}))  # instance 7
    [claimed] = _run(box, n=1)
    fail_for_good(box, claimed, "refused")
    others = box.publish(msgs(2, start=2, **{"t.Kind": "b"}))
    assert [c.msg for c in _run(box)] == [r.message_id for r in others]
    for c in claim(box, "h", n=5):  # none: ordered entries go by run only
        raise AssertionError(f"claimed {c}")
    box.resume(box.suspended()[0].id)
    assert [c.msg for c in _run(box)] == [first.message_id, second.message_id]


def test_an_ordered_subscription_whose_head_waits_for_its_instance_holds_no_other(
    box: MessageBox,
) -> None:
    """While an ordered, correlated subscription's oldest message waits for its
    instance (busy with an older message of another subscription), a claim takes the
    run of another ordered subscription; the waiting one's once the instance is free."""
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.Kind") == "a", name="plain", correlation=["t.K"])
    box.subscribe(
        "svc", host="h", filter=P("t.Kind") == "b", name="conv", ordered=True, correlation=["t.K"]
    )
    box.subscribe("svc", host="h", filter=P("t.Kind") == "c", name="ord", ordered=True)
    box.publish(msgs(1, start=0, **{"t.Kind": "a", "t.K": 1}))
    [busy] = claim(box, "h", n=5, instances=True)
    [waiting] = box.publish(msgs(1, start=1, **{"t.Kind": "b", "t.K": 1}))
    [other] = box.publish(msgs(1, start=2, **{"t.Kind": "c"}))
    assert [c.msg for c in _run(box)] == [other.message_id]
    complete(box, busy)
    assert [c.msg for c in _run(box)] == [waiting.message_id]


def test_an_ordered_correlated_run_waits_for_its_instance_in_another_subscription(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """An instance handles one message at a time, in order, across the subscriptions
    that correlate to it: the run of an ordered one stops at a message whose instance
    is busy with an older one of another subscription, and what follows it in the
    ordered subscription waits for it."""
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.Kind") == "a", name="plain", correlation=["t.K"])
    box.subscribe(
        "svc", host="h", filter=P("t.Kind") == "b", name="conv", ordered=True, correlation=["t.K"]
    )
    started, release = threading.Event(), threading.Event()
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler(d: Delivery) -> None:
        with lock:
            seen.append((str(d.properties["t.Kind"]), int(d.properties["t.K"])))  # type: ignore[arg-type]
        if d.properties["t.Kind"] == "a":
            started.set()
            release.wait(30)

    marker = Marker(box)
    run(instances, box, "h", {"svc": handler, "marker": marker}, dequeue_threads=4)
    box.publish([Message(b"a", promoted={"t.Kind": "a", "t.K": 1})])
    wait_for(started.is_set, what="instance 1 busy with its first message")
    box.publish([Message(b"b", promoted={"t.Kind": "b", "t.K": k}) for k in (1, 2)])
    marker.passes(1)  # the host instance has claimed past both
    with lock:
        assert seen == [("a", 1)]
    release.set()
    wait_for(drained(box))
    assert seen == [("a", 1), ("b", 1), ("b", 2)]


class BatchRecorder:
    """A service that takes batches (``handle_many``), failing message 3 for good."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.lock = threading.Lock()

    def handle(self, d: Delivery) -> None:
        [error] = self.handle_many([d])
        if error is not None:
            raise error

    def handle_many(self, ds: list[Delivery]) -> list[Exception | None]:
        errors: list[Exception | None] = []
        for d in ds:
            n = int(d.properties["t.N"])  # type: ignore[arg-type]
            with self.lock:
                self.seen.append(n)
            errors.append(PermanentFailure(f"refused {n}") if n == 3 else None)
        return errors


def test_an_ordered_subscription_stops_at_a_failure_of_a_service_that_takes_batches(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """A service with ``handle_many`` gets an ordered subscription's messages one at a
    time: one that fails stops the rest (here the subscription stops), where a batch of
    the whole run had handed them all over before the failure was known."""
    box.create_host("h", **FAST)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="ord", ordered=True, on_failure="stop"
    )
    rec = BatchRecorder()
    marker = Marker(box)
    run(instances, box, "h", {"svc": rec, "marker": marker}, dequeue_threads=2, claim_batch=8)
    box.publish(msgs(8))
    wait_for(lambda: len(box.suspended()) == 1, what="message 3 suspended")
    marker.passes(1)  # the host instance has claimed past them
    assert rec.seen == [0, 1, 2, 3]
    assert box.subscription("ord").state is State.STOPPED


def test_stopped_service_holds_until_started(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    rec = Recorder()
    marker = Marker(box)
    run(instances, box, "h", {"svc": rec, "marker": marker})
    box.set_service_state("svc", State.STOPPED)
    box.publish(msgs(5))
    marker.passes(1)  # claimed after the five: they would have been claimed first
    assert rec.seen == []
    assert [(d.state, d.depth) for d in box.queue_depth()] == [("held", 5)]
    box.set_service_state("svc", State.STARTED)
    wait_for(drained(box))
    assert sorted(n for _, n, _ in rec.seen) == list(range(5))


def test_stopping_holds_what_already_waits(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.publish(msgs(3))
    box.set_service_state("svc", "stopped")
    assert [(d.state, d.depth) for d in box.queue_depth()] == [("held", 3)]


def test_unenlisting_suspends_waiting_messages_resumably(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.publish(msgs(2))
    box.set_service_state("svc", "unenlisted")
    assert box.queue_depth() == []
    assert [e.reason for e in box.suspended()] == [SERVICE_UNENLISTED] * 2
    assert box.publish(msgs(1, 10))[0].subscriptions == ()  # no longer routed to it
    box.set_service_state("svc", "started")
    rec = Recorder()
    run(instances, box, "h", {"svc": rec})
    box.resume(reason=SERVICE_UNENLISTED)
    wait_for(drained(box))
    assert sorted(n for _, n, _ in rec.seen) == [0, 1]


def test_an_entry_failing_after_its_subscription_was_removed_is_suspended_for_reroute(
    box: MessageBox,
) -> None:
    # Given an entry being delivered when its subscription is removed
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="old")
    box.publish(msgs(1))
    [claimed] = claim(box, "h")
    box.unsubscribe("old")
    assert box.suspended() == []  # being delivered: it finishes its delivery
    # When the delivery fails past its retries
    fail_for_good(box, claimed, "downstream said no")
    # Then it is suspended as its subscription's removal, with its error: re-routable,
    # not resumable (there is nothing to resume it to)
    [entry] = box.suspended()
    assert (entry.reason, entry.resumable) == (SUBSCRIPTION_REMOVED, False)
    assert entry.error == "downstream said no"
    new = box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="new")
    assert box.reroute(entry.id) == {entry.id: (new.id,)}


def test_removing_a_subscription_makes_its_resumable_suspended_entries_reroutable(
    box: MessageBox,
) -> None:
    # Given entries suspended resumably (their service was unenlisted)
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="old")
    box.publish(msgs(2))
    box.set_service_state("svc", "unenlisted")
    assert [e.resumable for e in box.suspended()] == [True, True]
    # When the subscription is removed, they can no longer be resumed, but rerouted
    box.unsubscribe("old")
    entries = box.suspended()
    assert [(e.reason, e.resumable) for e in entries] == [(SUBSCRIPTION_REMOVED, False)] * 2
    assert entries[0].error == "its service was unenlisted before it was delivered"
    assert box.resume(reason=SERVICE_UNENLISTED) == []
    new = box.subscribe("svc2", host="h", filter=P("t.N") >= 0, name="new")
    assert box.reroute() == {e.id: (new.id,) for e in entries}


def test_unsubscribe_suspends_waiting_messages_for_reroute(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="old")
    routed = box.publish(msgs(2))
    box.unsubscribe("old")
    entries = box.suspended()
    assert [e.reason for e in entries] == [SUBSCRIPTION_REMOVED] * 2
    assert not entries[0].resumable
    with pytest.raises(UnknownSuspendedEntry, match="not resumable"):
        box.resume(entries[0].id)
    new = box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="new")
    assert box.reroute() == {e.id: (new.id,) for e in entries}
    rec = Recorder()
    run(instances, box, "h", {"svc": rec})
    wait_for(drained(box))
    assert sorted(n for _, n, _ in rec.seen) == [0, 1]
    assert all(box.references(r.message_id) == 0 for r in routed)


def test_unknown_service_fails_with_a_clear_error(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("billing", host="h", filter=P("t.N") >= 0, name="s")
    run(instances, box, "h", {"other": Recorder()}, max_attempts=1)
    box.publish(msgs(1))
    wait_for(lambda: len(box.suspended()) == 1)
    assert "service 'billing' is not registered" in (box.suspended()[0].error or "")


def test_throttling(box: MessageBox, instances: list[HostInstance]) -> None:
    box.create_host("h", throttle_queue_depth=5, **FAST)
    box.create_host("other")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.subscribe("svc2", host="other", filter=P("t.Other").exists(), name="o")
    box.publish(msgs(6))
    before = table_counts(box)
    with pytest.raises(Throttled, match="host 'h' has 6 entries waiting") as info:
        box.publish(msgs(1, 100), block=False)
    assert info.value.hosts == ["h"]
    started = time.monotonic()
    with pytest.raises(Throttled):
        box.publish(msgs(1, 100), timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert table_counts(box) == before  # a throttled publish stores nothing
    box.publish([Message(b"x", promoted={"t.Other": 1})], block=False)  # other hosts flow
    run(instances, box, "h", {"svc": Recorder()})
    [routed] = box.publish(msgs(1, 100), timeout=10)  # waits for the queue to drain
    assert routed.subscriptions


def test_a_depth_read_for_throttling_counts_every_host_at_once_on_duckdb(
    box: MessageBox,
) -> None:
    # Given entries queued for two hosts
    for host in ("a", "b"):
        box.create_host(host)
        box.subscribe(f"svc-{host}", host=host, filter=P("t.N") >= 0, name=host)
    box.publish(msgs(3))
    # When the depth of one is read for throttling
    with box.store.transaction() as conn:
        depths = throttle.queue_depths(conn, ["a", "none"])
    # Then it is counted (a host with nothing queued as 0); on DuckDB the one scan
    # counts the other too (elsewhere an index gives each host's alone)
    assert depths == ({"a": 3, "none": 0, "b": 3} if box.one_process else {"a": 3, "none": 0})


def test_graceful_stop_gives_back_unstarted_claims(box: MessageBox) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.publish(msgs(10))
    slow = Stalled()
    inst = HostInstance(
        box, "h", {"svc": slow}, settings={**FAST, "dequeue_threads": 1, "claim_batch": 10}
    ).start()
    slow.stop_midway(inst)
    assert len(slow.handled) == 1
    assert inst.stats.snapshot()["given_back"] == 9
    q = mb_schema.queue
    with box.store.transaction() as conn:
        rows = conn.execute(sa.select(q.c.attempts, q.c.lease_owner)).all()
    assert rows
    assert all(a == 0 and owner is None for a, owner in rows)
    assert box.instances() == []


def test_forced_lease_expiry_redelivers_and_is_counted(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    release = threading.Event()
    first: list[Delivery] = []

    def stuck(d: Delivery) -> None:
        first.append(d)
        release.wait(10)

    a = run(
        instances,
        box,
        "h",
        {"svc": stuck},
        dequeue_threads=1,
        claim_batch=1,
        heartbeat_seconds=30,
        dead_after_seconds=60,
    )
    box.publish(msgs(1))
    wait_for(lambda: bool(first))
    # a network partition, say: A's lease runs out while A still works on the message
    q = mb_schema.queue
    with box.store.transaction(serial=True) as conn:
        conn.execute(q.update().values(lease_expires=datetime.now(UTC) - timedelta(seconds=1)))
    rec = Recorder()
    b = run(instances, box, "h", {"svc": rec})
    wait_for(drained(box))
    assert rec.seen == [("s", 0, 2)]  # the second delivery says so
    assert b.stats.snapshot()["redelivered"] == 1
    release.set()
    wait_for(lambda: a.stats.snapshot()["lost_leases"] == 1, what="A's lost lease")
    assert a.stats.snapshot()["completed"] == 0


def test_dead_instance_leases_are_released(box: MessageBox, instances: list[HostInstance]) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.publish(msgs(3))
    i, q = mb_schema.instance, mb_schema.queue
    old = datetime.now(UTC) - timedelta(minutes=5)
    with box.store.transaction(serial=True) as conn:
        conn.execute(
            i.insert().values(
                id="ghost",
                host="h",
                hostname="gone",
                pid=1,
                started_at=old,
                heartbeat_at=old,
                state="running",
            )
        )
        conn.execute(
            q.update().values(
                lease_owner="ghost",
                lease_expires=datetime.now(UTC) + timedelta(hours=1),
                attempts=1,
            )
        )
    report = box.cleanup()
    assert (report.dead_instances, report.released_leases) == (1, 3)
    rec = Recorder()
    run(instances, box, "h", {"svc": rec})
    wait_for(drained(box))
    assert sorted(rec.seen) == [("s", n, 2) for n in range(3)]


def test_ten_thousand_messages_several_subscriptions_exactly_once(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all")
    box.subscribe("svc", host="h", filter=P("t.N") < 5000, name="low")
    box.subscribe("svc", host="h", filter=P("t.N") >= 5000, name="high")
    box.subscribe("svc", host="h", filter=P("t.N") < 300, name="ordered", ordered=True)
    rec = Recorder()
    for start in range(0, 10_000, 1000):
        box.publish(msgs(1000, start))
    inst = run(
        instances, box, "h", {"svc": rec}, dequeue_threads=4, claim_batch=50, max_in_flight=400
    )
    wait_for(drained(box), timeout=240)
    pairs = Counter((s, n) for s, n, _ in rec.seen)
    assert len(pairs) == 20_300
    assert set(pairs.values()) == {1}
    assert [n for s, n, _ in rec.seen if s == "ordered"] == list(range(300))
    inst.stop()  # a worker counts its entries just after their commit: let it finish
    stats = inst.stats.snapshot()
    assert stats["completed"] == 20_300
    assert stats["redelivered"] == 0
    assert stats["lost_leases"] == 0


def test_second_process_on_a_duckdb_file_is_told_to_use_postgresql(duckdb_url: str) -> None:
    with MessageBox(duckdb_url):
        code = "\n".join(
            [
                "import sys",
                "from messagebox import MessageBox",
                "from messagebox.errors import BackendUnavailable",
                "try:",
                f"    MessageBox({duckdb_url!r})",
                "except BackendUnavailable as e:",
                "    print(e)",
                "    sys.exit(3)",
            ]
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 3, done.stderr
    assert "use PostgreSQL for several processes" in done.stdout


def test_bad_settings_name_the_field(box: MessageBox) -> None:
    box.create_host("h")
    with pytest.raises(ValidationError, match="claim_batch"):
        HostInstance(box, "h", {}, settings={"claim_batch": 0})
    with pytest.raises(ValidationError, match="must be a callable"):
        HostInstance(box, "h", {"svc": 42})
    with pytest.raises(ValidationError, match="dead_after_seconds"):
        box.create_host("h2", heartbeat_seconds=10, dead_after_seconds=5)


@pytest.mark.postgres
def test_notify_wakes_an_idle_instance_at_once(
    pg_url: str, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    box = MessageBox(pg_url)
    box.create_host("h", **{**FAST, "poll_min_seconds": 10.0, "poll_max_seconds": 10.0})
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    got = threading.Event()
    inst = HostInstance(
        box,
        "h",
        {"svc": lambda d: got.set()},
        settings={**FAST, "poll_min_seconds": 10.0, "poll_max_seconds": 10.0},
    )
    # record the wake-ups (the LISTEN connection wakes the workers once it listens), and
    # what each worker last saw before it went to sleep (it sleeps 10 s unless woken)
    wakes: list[None] = []
    slept: dict[str, int] = {}
    lock = threading.Lock()
    wakeups = inst._parts.wakeups  # every wake-up goes through it
    real_wake, real_wait = wakeups.wake, wakeups.wait

    def recording_wake() -> None:
        real_wake()
        with lock:
            wakes.append(None)

    def recording_wait(seen: int, seconds: float) -> None:
        with lock:
            slept[threading.current_thread().name] = seen
        real_wait(seen, seconds)

    monkeypatch.setattr(wakeups, "wake", recording_wake)
    monkeypatch.setattr(wakeups, "wait", recording_wait)
    instances.append(inst.start())

    def asleep() -> bool:
        """The instance listens, and every worker went to sleep having seen every
        wake-up so far: only another wake-up starts it before its 10 s are up."""
        with lock:
            return (
                bool(wakes) and list(slept.values()) == [len(wakes)] * inst.settings.dequeue_threads
            )

    wait_for(asleep, what="the instance to listen and its workers to sleep")
    # another "process": a second connection pool, so only NOTIFY can wake the instance
    other = MessageBox(pg_url + "&application_name=publisher")
    started = time.monotonic()
    other.publish(msgs(1))
    assert got.wait(3.0), "NOTIFY did not wake the idle instance"
    assert time.monotonic() - started < 3.0
    instances.pop().stop()
    other.close()
    box.close()


class Flushing:
    """A service that defers its durability to ``flush`` (as file send ports do), whose
    first flush fails."""

    def __init__(self) -> None:
        self.handled: list[int] = []
        self.durable: list[int] = []
        self.pending = threading.local()
        self.flushes = 0
        self.lock = threading.Lock()

    def handle(self, d: Delivery) -> None:
        pending = getattr(self.pending, "n", None)
        if pending is None:
            pending = self.pending.n = []
        pending.append(int(d.properties["t.N"]))  # type: ignore[arg-type]

    def flush(self) -> None:
        pending, self.pending.n = getattr(self.pending, "n", []), []
        with self.lock:
            self.flushes += 1
            self.handled.extend(pending)
            if self.flushes == 1:
                raise OSError("disk full")
            self.durable.extend(pending)


def test_a_batch_is_completed_only_once_its_service_has_flushed(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    # Given a service that makes its work durable once a batch, whose first flush fails
    box.create_host("h")
    box.subscribe("f", host="h", filter=P("t.N") >= 0)
    service = Flushing()
    box.publish(msgs(20))
    # When an instance claims the messages in batches
    inst = run(instances, box, "h", {"f": service}, dequeue_threads=1, claim_batch=8)
    wait_for(drained(box), what="the queue to drain")
    # Then the batch whose flush failed was delivered again, and every message was
    # completed only after a flush that succeeded
    assert sorted(service.durable) == list(range(20))
    assert len(service.handled) > 20
    # a worker counts its entries just after their commit, so the count may trail the
    # queue by a moment
    wait_for(lambda: inst.stats.snapshot()["completed"] == 20, what="20 completions counted")
    stats = inst.stats.snapshot()
    assert stats["completed"] == 20
    assert stats["retried"] >= 1
    assert box.suspended() == []
