"""Claiming ahead (hosts/dispatch.py, ``ClaimedAhead``): where claims are serialised in-process
(DuckDB), and in an instance that runs orchestrations, one claim takes up to
``max_in_flight`` entries and the instance's dequeue threads handle them in batches of
``claim_batch`` (orchestration steps together). Each entry is still handled once,
batches keep their size, what no thread took is given back at a stop, and outcomes
owed to a next claim are recorded even when every thread stays busy. On PostgreSQL
(several processes compete) a claim of plain services stays one thread's batch."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.delivery.consumer import Consumer
from messagebox.hosts import Delivery, HostApp, HostInstance, Orchestration, activate
from messagebox.hosts.claiming import READ_BATCHES
from messagebox.hosts.cutting import STEP_BATCHES
from messagebox.outcomes import ClaimAsk
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import FAST_HOST, Stalled, wait_for

FAST = FAST_HOST


@pytest.fixture
def instances() -> Iterator[list[HostInstance]]:
    started: list[HostInstance] = []
    yield started
    for inst in started:
        inst.stop(5)


def _setup(box: MessageBox, n: int) -> None:
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="s")
    box.publish([Message(f"{i}".encode(), promoted={"t.N": i}) for i in range(n)])


def _spy_claims(inst: HostInstance) -> list[int]:
    """The size of every claim the instance makes (in order)."""
    sizes: list[int] = []
    claim = inst.queue.claim

    def counted(*args: Any, **kwargs: Any) -> tuple[list[Claim], Any]:
        claims, recorded = claim(*args, **kwargs)
        if claims:
            sizes.append(len(claims))
        return claims, recorded

    inst.queue.claim = counted  # type: ignore[method-assign]
    return sizes


def _instance(
    box: MessageBox, service: object, threads: int, batch: int, most: int
) -> tuple[HostInstance, list[int]]:
    """A host instance of ``h`` (not started) and the sizes of the claims it makes."""
    inst = HostInstance(
        box,
        "h",
        {"svc": service},
        settings={
            **FAST,
            "dequeue_threads": threads,
            "claim_batch": batch,
            "max_in_flight": most,
        },
    )
    return inst, _spy_claims(inst)


class _Batched:
    """A service that takes batches (``handle_many``), keeping each batch."""

    def __init__(self) -> None:
        self.batches: list[list[Delivery]] = []
        self.lock = threading.Lock()

    def handle(self, d: Delivery) -> None:
        self.handle_many([d])

    def handle_many(self, ds: list[Delivery]) -> list[Exception | None]:
        with self.lock:
            self.batches.append(ds)
        return [None] * len(ds)

    def sizes(self) -> list[int]:
        with self.lock:
            return [len(b) for b in self.batches]


def _due(box: MessageBox) -> int:
    """Entries unleased and due (their retry's time has come)."""
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    q.c.lease_owner.is_(None), q.c.available_at <= sa.func.now()
                )
            ).scalar_one()
        )


def _rows(box: MessageBox) -> list[Any]:
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return list(conn.execute(sa.select(q.c.id, q.c.attempts, q.c.lease_owner)).all())


