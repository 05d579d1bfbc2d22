"""Ordered runs longer than a batch (``Claimer.longest_run``), on both backends: a run
grows with the pace of its handlers within ``max_in_flight`` (on PostgreSQL, where a
thread claims for itself, with the permits free when it claims), publish order holds
and each entry is handled once, and a long run records its outcomes as it goes, so
that a crash delivers again no more of it than of the plain batches an instance
holds."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.hosts import Delivery, HostInstance
from messagebox.hosts.dispatch import Pace
from messagebox.predicates import P
from messagebox.storage import schema
from tests.conftest import FAST_HOST, wait_for


def _ordered(box: MessageBox, n: int) -> None:
    box.create_host("h", **FAST_HOST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ordered", ordered=True)
    for start in range(0, n, 500):
        box.publish([Message(b"x", promoted={"t.N": i}) for i in range(start, min(start + 500, n))])


def _instance(box: MessageBox, service: object, **settings: Any) -> HostInstance:
    return HostInstance(
        box,
        "h",
        {"svc": service},
        settings={**FAST_HOST, "dequeue_threads": 4, "claim_batch": 10, **settings},
    )


def _spy_runs(inst: HostInstance) -> list[int]:
    """The length of every ordered run the instance claims."""
    runs: list[int] = []
    claim = inst.queue.claim

    def spied(*args: Any, **kwargs: Any) -> tuple[list[Claim], Any]:
        claims, recorded = claim(*args, **kwargs)
        run = sum(1 for c in claims if c.run)
        if run:
            runs.append(run)
        return claims, recorded

    inst.queue.claim = spied  # type: ignore[method-assign]
    return runs


def test_runs_grow_with_the_pace_and_keep_publish_order(box: MessageBox) -> None:
    n = 3000
    _ordered(box, n)
    lock = threading.Lock()
    handled: list[int] = []

    def handler(d: Delivery) -> None:
        with lock:
            handled.append(int(d.properties["t.N"]))  # type: ignore[arg-type]

    inst = _instance(box, handler)
    runs = _spy_runs(inst)
    inst.start()
    try:
        wait_for(lambda: len(handled) >= n, what=f"{n} deliveries", timeout=120)
        wait_for(lambda: not box.queue_depth(), what="the queue to drain", timeout=60)
    finally:
        inst.stop(10)
    assert handled == list(range(n))  # in publish order, each once
    assert runs[0] == 10  # no pace yet: one batch
    # then longer, within max_in_flight (its default: sixteen batches a thread on DuckDB,
    # where a claim serves every thread; on PostgreSQL a batch a thread, at least 100)
    assert 10 < max(runs) <= inst.settings.in_flight(ahead=box.backend == "duckdb")


def test_the_longest_run_follows_the_pace_of_runs(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ordered(box, 0)
    inst = _instance(box, lambda _d: None, max_in_flight=300)
    try:
        for pace, most in ((0.0, 10), (15.0, 10), (100.0, 50), (10_000.0, 300)):
            monkeypatch.setattr(Pace, "per_second", lambda _self, p=pace: p)
            assert inst._parts.claimer.longest_run() == most, (
                pace
            )  # half a second of runs, within bounds
    finally:
        inst.box.close()


def test_a_long_run_records_its_outcomes_as_it_goes(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of all 400 (its length and the claim's permits unbounded by the handlers'
    pace, which a loaded machine slows: two threads of batches of 10, recorded 20 at a
    time) whose handler stops at entry 300: by then at least 280 are recorded (their
    entries gone), not held until the run ends."""
    n = 400
    _ordered(box, n)
    blocked, release = threading.Event(), threading.Event()
    handled: list[int] = []

    def handler(d: Delivery) -> None:
        number = int(d.properties["t.N"])  # type: ignore[arg-type]
        if number == 300:
            blocked.set()
            release.wait(60)
        handled.append(number)

    inst = _instance(box, handler, dequeue_threads=2, max_in_flight=n)
    claimer = type(inst._parts.claimer)
    monkeypatch.setattr(claimer, "longest_run", lambda _self: n)
    monkeypatch.setattr(claimer, "_ahead_room", lambda self: max(0, n - self.permits.taken()))
    runs = _spy_runs(inst)
    inst.start()
    try:
        wait_for(blocked.is_set, what="the handler at entry 300", timeout=60)
        depth = sum(d.depth for d in box.queue_depth("h"))
        assert runs[0] > 300  # entry 300 is in the first run: held whole, 300 would wait
        assert depth <= n - 280, depth
        release.set()
        wait_for(lambda: not box.queue_depth(), what="the queue to drain", timeout=60)
    finally:
        release.set()
        inst.stop(10)
    assert handled == list(range(n))


