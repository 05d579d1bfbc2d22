"""Hand-over (messagebox/storage/handover.py): where one process holds the database
(DuckDB), a publish leases the plain entries it queues for an idle host instance of the
process and hands them over once it commits, without a claim; on PostgreSQL every
entry is claimed. Either way each entry is handled once, and nothing a rolled-back
publish or a stopping instance held is lost or held up."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.hosts import Delivery, HostApp, HostInstance
from messagebox.hosts.batch import BatchHandler
from messagebox.hosts.claiming import Claimer
from messagebox.predicates import P
from messagebox.storage import schema
from tests.integration.orchestration_support import wait_until


class _Seen:
    """The entries handed over, and what was handled: the message's ``t.N``, the
    attempt, and whether the delivery was an interrupted one's."""

    def __init__(self) -> None:
        self.handed: list[int] = []
        self.handled: list[tuple[int, int, bool]] = []
        self.interrupted: dict[str, bool] = {}
        self.lock = threading.Lock()

    def record(self, d: Delivery, sign: int = 1) -> None:
        n = sign * int(d.properties["t.N"])  # type: ignore[arg-type]
        with self.lock:
            self.handled.append((n, d.attempt, self.interrupted.get(str(d.message_id), False)))


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> _Seen:
    s = _Seen()
    handed = Claimer.handed

    def spy(self: Claimer, claims: list[Claim]) -> None:
        with s.lock:
            s.handed.extend(c.id for c in claims)
        handed(self, claims)

    handle = BatchHandler.handle

    def spy_handle(self: BatchHandler, claims: list[Claim]) -> Any:
        with s.lock:
            s.interrupted.update((str(c.msg), c.interrupted) for c in claims)
        return handle(self, claims)

    monkeypatch.setattr(Claimer, "handed", spy)
    monkeypatch.setattr(BatchHandler, "handle", spy_handle)
    return s


def _app(seen: _Seen, **settings: Any) -> HostApp:
    app = HostApp("hand", dequeue_threads=1, claim_batch=10, poll_max_seconds=0.05, **settings)

    @app.service("work")
    def work(d: Delivery) -> None:
        seen.record(d)

    app.subscribe("work", filter=P("t.N") >= 0, name="work")
    return app


def _started(
    box: MessageBox, running: Callable[..., HostInstance], app: HostApp, **settings: Any
) -> HostInstance:
    """An instance of ``app``, once its first claim has found the queue empty."""
    app.setup(box)
    instance = running(app, **settings)
    wait_until(lambda: instance._parts.claimer.drained, 30, "an empty claim")
    return instance


def _queue_rows(box: MessageBox) -> int:
    with box.store.transaction() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(schema.queue)).scalar_one())


def _handed_here(box: MessageBox) -> bool:
    return box.store.dialect.one_process


