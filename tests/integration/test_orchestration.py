"""Orchestrations (issue 5; docs/concepts.md: Orchestrations), on both backends:
correlation, convoys,
parallel convoys, timeouts, completion with zombies, one message at a time per instance,
failure and resume."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from typing import ClassVar

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.errors import UnknownSuspendedEntry, ValidationError
from messagebox.hosts import Delivery, HostApp, Orchestration, activate, receive, timeout
from messagebox.models import INSTANCE_COMPLETED, ROUTING_FAILURE, Kind
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.integration.orchestration_support import (
    instance_rows,
    make_app,
    msg,
    settled,
    wait_until,
    waiting,
)

# --- orchestrations under test ---


class Conversation(BaseModel):
    seen: list[str] = []


class Fulfilment(Orchestration[Conversation]):
    """order → payment → complete, publishing what it saw."""

    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.seen.append(f"order:{d.properties['t.OrderId']}:{d.body.decode()}")

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.state.seen.append(f"payment:{d.properties['t.OrderId']}:{d.body.decode()}")
        self.publish(Message(json.dumps(self.state.seen), promoted={"t.Kind": "confirm"}))
        self.complete()


def test_interleaved_conversations_never_cross(box: MessageBox, running):
    # Given the fulfilment orchestration on a host with 4 dequeue threads
    app, sink = make_app(Fulfilment, sink_kinds=("confirm",))
    box_ids = list(range(1000))
    host = running(app)
    # When 1,000 conversations' orders and payments are published interleaved, in
    # batches that mix conversations (each payment after its own order)
    rng = random.Random(5)
    events: list[Message] = []
    pending_payment: list[int] = []
    orders = box_ids[:]
    rng.shuffle(orders)
    while orders or pending_payment:
        if orders and (not pending_payment or rng.random() < 0.5):
            o = orders.pop()
            events.append(msg("order", o))
            pending_payment.append(o)
        else:
            o = pending_payment.pop(rng.randrange(len(pending_payment)))
            events.append(msg("payment", o))
    for start in range(0, len(events), 97):
        box.publish(events[start : start + 97])
    # Then every conversation confirms once, having seen exactly its own two messages
    # (a generous limit: about 40 s on a quiet 2-core machine, several times that when
    # other test workers share its cores; it is a wait for a condition, never a pause)
    wait_until(lambda: len(sink.kinds("confirm")) >= 1000, 240, "1,000 confirms")
    confirms = sink.kinds("confirm")
    assert len(confirms) == 1000
    by_order = {o: json.loads(body) for o, body in confirms}
    assert sorted(by_order) == box_ids
    for o, seen in by_order.items():
        assert seen == [f"order:{o}:order:{o}", f"payment:{o}:payment:{o}"]
    # with no entry claimed twice (by concurrent claims of the host's threads)
    stats = host.stats.snapshot()
    assert stats["redelivered"] == 0
    assert stats["lost_leases"] == 0
    assert stats["failed"] == 0
    # and nothing is left behind: instances completed, their convoys gone, only the
    # declared subscriptions remain
    rows = instance_rows(box)
    assert len(rows) == 1000
    assert {r.state for r in rows} == {"completed"}
    assert [s.name for s in box.subscriptions() if s.kind is Kind.INSTANCE] == [
        "Fulfilment.payment"
    ]
    with box.store.transaction() as conn:
        assert not conn.execute(sa.select(mb_schema.convoy)).first()
    assert box.suspended() == []


class Sequence_(BaseModel):
    items: list[int] = []


class Sequential(Orchestration[Sequence_]):
    """A sequential convoy: every 'item' of one batch id goes to one instance."""

    name = "sequential"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "item")
    def item(self, d: Delivery) -> None:
        self.state.items.append(int(d.properties["t.Seq"]))  # type: ignore[arg-type]
        time.sleep(0.002)  # widen any window in which two could run at once
        if len(self.state.items) == 60:
            self.publish(Message(json.dumps(self.state.items), promoted={"t.Kind": "done"}))
            self.complete()


def test_sequential_convoy_goes_to_one_instance_in_publish_order(box: MessageBox, running):
    # Given a sequential convoy on a host with 4 dequeue threads
    app, sink = make_app(Sequential, sink_kinds=("done",))
    running(app)
    # When 60 items of two conversations are published: some one by one, some many in
    # one batch (so several first messages of a conversation arrive in one batch)
    for seq in range(10):
        box.publish([msg("item", "A", **{"t.Seq": seq}), msg("item", "B", **{"t.Seq": seq})])
    box.publish([msg("item", o, **{"t.Seq": seq}) for seq in range(10, 60) for o in ("A", "B")])
    # Then each conversation had one instance, which saw its items in publish order
    wait_until(lambda: len(sink.kinds("done")) == 2, 60, "two completed convoys")
    for _, body in sink.kinds("done"):
        assert json.loads(body) == list(range(60))
    assert len(instance_rows(box)) == 2


def test_first_messages_in_one_batch_create_one_instance(box: MessageBox, running):
    # Given the subscriptions of the convoy, and no host running yet
    app, sink = make_app(Sequential, sink_kinds=("done",))
    app.setup(box)
    # When 60 first messages for one value arrive in one batch
    routed = box.publish([msg("item", "Z", **{"t.Seq": seq}) for seq in range(60)])
    # Then routing gave them all one instance
    q = mb_schema.queue
    with box.store.transaction() as conn:
        ids = set(conn.execute(sa.select(q.c.instance_id)).scalars())
    assert len(ids) == 1
    assert None not in ids
    assert all(len(r.subscriptions) == 1 for r in routed)
    # and it handles them in order once a host runs
    running(app)
    wait_until(lambda: len(sink.kinds("done")) == 1, 60, "the convoy to complete")
    assert json.loads(sink.kinds("done")[0][1]) == list(range(60))
    assert [r.id for r in instance_rows(box)] == list(ids)


def test_concurrent_publishers_of_one_value_make_one_instance(box: MessageBox, running):
    # Given the convoy's subscriptions
    app, sink = make_app(Sequential, sink_kinds=("done",))
    app.setup(box)
    # When 6 threads publish first messages for the same values at the same moment
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def publisher(n: int) -> None:
        try:
            barrier.wait()
            for seq in range(10):
                box.publish([msg("item", o, **{"t.Seq": n * 10 + seq}) for o in ("P", "Q")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    running(app)
    # Then each value had exactly one instance, which got all 60 of its messages
    wait_until(lambda: len(sink.kinds("done")) == 2, 60, "both convoys to complete")
    for _, body in sink.kinds("done"):
        assert sorted(json.loads(body)) == list(range(60))
    assert len(instance_rows(box)) == 2


class Pair(BaseModel):
    order: bool = False
    payment: bool = False
    arrivals: list[str] = []


class ParallelConvoy(Orchestration[Pair]):
    """Waits for an order and a payment, in either order, then ships."""

    name = "parallel"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.order = True
        self.state.arrivals.append("order")
        self._maybe_ship()

    @activate(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.state.payment = True
        self.state.arrivals.append("payment")
        self._maybe_ship()

    def _maybe_ship(self) -> None:
        if self.state.order and self.state.payment:
            self.publish(Message(",".join(self.state.arrivals), promoted={"t.Kind": "ship"}))
            self.complete()


def test_parallel_convoy_waits_for_both_messages_in_either_order(box: MessageBox, running):
    # Given a parallel convoy
    app, sink = make_app(ParallelConvoy, sink_kinds=("ship",))
    running(app)
    # When some conversations send the order first, others the payment first
    box.publish([msg("order", 1), msg("payment", 2)])
    # both handled: a shipment would have been queued with its step, and consumed since
    wait_until(
        lambda: len(instance_rows(box)) == 2 and not box.queue_depth(), 30, "both halves handled"
    )
    assert sink.kinds("ship") == []  # nothing ships on half a pair
    box.publish([msg("payment", 1), msg("order", 2), msg("payment", 3), msg("order", 3)])
    # Then each ships exactly once, after both arrived, in the order they arrived
    wait_until(lambda: len(sink.kinds("ship")) == 3, 30, "three shipments")
    assert sorted(sink.kinds("ship")) == [
        (1, b"order,payment"),
        (2, b"payment,order"),
        (3, b"payment,order"),
    ]
    assert len(instance_rows(box)) == 3


class Waiting(BaseModel):
    paid: bool = False


class PaymentTimeout(Orchestration[Waiting]):
    """order → wait for payment (0.5 s) → ship, or cancel on the timeout."""

    name = "timeouts"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.wait_for("payment", timeout=float(d.properties.get("t.Wait", 0.5)))  # type: ignore[arg-type]

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.state.paid = True
        self.publish(Message(b"ship", promoted={"t.Kind": "ship"}))
        self.complete()

    @timeout("payment")
    def unpaid(self) -> None:
        self.publish(Message(b"cancel", promoted={"t.Kind": "cancel"}))
        self.complete()


def test_a_missing_payment_times_out_into_a_compensating_message(box: MessageBox, running):
    # Given an orchestration that waits for a payment (0.5 s unless the order says)
    app, sink = make_app(PaymentTimeout, sink_kinds=("ship", "cancel"))
    host = running(app)
    # When order 1 is paid in time and order 2 never is (order 1 waits 3 s: its payment
    # is handled well within that even on a loaded machine)
    box.publish([msg("order", 1, **{"t.Wait": 3.0}), msg("order", 2)])
    wait_until(lambda: len(instance_rows(box)) == 2, 30, "both orders waiting")
    box.publish([msg("payment", 1)])
    # Then order 1 ships, order 2 is cancelled by its timeout, each exactly once
    wait_until(lambda: bool(sink.kinds("ship")), 30, "the shipment")
    # and order 1's timer was stopped: order 3, ordered after order 1 was paid, times out
    # later than order 1 would have; once its cancel is in and the queue is empty, a
    # timeout of order 1 would have been fired and handled too
    box.publish([msg("order", 3, **{"t.Wait": 3.0})])
    wait_until(lambda: len(sink.kinds("cancel")) == 2 and not box.queue_depth(), 30, "two cancels")
    assert sorted((k, o) for k, o, _ in sink.got) == [("cancel", 2), ("cancel", 3), ("ship", 1)]
    assert host.stats.snapshot()["timers_fired"] == 2
    assert box.suspended() == []  # nor did it fire into the completed instance
    with box.store.transaction() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(mb_schema.timer)).scalar() == 0
    # and a payment after the timeout finds no instance: a routing failure, not lost
    box.publish([msg("payment", 2)])
    [failure] = box.suspended(reason=ROUTING_FAILURE)
    assert failure.report is not None


class Rewait(PaymentTimeout):
    """PaymentTimeout with a reminder, whose step waits again (120 s): the timer is
    replaced."""

    name = "rewait"

    @receive(P("t.Kind") == "remind")
    def remind(self, d: Delivery) -> None:
        self.wait_for("payment", timeout=120)


def test_a_first_step_looks_for_no_timer_to_replace_and_a_later_one_replaces_it(
    box: MessageBox, running
):
    # Given an orchestration whose first step waits and whose reminder waits again,
    # and the statements of every engine recorded
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    def timers() -> list[sa.Row]:
        t = mb_schema.timer
        with box.store.transaction() as conn:
            return list(conn.execute(sa.select(t.c.name, t.c.due_at)))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        app, _ = make_app(Rewait)
        running(app)
        # When an order starts an instance (waiting 60 s)
        box.publish([msg("order", 1, **{"t.Wait": 60.0})])
        wait_until(lambda: len(timers()) == 1, 30, "the order's timer")
        first = list(statements)
        [(name, due)] = timers()
        # and a reminder then waits again
        box.publish([msg("remind", 1)])
        wait_until(lambda: len(timers()) == 1 and timers()[0].due_at > due, 30, "a later timer")
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    # Then the first step looked for no timer to cancel (its instance had none)
    looked = [s for s in first if s.startswith("SELECT mb_timer.id")]
    assert name == "payment"
    assert not looked, looked
    # while the reminder's step did, and replaced the timer: one row, due later
    assert [s for s in statements if s.startswith("SELECT mb_timer.id")]


@pytest.mark.parametrize(
    ("orchestration", "extra", "deletes_timers"),
    [(Fulfilment, {}, False), (PaymentTimeout, {"t.Wait": 60.0}, True)],
    ids=["no-timers", "a-pending-timer"],
)
def test_a_completing_step_deletes_timers_only_where_its_instance_may_have_them(
    box: MessageBox,
    running,
    orchestration: type[Orchestration[BaseModel]],
    extra: dict[str, object],
    deletes_timers: bool,
):
    # Given an orchestration whose order step waits for the payment with a timer (or
    # one that never waits), and the statements of every engine recorded
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    app, sink = make_app(orchestration, sink_kinds=("confirm", "ship"))
    running(app)
    box.publish([msg("order", 1, **extra)])
    wait_until(lambda: len(instance_rows(box)) == 1, 30, "the instance")
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        # When its payment's step completes the instance
        box.publish([msg("payment", 1)])
        wait_until(lambda: len(sink.got) == 1, 30, "the completing step's publication")
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    # Then the completion deleted the instance's timers only when it had one pending,
    # and none is left either way
    deleted = [s for s in statements if s.startswith("DELETE FROM mb_timer")]
    assert bool(deleted) is deletes_timers, deleted
    with box.store.transaction() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(mb_schema.timer)).scalar() == 0
    assert [r.state for r in instance_rows(box)] == ["completed"]


def test_timers_survive_a_restart_of_the_host(box: MessageBox, running):
    # Given an order waiting 1 s for its payment, whose host stops right away
    app, sink = make_app(PaymentTimeout, sink_kinds=("ship", "cancel"))
    first = running(app)
    box.publish([msg("order", 7, **{"t.Wait": 1.0})])
    wait_until(lambda: len(instance_rows(box)) == 1, 10, "the instance")
    first.stop(5.0)
    # When a new host instance starts after the due time (by the database's clock)
    probe = box.consumer("orch", "test")
    wait_until(lambda: probe.next_due() == 0.0, 10, "the timer to be due")
    running(app)
    # Then the timeout fires from the stored timer
    wait_until(lambda: len(sink.got) == 1, 20, "the cancel")
    assert sink.got[0][:2] == ("cancel", 7)


class Short(Orchestration[Conversation]):
    """Completes on its first message, leaving later ones unconsumed."""

    name = "short"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.complete()

    @receive(P("t.Kind") == "note")
    def note(self, d: Delivery) -> None:
        self.state.seen.append("note")


def test_messages_queued_for_a_completed_instance_are_suspended_as_zombies(
    box: MessageBox, running
):
    # Given, before any host runs, an order that creates an instance, then two more
    # orders (the convoy) and a note (the instance subscription), all queued for it
    app, _ = make_app(Short)
    app.setup(box)
    box.publish([msg("order", 10), msg("order", 10, **{"t.N": 2}), msg("note", 10)])
    box.publish([msg("order", 10, **{"t.N": 3})])
    q = mb_schema.queue
    with box.store.transaction() as conn:
        assert len(set(conn.execute(sa.select(q.c.instance_id)).scalars())) == 1
    # When a host runs it: the first message completes the instance
    running(app)
    # Then the three it never consumed are suspended, not resumable, with a report
    # naming the instance
    wait_until(lambda: len(box.suspended(reason=INSTANCE_COMPLETED)) == 3, 20, "three zombies")
    [instance] = instance_rows(box)
    assert instance.state == "completed"
    for z in box.suspended(reason=INSTANCE_COMPLETED):
        assert not z.resumable
        assert z.report is not None
        assert z.report["service"] == "short"
        assert z.report["instance"] == instance.id
    with pytest.raises(UnknownSuspendedEntry, match="not resumable"):
        box.resume(box.suspended(reason=INSTANCE_COMPLETED)[0].id)
    # and afterwards a note finds no instance (a routing failure, re-routable), while an
    # order starts a new instance
    [routed] = box.publish([msg("note", 10)])
    assert routed.subscriptions == ()
    assert len(box.suspended(reason=ROUTING_FAILURE)) == 1
    box.publish([msg("order", 10, **{"t.N": 4})])
    wait_until(lambda: len(instance_rows(box)) == 2, 20, "a new instance")


class Flaky(Orchestration[Conversation]):
    """Fails on a 'bad' message until it is told to stop failing."""

    name = "flaky"
    correlation = ("t.OrderId",)
    fail = True

    @activate(P("t.Kind") == "item")
    def item(self, d: Delivery) -> None:
        if d.properties.get("t.Bad") and Flaky.fail:
            raise RuntimeError("cannot handle this one yet")
        self.state.seen.append(str(d.properties["t.Seq"]))
        self.publish(Message(",".join(self.state.seen), promoted={"t.Kind": "progress"}))


def test_a_failing_step_suspends_the_instance_until_resumed(box: MessageBox, running):
    # Given an instance whose second message fails every attempt
    Flaky.fail = True
    app, sink = make_app(Flaky, sink_kinds=("progress",))
    running(app, max_attempts=2)
    box.publish([msg("item", 1, **{"t.Seq": 0})])
    box.publish([msg("item", 1, **{"t.Seq": 1, "t.Bad": True})])
    box.publish([msg("item", 1, **{"t.Seq": 2}), msg("item", 2, **{"t.Seq": 0})])
    # Then the failing message is suspended (resumable), its later message waits, and
    # other instances go on
    wait_until(lambda: len(box.suspended()) == 1, 20, "the suspension")
    wait_until(lambda: (2, b"0") in sink.kinds("progress"), 20, "the other instance")
    # a later message of the other instance is handled: instance 1's waiting message
    # (older) would have been claimed first, had it been claimable
    box.publish([msg("item", 2, **{"t.Seq": 1})])
    wait_until(
        lambda: (2, b"0,1") in sink.kinds("progress") and settled(box),
        20,
        "the other instance's next message",
    )
    assert [b for o, b in sink.kinds("progress") if o == 1] == [b"0"]
    assert waiting(box) == [("flaky", 1)]
    assert sorted(r.state for r in instance_rows(box)) == ["running", "suspended"]
    # When the cause is fixed and the message resumed
    Flaky.fail = False
    [entry] = box.suspended()
    assert entry.resumable
    box.resume(entry.id)
    # Then the instance goes on, in order: each step's progress holds the steps before
    # it (the sink, on 4 threads, may receive them in any order)
    wait_until(lambda: len([1 for o, _ in sink.kinds("progress") if o == 1]) == 3, 20, "resume")
    assert sorted(b for o, b in sink.kinds("progress") if o == 1) == [b"0", b"0,1", b"0,1,2"]


class Counting(BaseModel):
    n: int = 0


class OneAtATime(Orchestration[Counting]):
    """Detects two steps of one instance running at once."""

    name = "exclusive"
    correlation = ("t.OrderId",)
    active: ClassVar[Counter[str]] = Counter()
    overlaps: ClassVar[int] = 0
    guard: ClassVar[threading.Lock] = threading.Lock()

    @activate(P("t.Kind") == "tick")
    def tick(self, d: Delivery) -> None:
        with OneAtATime.guard:
            OneAtATime.active[self.instance_id] += 1
            if OneAtATime.active[self.instance_id] > 1:
                OneAtATime.overlaps += 1
        time.sleep(0.003)
        self.state.n += 1
        with OneAtATime.guard:
            OneAtATime.active[self.instance_id] -= 1
        if self.state.n == 40:
            self.publish(Message(b"", promoted={"t.Kind": "counted"}))


def test_an_instance_handles_one_message_at_a_time_across_host_instances(box: MessageBox, running):
    # Given two host instances with 4 dequeue threads each
    app, sink = make_app(OneAtATime, sink_kinds=("counted",))
    running(app)
    running(app)
    # When 40 messages for each of 3 instances are queued at once
    box.publish([msg("tick", o) for _ in range(40) for o in ("a", "b", "c")])
    # Then each instance counted 40 with no two steps overlapping
    wait_until(lambda: len(sink.kinds("counted")) == 3, 60, "three counts")
    assert OneAtATime.overlaps == 0
    assert sorted(o for o, _ in sink.kinds("counted")) == ["a", "b", "c"]


def test_an_uncorrelated_orchestration_makes_an_instance_per_message(box: MessageBox, running):
    class Each(Orchestration[Counting]):
        name = "each"

        @activate(P("t.Kind") == "job")
        def job(self, d: Delivery) -> None:
            self.publish(Message(self.instance_id, promoted={"t.Kind": "job-done"}))
            self.complete()

    app, sink = make_app(Each, sink_kinds=("job-done",))
    running(app)
    box.publish([msg("job", n) for n in range(5)])
    wait_until(lambda: len(sink.kinds("job-done")) == 5, 20, "five jobs")
    assert len({b for _, b in sink.kinds("job-done")}) == 5


# --- declaring orchestrations: clear errors ---


def test_bad_orchestration_classes_are_refused_with_the_culprit_named():
    with pytest.raises(ValidationError, match="no @activate receive"):

        class NoActivate(Orchestration[Counting]):
            correlation = ("t.OrderId",)

            @receive(P("t.Kind") == "x")
            def x(self, d: Delivery) -> None: ...

    with pytest.raises(ValidationError, match="@receive needs a correlation"):

        class NoCorrelation(Orchestration[Counting]):
            @activate(P("t.Kind") == "x")
            def x(self, d: Delivery) -> None: ...

            @receive(P("t.Kind") == "y")
            def y(self, d: Delivery) -> None: ...

    with pytest.raises(ValidationError, match=r"@timeout\('nope'\) names no receive"):

        class BadTimeout(Orchestration[Counting]):
            @activate(P("t.Kind") == "x")
            def x(self, d: Delivery) -> None: ...

            @timeout("nope")
            def late(self) -> None: ...

    with pytest.raises(ValidationError, match="correlation"):

        class BadName(Orchestration[Counting]):
            correlation = ("no dots",)

            @activate(P("t.Kind") == "x")
            def x(self, d: Delivery) -> None: ...

    class Overridden(PaymentTimeout):  # a subclass overrides a receive's body only
        name = "overridden"

        def payment(self, d: Delivery) -> None:
            self.complete()

    assert Overridden.receives["payment"].method is Overridden.payment
    assert Overridden.receives["payment"].filter == PaymentTimeout.receives["payment"].filter

    app = HostApp("h")
    app.orchestration(PaymentTimeout)
    with pytest.raises(Exception, match="twice"):
        app.orchestration(PaymentTimeout)


def test_a_step_that_breaks_the_rules_fails_and_stores_nothing(box: MessageBox, running):
    class Rude(Orchestration[Counting]):
        name = "rude"
        correlation = ("t.OrderId",)

        @activate(P("t.Kind") == "order")
        def order(self, d: Delivery) -> None:
            self.publish(Message(b"x", promoted={"t.Kind": "sent"}))
            if d.properties["t.OrderId"] == 1:
                self.wait_for("order", timeout=1)  # no @timeout("order") method
            elif d.properties["t.OrderId"] == 2:
                self.publish(Message(b"y", promoted={"messagebox.MessageType": "forged"}))
            else:  # outside the step's transaction: refused
                d.publish([Message(b"z", promoted={"t.Kind": "sent"})])

    app, sink = make_app(Rude, sink_kinds=("sent",))
    running(app, max_attempts=1)
    box.publish([msg("order", 1), msg("order", 2), msg("order", 3)])
    wait_until(lambda: len(box.suspended()) == 3, 20, "all three suspended")
    errors = " ".join(e.error or "" for e in box.suspended())
    assert "needs a @timeout('order') method" in errors
    assert "reserved" in errors
    assert "self.publish()" in errors
    assert sink.got == []  # the step's publication was not committed
    rows = instance_rows(box)
    assert rows == []  # nor was the instance


def test_cleanup_deletes_completed_instances_past_their_retention(box: MessageBox, running):
    from messagebox.delivery.cleanup import run

    # Given a completed instance
    app, _ = make_app(Short)
    running(app)
    box.publish([msg("order", 77)])
    wait_until(lambda: [r.state for r in instance_rows(box)] == ["completed"], 20, "completion")
    # When cleanup runs with the default retention (a day), it is kept for reporting
    assert run(box.store).purged_instances == 0
    assert len(instance_rows(box)) == 1
    # and past its retention it is deleted
    assert run(box.store, instance_retention_seconds=0).purged_instances == 1
    assert instance_rows(box) == []


def test_cleanup_deletes_the_convoy_of_an_instance_that_never_started(box: MessageBox):
    from messagebox.delivery.cleanup import run

    # Given a convoy whose only message was terminated before any host handled it
    app, _ = make_app(Short)
    app.setup(box)
    box.publish([msg("order", 78)])
    box.set_service_state("short", "unenlisted")
    box.terminate(*[e.id for e in box.suspended()])
    # When cleanup runs past the retention, the convoy row goes too
    assert run(box.store, instance_retention_seconds=0).purged_instances == 1
    with box.store.transaction() as conn:
        assert conn.execute(sa.select(mb_schema.convoy)).first() is None


def test_a_failing_first_step_holds_the_rest_of_its_convoy(box: MessageBox, running):
    # Given a convoy whose first message fails every attempt (no instance exists yet)
    Flaky.fail = True
    app, sink = make_app(Flaky, sink_kinds=("progress",))
    running(app, max_attempts=2)
    box.publish([msg("item", 5, **{"t.Seq": 0, "t.Bad": True})])
    box.publish([msg("item", 5, **{"t.Seq": 1}), msg("item", 5, **{"t.Seq": 2})])
    # Then it is suspended and the convoy's later messages wait for it
    wait_until(lambda: len(box.suspended()) == 1, 20, "the suspension")
    # another convoy's later message is handled: the held ones (older) would have been
    # claimed first, had they been claimable
    box.publish([msg("item", 6, **{"t.Seq": 0})])
    wait_until(lambda: bool(sink.kinds("progress")) and settled(box), 20, "the other convoy")
    assert sink.kinds("progress") == [(6, b"0")]
    assert waiting(box) == [("flaky", 2)]
    # When it is resumed once the cause is fixed, the convoy goes on in order
    Flaky.fail = False
    box.resume(box.suspended()[0].id)
    wait_until(lambda: len(sink.kinds("progress")) == 4, 20, "the convoy")
    # each step's progress holds the steps before it (the sink, on 4 threads, may
    # receive them in any order)
    assert sorted(b for o, b in sink.kinds("progress") if o == 5) == [b"0", b"0,1", b"0,1,2"]