def test_one_claim_serves_every_thread_in_batches_of_claim_batch(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    _setup(box, 120)
    many = _Batched()
    inst, sizes = _instance(box, many, 4, 10, 60)
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    batches = many.sizes()
    handled = Counter(int(d.properties["t.N"]) for b in many.batches for d in b)  # type: ignore[arg-type]
    assert handled == Counter(range(120))  # each once
    assert batches
    assert max(batches) <= 10
    assert sum(sizes) == 120
    if box.backend == "duckdb":
        assert max(sizes) > 10  # a claim took batches for other threads ...
        assert max(sizes) <= 60  # ... within max_in_flight
        assert len(sizes) < len(batches)
    else:
        assert max(sizes) <= 10  # each claim is one thread's batch


def test_a_stop_gives_back_what_was_claimed_ahead_and_no_thread_took(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    _setup(box, 10)
    slow = Stalled()
    inst, sizes = _instance(box, slow, 1, 1, 10)
    inst.start()
    slow.stop_midway(inst)
    assert len(slow.handled) == 1
    if box.backend == "duckdb":
        assert sizes == [10]  # all ten in one claim: nine waited in the instance
        assert inst.stats.snapshot()["given_back"] == 9
    else:
        assert sizes == [1]
    rows = _rows(box)
    assert len(rows) == 9
    assert all(attempts == 0 and owner is None for _, attempts, owner in rows)
    # a later instance delivers them, each once
    again: Counter[int] = Counter()
    lock = threading.Lock()

    def count(d: Delivery) -> None:
        with lock:
            again[d.entry_id] += 1

    instances.append(HostInstance(box, "h", {"svc": count}, settings=FAST).start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    assert sorted(again) == sorted(r.id for r in rows)
    assert set(again.values()) == {1}


def test_outcomes_owed_to_a_claim_are_recorded_while_every_thread_is_busy(
    duckdb_url: str, instances: list[HostInstance]
) -> None:
    """Entry 0 is handled at once; its thread then takes a batch claimed ahead, so its
    outcome is owed to the next claim, which cannot come while both threads wait in
    handlers: the housekeeper records it."""
    box = MessageBox(duckdb_url, publisher="tests")
    _setup(box, 3)
    release = threading.Event()
    waiting: list[int] = []
    lock = threading.Lock()

    def handler(d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        if n == 0:
            return
        with lock:
            waiting.append(n)
        release.wait(20)

    inst, sizes = _instance(box, handler, 2, 1, 10)
    instances.append(inst.start())
    try:
        wait_for(lambda: len(waiting) == 2, what="both threads in a handler")
        assert sizes == [3]  # one claim: no other claim records entry 0's outcome
        wait_for(lambda: len(_rows(box)) == 2, what="entry 0's completion recorded")
        assert len(waiting) == 2  # still both busy: the housekeeper recorded it
    finally:
        release.set()
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    wait_for(lambda: inst.stats.snapshot()["completed"] == 3, what="three completions counted")
    inst.stop(5)
    box.close()


def test_a_batch_claimed_ahead_needs_no_permit_to_be_handled(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """Two threads, two permits, two entries: the entry claimed for the other thread is
    handled while the first handler still waits (its permit was taken with the claim)."""
    _setup(box, 2)
    second = threading.Event()

    def handler(d: Delivery) -> None:
        if d.properties["t.N"] == 0:
            assert second.wait(10), "entry 1 was not handled while entry 0 was"
        else:
            second.set()

    inst, _ = _instance(box, handler, 2, 1, 2)
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    wait_for(lambda: inst.stats.snapshot()["completed"] == 2, what="two completions counted")
    assert inst.stats.snapshot()["failed"] == 0


class _Tally(BaseModel):
    n: int = 0


class _Counted(Orchestration[_Tally]):
    correlation = ("t.N",)

    @activate(P("t.Kind") == "step")
    def step(self, d: Delivery) -> None:
        self.state.n += 1


def test_orchestration_steps_of_one_claim_go_to_a_thread_together(
    box: MessageBox, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's orchestration steps are handled and committed together, up to
    ``STEP_BATCHES`` batches' worth; its other entries keep batches of
    ``claim_batch``."""
    committed: list[int] = []
    lock = threading.Lock()
    commit_steps = Consumer.commit_steps

    def counted(self: Consumer, steps: Any, publisher: str) -> int:
        with lock:
            committed.append(len(steps))
        return commit_steps(self, steps, publisher)

    monkeypatch.setattr(Consumer, "commit_steps", counted)
    many = _Batched()
    app = HostApp("h", **{**FAST, "dequeue_threads": 2, "claim_batch": 3})
    app.orchestration(_Counted)
    app.add_service("svc", many)
    app.subscribe("svc", filter=P("t.Kind") == "plain", name="plain")
    app.setup(box)
    box.publish([Message(b"s", promoted={"t.Kind": "step", "t.N": i}) for i in range(30)])
    box.publish([Message(b"p", promoted={"t.Kind": "plain", "t.N": i}) for i in range(30)])
    # every step and plain entry claimed before the instance starts handling
    instances.append(HostInstance(box, "h", app.services).start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    wait_for(lambda: sum(committed) == 30 and sum(many.sizes()) == 30, what="every entry handled")
    si = mb_schema.service_instance
    with box.store.transaction() as conn:
        states = conn.execute(sa.select(si.c.state, si.c.data)).all()
    assert len(states) == 30  # each step once, each its own instance
    assert max(many.sizes()) <= 3
    assert 3 < max(committed) <= STEP_BATCHES * 3


@pytest.mark.parametrize(
    ("seconds", "n"), [(0.04, 200), (0.0, 3000)], ids=["slow-steps", "fast-steps"]
)
def test_an_orchestration_host_claims_ahead_at_the_pace_of_its_steps(
    box: MessageBox, instances: list[HostInstance], seconds: float, n: int
) -> None:
    """An instance that runs orchestrations claims for all its threads on both
    backends: up to a floor in flight (four batches a thread on DuckDB, 160 here; on
    PostgreSQL one batch a thread, at least 100, what it held before), and beyond it, up
    to ``max_in_flight`` (sixteen batches a thread: 640), only what its threads
    finished in the last ``AHEAD_SECONDS``. Steps of 40 ms (4 threads finish at most
    100 a second) are never claimed for deeper than the floor; fast ones are."""
    stop = threading.Event()

    class Paced(Orchestration[_Tally]):
        correlation = ("t.N",)

        @activate(P("t.Kind") == "step")
        def step(self, d: Delivery) -> None:
            stop.wait(seconds)
            self.state.n += 1

    app = HostApp("h", **{**FAST, "claim_batch": 10})
    app.orchestration(Paced)
    app.setup(box)
    box.publish([Message(b"s", promoted={"t.Kind": "step", "t.N": i}) for i in range(n)])
    inst = HostInstance(box, "h", app.services)
    sizes = _spy_claims(inst)
    instances.append(inst.start())
    try:
        wait_for(lambda: not box.queue_depth(), what="the queue to drain", timeout=120)
    finally:
        stop.set()
    floor = 160 if box.backend == "duckdb" else 100
    assert sum(sizes) == n
    if seconds:
        assert max(sizes) <= floor
    else:
        assert floor < max(sizes) <= 640


class _Slow:
    """A service whose every delivery takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.stop = threading.Event()

    def __call__(self, _d: Delivery) -> None:
        self.stop.wait(self.seconds)


@pytest.mark.parametrize(
    ("seconds", "n"), [(0.02, 400), (0.0, 6000)], ids=["slow-handlers", "fast-handlers"]
)
def test_claiming_ahead_follows_the_pace_of_the_handlers(
    box: MessageBox, instances: list[HostInstance], seconds: float, n: int
) -> None:
    """On DuckDB a claim takes entries for the other threads up to four batches a thread
    in flight (160 here), and beyond it, up to ``max_in_flight`` (sixteen: 640), only
    what the threads finished in the last ``AHEAD_SECONDS``: handlers of 20 ms (4
    threads finish about 200 entries a second, 100 in half a second) are never claimed
    for deeper than the four batches, fast ones are. On PostgreSQL each claim stays one
    thread's batch."""
    _setup(box, n)
    service = _Slow(seconds)
    inst = HostInstance(box, "h", {"svc": service}, settings={**FAST, "claim_batch": 10})
    sizes = _spy_claims(inst)
    instances.append(inst.start())
    try:
        wait_for(lambda: not box.queue_depth(), what="the queue to drain", timeout=60)
    finally:
        service.stop.set()
    assert sum(sizes) == n
    if box.backend != "duckdb":
        assert max(sizes) <= 10
    elif seconds:
        assert max(sizes) <= 160
    else:
        assert 160 < max(sizes) <= 640


class _Reading:
    """A service that reads each message's body, keeping what it read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        body = d.body
        with self.lock:
            self.bodies.append(body)


def test_batches_of_one_claim_read_their_messages_together(
    box: MessageBox, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On DuckDB the plain batches one claim takes for several threads read their
    messages in one query, ``READ_BATCHES`` batches at a time; on PostgreSQL a batch
    reads its own."""
    reads: list[int] = []
    lock = threading.Lock()
    read_messages = MessageBox.read_messages

    def recorded(self: MessageBox, message_ids: Any, **options: Any) -> Any:
        ids = list(message_ids)
        with lock:
            reads.append(len(ids))
        return read_messages(self, ids, **options)

    monkeypatch.setattr(MessageBox, "read_messages", recorded)
    _setup(box, 120)
    reading = _Reading()
    inst, _ = _instance(box, reading, 4, 10, 120)
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    assert sorted(reading.bodies) == sorted(f"{i}".encode() for i in range(120))  # each once
    assert sum(reads) == 120  # each message read once
    if box.backend == "duckdb":
        assert 10 < max(reads) <= READ_BATCHES * 10
    else:
        assert max(reads) <= 10


def test_threads_of_an_orchestration_host_do_not_claim_against_each_other(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """An instance's threads claim instance heads one at a time (on DuckDB every claim
    is serialised; on PostgreSQL such an instance's threads take turns): a claim comes
    back empty only when nothing is left unclaimed. Threads claiming at once chose the
    same heads, and all but one came back empty while hundreds were claimable."""
    empty_while_left: list[int] = []
    app = HostApp("h", **{**FAST, "claim_batch": 10})
    app.orchestration(_Counted)
    app.setup(box)
    box.publish([Message(b"s", promoted={"t.Kind": "step", "t.N": i}) for i in range(400)])
    inst = HostInstance(box, "h", app.services)
    claim = inst.queue.claim

    def counted(*args: Any, **kwargs: Any) -> tuple[list[Claim], Any]:
        got, recorded = claim(*args, **kwargs)
        if not got:  # entries are only ever leased or deleted here: none may be left
            left = sum(1 for _, _, owner in _rows(box) if owner is None)
            if left:
                empty_while_left.append(left)
        return got, recorded

    inst.queue.claim = counted  # type: ignore[method-assign]
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    assert empty_while_left == []


def test_batches_claimed_ahead_wake_threads_that_sleep_after_an_empty_claim(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """Entries can become claimable with no publish to wake anyone (a retry falls
    due; an instance's next message once its step commits). A thread that found
    nothing sleeps up to ``poll_max_seconds``; when another thread's claim then takes a
    batch for it, it is woken to handle it, not left asleep while the batch waits.

    Entry 1 holds thread A. Entries 2 and 3 fail once (retried 0.2 s later, silently),
    so thread B's next claim is empty and B sleeps (30 s). A, released, claims both:
    one for itself, one ahead for B. Their second attempts meet at a barrier, which
    only B, woken, can make them pass."""
    release = threading.Event()
    meet = threading.Barrier(2, timeout=10)
    failed_once: set[int] = set()
    met: list[int] = []
    lock = threading.Lock()
    empty_claims: list[int] = []

    def handler(d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        if n == 1:
            assert release.wait(20)
            return
        if d.attempt == 1:
            with lock:
                failed_once.add(n)
            raise RuntimeError("first attempt fails")
        meet.wait()
        with lock:
            met.append(n)

    app = HostApp(
        "h",
        **{
            **FAST,
            "dequeue_threads": 2,
            "claim_batch": 1,
            "poll_min_seconds": 30.0,
            "poll_max_seconds": 30.0,
            "heartbeat_seconds": 5.0,
            "dead_after_seconds": 30.0,
            "retry_backoff_seconds": 0.2,
        },
    )
    app.orchestration(_Counted)  # on PostgreSQL, what makes an instance claim ahead
    app.add_service("svc", handler)
    app.subscribe("svc", filter=P("t.Kind") == "plain", name="plain")
    app.setup(box)
    box.publish([Message(b"p", promoted={"t.Kind": "plain", "t.N": i}) for i in (1, 2, 3)])
    inst = HostInstance(box, "h", app.services)
    claim = inst.queue.claim

    def counted(*args: Any, **kwargs: Any) -> tuple[list[Claim], Any]:
        got, recorded = claim(*args, **kwargs)
        if not got:
            with lock:
                empty_claims.append(1)
        return got, recorded

    inst.queue.claim = counted  # type: ignore[method-assign]
    instances.append(inst.start())
    try:
        wait_for(lambda: failed_once == {2, 3}, what="entries 2 and 3 failing once")
        wait_for(lambda: bool(empty_claims), what="an empty claim (the other thread asleep)")
        wait_for(lambda: _due(box) == 2, what="both retries due")
    finally:
        release.set()
    wait_for(lambda: len(met) == 2, what="entries 2 and 3 handled at once", timeout=15)


def test_a_host_with_an_ordered_subscription_still_claims_ahead_and_keeps_each_run_whole(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """An ordered subscription on a host no longer turns its claims into one thread's
    batch at a time (on DuckDB the host delivered all its entries 8x slower for it): a
    claim still takes batches for the other threads, and an ordered run it takes stays
    whole with the thread that claimed it, so the ordered entries are handled one after
    the other in publish order while the plain ones spread over the threads."""
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="plain")
    box.subscribe("svc", host="h", filter=P("t.N") < 60, name="ordered", ordered=True)
    box.publish([Message(f"{i}".encode(), promoted={"t.N": i}) for i in range(300)])
    lock = threading.Lock()
    handled: list[tuple[str, int, str]] = []  # in the order handlers ran
    running: set[str] = set()  # threads in an ordered handler now
    overlaps: list[int] = []

    def handler(d: Delivery) -> None:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        me = threading.current_thread().name
        if d.subscription.name == "ordered":
            with lock:
                if running:
                    overlaps.append(n)  # two ordered handlers at once: a run was split
                running.add(me)
            time.sleep(0.001)  # room for another thread to overlap, were the run split
            with lock:
                running.discard(me)
        with lock:
            handled.append((d.subscription.name, n, me))

    inst, sizes = _instance(box, handler, 4, 10, 80)
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain")
    wait_for(lambda: inst.stats.snapshot()["completed"] == 360, what="360 completions counted")
    assert Counter((s, n) for s, n, _ in handled) == Counter(
        [("plain", n) for n in range(300)] + [("ordered", n) for n in range(60)]
    )
    assert [n for s, n, _ in handled if s == "ordered"] == list(range(60))
    assert overlaps == []
    assert len({t for s, _, t in handled if s == "plain"}) > 1  # the plain ones spread
    if box.backend == "duckdb":
        assert max(sizes) > 10  # a claim took batches for the other threads too


def _ordered_and_correlated(box: MessageBox, n: int, ordered: int) -> None:
    """Host ``h``: a plain subscription, an ordered one of the first ``ordered``
    messages, and an ordered one correlated by ``t.K`` (seven instances); ``n``
    messages published."""
    box.create_host("h", **FAST)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="plain")
    box.subscribe("svc", host="h", filter=P("t.N") < ordered, name="ord", ordered=True)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="conv", ordered=True, correlation=["t.K"]
    )
    box.publish([Message(f"{i}".encode(), promoted={"t.N": i, "t.K": i % 7}) for i in range(n)])


def test_entries_of_an_ordered_correlated_subscription_are_each_handled_once(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """An ordered subscription that is also correlated queues entries that are both
    ordered and a service instance's: they go with its runs, never as instance heads,
    beside another ordered subscription and a plain one, in shared claims. Each entry
    is handled once, and the instance's permits come out even."""
    _ordered_and_correlated(box, 300, 150)
    lock = threading.Lock()
    handled: Counter[tuple[str, int]] = Counter()

    def handler(d: Delivery) -> None:
        with lock:
            handled[(d.subscription.name, int(d.properties["t.N"]))] += 1  # type: ignore[arg-type]

    inst, _ = _instance(box, handler, 4, 10, 80)
    instances.append(inst.start())
    wait_for(lambda: not box.queue_depth(), what="the queue to drain", timeout=60)
    expected = 300 + 150 + 300
    wait_for(lambda: inst.stats.snapshot()["completed"] == expected, what="completions counted")
    assert set(handled.values()) == {1}
    assert len(handled) == expected
    wait_for(lambda: inst._parts.claimer.permits.taken() == 0, what="every permit given back")


def test_a_shared_claim_gives_the_ordered_run_whole_to_one_ask_and_no_entry_twice(
    box: MessageBox,
) -> None:
    """Three threads' asks served by one claim: the first ask's share holds the ordered
    run (at most what it asked for, in publish order), no entry of an ordered
    subscription is outside it (an ordered, correlated subscription's go with its run,
    never as instance heads), no share is longer than its ask, and no entry is in two
    shares."""
    _ordered_and_correlated(box, 60, 40)
    ord_id = next(s.id for s in box.subscriptions() if s.name == "ord")
    consumer = box.consumer("h", "a")
    asks = [ClaimAsk(10, True, None, run) for run in (6, 6, 0)]
    shares = [claims for claims, _ in consumer._claim_shares(asks, 30.0)]
    taken = [c.id for share in shares for c in share]
    assert len(taken) == len(set(taken)) == 30  # every ask filled, no entry twice
    assert [len(share) for share in shares] == [10, 10, 10]
    run = [c for c in shares[0] if c.run]
    assert [c.sub for c in run] == [ord_id] * 6  # the run: the first ask's, whole
    assert [c.id for c in run] == sorted(c.id for c in run)
    assert not any(c.run for share in shares[1:] for c in share)
    assert not [c for share in shares for c in share if c.ordered and not c.run]