def test_a_publish_hands_its_entries_to_an_idle_instance(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    instance = _started(box, running, _app(seen))
    routed = box.publish([Message(b"x", promoted={"t.N": i}) for i in range(3)])
    wait_until(lambda: len(seen.handled) == 3, 30, "three handled")
    assert sorted(seen.handled) == [(0, 1, False), (1, 1, False), (2, 1, False)]
    if _handed_here(box):  # leased as stored: no claim took them
        assert len(seen.handed) == 3
    else:
        assert seen.handed == []
    assert len(routed) == 3
    wait_until(lambda: _queue_rows(box) == 0, 30, "the completions recorded")
    assert instance._parts.claimer.permits.taken() == 0


def test_a_rolled_back_publish_hands_nothing_and_gives_its_permits_back(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    instance = _started(box, running, _app(seen))
    reserved: list[int] = []

    def publish_then_fail() -> None:
        with box.transaction() as conn:
            box.publish([Message(b"x", promoted={"t.N": 1})], connection=conn)
            reserved.append(instance._parts.claimer.permits.taken())
            raise RuntimeError("the caller's own failure")

    with pytest.raises(RuntimeError, match="the caller's own failure"):
        publish_then_fail()
    assert reserved == [1 if _handed_here(box) else 0]  # reserved, not yet handed over
    assert instance._parts.claimer.permits.taken() == 0
    assert seen.handed == []
    assert seen.handled == []
    box.publish([Message(b"x", promoted={"t.N": 2})])
    wait_until(lambda: seen.handled == [(2, 1, False)], 30, "the next publish handled")
    assert _queue_rows(box) <= 1  # nothing of the first publish stored


def test_a_delayed_entry_is_claimed_when_due_not_handed_over(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    _started(box, running, _app(seen))
    box.publish([Message(b"x", promoted={"t.N": 7})], delay=0.2)
    box.publish([Message(b"x", promoted={"t.N": 8})])
    wait_until(lambda: len(seen.handled) == 2, 30, "both handled")
    assert seen.handled == [(8, 1, False), (7, 1, False)]
    assert len(seen.handed) == (1 if _handed_here(box) else 0)  # the entry due now


@pytest.mark.parametrize("kind", ["ordered", "ordered_by"])
def test_nothing_is_handed_to_an_instance_of_a_host_with_ordered_entries(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen, kind: str
) -> None:
    """Where a host has an ordered subscription (or one ordered by a property), a claim
    that took fewer entries than it asked for may have left entries whose run or key
    was busy: so its instances are handed nothing, and claim after every batch."""
    app = _app(seen)

    @app.service("inorder")
    def inorder(d: Delivery) -> None:
        seen.record(d, sign=-1)

    order: dict[str, Any] = {"ordered": True} if kind == "ordered" else {"ordered_by": "t.K"}
    app.subscribe("inorder", filter=P("t.N") >= 0, name="inorder", **order)
    _started(box, running, app)
    box.publish([Message(b"x", promoted={"t.N": n, "t.K": 1}) for n in (7, 8)])  # one key
    wait_until(lambda: len(seen.handled) == 4, 30, "all four handled")
    assert sorted(seen.handled) == [(-8, 1, False), (-7, 1, False), (7, 1, False), (8, 1, False)]
    assert [n for n, _, _ in seen.handled if n < 0] == [-7, -8]  # in order
    assert seen.handed == []


def test_an_instance_with_a_backlog_takes_it_in_order_not_handed_over(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    """While its claims come back full (a backlog), nothing is handed to the instance:
    a new entry does not overtake older ones."""
    gate = threading.Event()
    app = HostApp("hand", dequeue_threads=1, claim_batch=2, poll_max_seconds=0.05)

    @app.service("work")
    def work(d: Delivery) -> None:
        gate.wait(30)
        seen.record(d)

    app.subscribe("work", filter=P("t.N") >= 0, name="work")
    app.setup(box)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(20)])
    instance = running(app, max_in_flight=2)
    wait_until(lambda: instance._parts.claimer.permits.taken() > 0, 30, "a full claim")
    assert not instance._parts.claimer.drained
    box.publish([Message(b"x", promoted={"t.N": 20})])
    assert seen.handed == []
    gate.set()
    wait_until(lambda: len(seen.handled) == 21, 30, "all handled")
    assert [n for n, _, _ in seen.handled][-1] == 20


def test_what_a_stopping_instance_was_handed_is_delivered_by_the_next_at_once(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    """A publish that reserved before the stop and commits after it gave back what it
    held: the entry's lease is given back at once (not left to lapse), and the next
    instance handles it as a first, uninterrupted delivery."""
    instance = _started(box, running, _app(seen, lease_seconds=600))
    with box.transaction() as conn:
        box.publish([Message(b"x", promoted={"t.N": 5})], connection=conn)
        assert instance.stop(0.2)  # the close waits 0.2 s for this publish, then goes on
    if _handed_here(box):
        wait_until(lambda: instance._parts.claimer.permits.taken() == 0, 30, "given back")
    assert seen.handled == []
    running(_app(seen))
    wait_until(lambda: seen.handled == [(5, 1, False)], 30, "handled by the next instance")


def test_entries_whose_publish_stayed_open_past_half_the_lease_are_claimed_not_handed(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    """A lease set when the publish began may have lapsed by its commit (a claim could
    have taken the entry again): such entries are given back, then claimed, once."""
    _started(box, running, _app(seen, lease_seconds=0.4))
    with box.transaction() as conn:
        box.publish([Message(b"x", promoted={"t.N": 3})], connection=conn)
        held = threading.Event()
        held.wait(0.3)  # the transaction stays open past half the lease (0.2 s)
    wait_until(lambda: seen.handled == [(3, 1, False)], 30, "handled once")
    assert seen.handed == []
    wait_until(lambda: _queue_rows(box) == 0, 30, "the completion recorded")


def test_concurrent_publishers_and_two_instances_handle_each_entry_once(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    """Four publishers of small batches, two instances of the host in this process (each
    of four threads, small batches, few permits): hand-overs and claims interleave, and
    every entry is handled exactly once, none left behind."""
    app = HostApp("hand", dequeue_threads=4, claim_batch=3, poll_max_seconds=0.05)

    @app.service("work")
    def work(d: Delivery) -> None:
        seen.record(d)

    app.subscribe("work", filter=P("t.N") >= 0, name="work")
    first = _started(
        box, running, app, max_in_flight=32
    )  # few permits: some claimed (10-15 handed here)
    second = running(app, max_in_flight=32)
    per, publishers = 150, 4

    def publish(start: int) -> None:
        for i in range(start, start + per, 3):
            box.publish([Message(b"x", promoted={"t.N": n}) for n in range(i, i + 3)])

    threads = [threading.Thread(target=publish, args=(k * per,)) for k in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total = per * publishers
    wait_until(lambda: len(seen.handled) >= total, 60, "every entry handled")
    wait_until(lambda: _queue_rows(box) == 0, 30, "every completion recorded")
    assert sorted(n for n, _, _ in seen.handled) == list(range(total))  # each once
    assert all(attempt == 1 for _, attempt, _ in seen.handled)
    for claimer in (first._parts.claimer, second._parts.claimer):
        wait_until(partial(lambda c: c.permits.taken() == 0, claimer), 30, "permits back")


def test_an_instance_whose_threads_are_all_busy_leaves_the_entry_to_a_free_one(
    box: MessageBox, running: Callable[..., HostInstance], seen: _Seen
) -> None:
    """Two instances of the host in this process, one thread each: while the first's
    thread is held by a message, the next goes to the second at once, not into the
    first's waiting batches."""
    gate = threading.Event()
    app = HostApp("hand", dequeue_threads=1, claim_batch=10, poll_max_seconds=0.05)

    @app.service("work")
    def work(d: Delivery) -> None:
        if d.properties["t.N"] == 0:
            gate.wait(30)
        seen.record(d)

    app.subscribe("work", filter=P("t.N") >= 0, name="work")
    first = _started(box, running, app)
    second = running(app)
    wait_until(lambda: second._parts.claimer.drained, 30, "the second's empty claim")
    box.publish([Message(b"x", promoted={"t.N": 0})])
    wait_until(
        lambda: len(first._parts.in_flight) + len(second._parts.in_flight) == 1,
        30,
        "the first message in hand",
    )
    box.publish([Message(b"x", promoted={"t.N": 1})])
    wait_until(lambda: [n for n, _, _ in seen.handled] == [1], 30, "the second handled first")
    gate.set()
    wait_until(lambda: len(seen.handled) == 2, 30, "both handled")