def test_a_claim_takes_its_run_then_at_most_rest_most_others(box: MessageBox) -> None:
    box.create_host("h", **FAST_HOST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ordered", ordered=True)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="plain")
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(100)])
    queue = box.consumer("h", "owner-1")
    claims, _ = queue.claim(60, 30.0, ordered=True, instances=False, ordered_most=40, rest_most=5)
    run = [c for c in claims if c.run]
    assert len(run) == 40
    assert len(claims) == 45
    assert [c.id for c in run] == sorted(c.id for c in run)
    assert not any(c.ordered for c in claims if not c.run)  # the others are plain


def test_permits_taken_for_a_long_run_take_no_plain_entries(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a thread claims for itself: the permits it takes for a long run
    bring no plain entries beyond its batch when there is no run to take (other
    processes' instances may take those). On DuckDB a claim serves every thread."""
    box.create_host("h", **FAST_HOST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ordered", ordered=True)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="plain")
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(200)])
    held, _ = box.consumer("h", "elsewhere").claim(  # another instance holds the run
        200, 30.0, ordered=True, instances=False, ordered_most=200, rest_most=0
    )
    assert len(held) == 200
    inst = _instance(box, lambda _d: None, max_in_flight=300)
    monkeypatch.setattr(type(inst._parts.claimer), "longest_run", lambda _self: 200)
    try:
        inst._parts.subscriptions.refresh()
        want = inst._parts.claimer.permits.take(10, inst._stopping)
        claims = inst._parts.claimer.claim_now(want, None, 0)
        assert claims is not None
        assert not any(c.ordered for c in claims)
        if box.backend == "postgresql":
            assert len(claims) == 10
            assert inst._parts.claimer.permits.taken() == 10  # the run's permits went back
    finally:
        inst.box.close()


def _run(box: MessageBox, owner: str, lease_seconds: float = 30.0) -> list[int]:
    claims, _ = box.consumer("h", owner).claim(
        5, lease_seconds, ordered=True, instances=False, ordered_most=5
    )
    return [c.id for c in claims if c.run]


def test_a_subscription_is_busy_while_an_entry_of_its_run_is_in_hand(box: MessageBox) -> None:
    # (on PostgreSQL the entries in hand are found by their own index, run_lease, which
    # the database computes from every lease written: none can be missed)
    box.create_host("h", **FAST_HOST)
    box.subscribe("svc", host="h", filter=P("t.N") < 10, name="first", ordered=True)
    box.subscribe("svc", host="h", filter=P("t.N") >= 10, name="later", ordered=True)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(20)])
    first = _run(box, "one")
    assert len(first) == 5
    other = _run(box, "two")  # the other ordered subscription, never the busy one's
    assert other
    assert not set(other) & set(first)
    assert _run(box, "three") == []  # both busy
    # busy while any entry of the run is in hand, its head free or not
    _lease(box, first[:1], -1.0)
    assert _run(box, "four") == []
    # a run whose leases all lapse is free again, from its head
    _lease(box, first, -1.0)
    assert _run(box, "five") == first
    # and a run whose leases are renewed (but its head's) stays busy
    _lease(box, first[1:], 3600.0)
    _lease(box, first[:1], -1.0)
    assert _run(box, "six") == []


def _lease(box: MessageBox, ids: list[int], seconds: float) -> None:
    """Set the leases of ``ids`` to end ``seconds`` from now (a heartbeat's write)."""
    q = schema.queue
    until = datetime.now(UTC) + timedelta(seconds=seconds)
    with box.store.transaction() as conn:
        conn.execute(q.update().where(q.c.id.in_(ids)).values(lease_expires=until))
