"""A batch's outcomes are recorded with the next claim, in one transaction (issue 20), on
both backends: what is recorded, what is claimed, lost leases, the general path for
failures and give-backs, a host instance whose claims fail, and PostgreSQL's pooled
connections tested only after being idle."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.claims import Claim, Failure
from messagebox.delivery import leases as mb_leases
from messagebox.delivery.consumer import Consumer
from messagebox.errors import BackendUnavailable, StorageError
from messagebox.hosts import Delivery, HostInstance
from messagebox.hosts.dispatch import Permits
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from messagebox.storage.dialects import postgresql as pg_dialect
from tests.conftest import wait_for


def setup(box: MessageBox, n: int) -> Consumer:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0, name="s")
    box.publish([Message(f"m{i}".encode(), promoted={"t.N": i}) for i in range(n)])
    return box.consumer("h", "a")


def outcomes(
    done: list[Claim],
    failed: list[Failure] | None = None,
    unstarted: list[Claim] | None = None,
) -> Outcomes:
    return Outcomes(done, failed or [], unstarted or [], HostSettings(), set())


def queued(box: MessageBox) -> dict[int, str | None]:
    """Queue entries and who leases them."""
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return {int(r.id): r.lease_owner for r in conn.execute(sa.select(q.c.id, q.c.lease_owner))}


def released(box: MessageBox) -> Counter[str]:
    """References released, per message."""
    r = mb_schema.ref_release
    with box.store.transaction() as conn:
        return Counter({str(m): int(n) for m, n in conn.execute(sa.select(r.c.msg, r.c.n))})


def test_completions_and_the_next_claim_commit_together(box: MessageBox) -> None:
    consumer = setup(box, 4)
    first, none = consumer.claim(2, 30.0, ordered=False, instances=False)
    assert none is None
    assert len(first) == 2
    claims, recorded = consumer.claim(
        10, 30.0, ordered=False, instances=False, outcomes=outcomes(first)
    )
    assert recorded is not None
    assert (recorded.finished.completed, recorded.finished.lost, recorded.given) == (2, 0, 0)
    assert {c.id for c in claims}.isdisjoint(c.id for c in first)
    assert len(claims) == 2
    assert set(queued(box)) == {c.id for c in claims}  # the completed entries are gone
    assert released(box) == Counter({str(c.msg): 1 for c in first})
    assert all(owner == "a" for owner in queued(box).values())


def test_a_claim_with_completions_gives_the_claims_a_claim_alone_gives(box: MessageBox) -> None:
    # Given entries claimed once, one whose lease lapsed, and entries never claimed
    consumer = setup(box, 6)
    first, _ = consumer.claim(2, 30.0, ordered=False, instances=False)
    [lapsed], _ = consumer.claim(1, 0.001, ordered=False, instances=False)
    with box.store.transaction() as conn:  # the others have waited 5 s since the publish
        conn.execute(
            mb_schema.queue.update()
            .where(mb_schema.queue.c.lease_owner.is_(None))
            .values(enqueued_at=box.store.dialect.now_plus(-5.0))
        )
    # When the next claim records the first two (PostgreSQL: in one statement)
    fused, recorded = consumer.claim(
        10, 30.0, ordered=False, instances=False, outcomes=outcomes(first)
    )
    assert recorded is not None
    assert recorded.finished.completed == 2
    # Then each claim holds what a claim alone reads: the lapsed entry again, not
    # waited again, interrupted; the others with their first wait
    by_id = {c.id: c for c in fused}
    again = by_id.pop(lapsed.id)
    assert (again.attempts, again.waited, again.interrupted) == (2, None, True)
    assert again.msg == lapsed.msg
    assert again.enqueued_at == lapsed.enqueued_at
    assert len(by_id) == 3
    for c in by_id.values():
        assert isinstance(c.id, int)
        assert isinstance(c.sub, int)
        assert (c.attempts, c.priority, c.charges) == (1, 0, 0)
        assert (c.ordered, c.interrupted) == (False, False)
        assert (c.instance_id, c.crashed_by) == (None, None)
        assert c.waited is not None
        assert 5.0 <= c.waited < 60.0
        assert c.enqueued_at is not None
    with box.store.transaction() as conn:  # the times are the stored ones, as instants
        q = mb_schema.queue
        stored = dict(conn.execute(sa.select(q.c.id, q.c.enqueued_at)).all())
    for c in fused:
        assert c.enqueued_at is not None
        assert c.enqueued_at.utcoffset() is not None
        assert c.enqueued_at == stored[c.id]
    assert [c.id for c in fused] == sorted(c.id for c in fused)  # claim order
    # and a claim with nothing to record says nothing completed
    rest, recorded = consumer.claim(10, 30.0, ordered=False, instances=False, outcomes=outcomes([]))
    assert rest == []


def test_a_completion_is_never_claimed_again_in_its_own_transaction(box: MessageBox) -> None:
    consumer = setup(box, 1)
    [c] = consumer.claim(1, 0.001, ordered=False, instances=False)[0]  # lapses at once
    claims, recorded = consumer.claim(
        5, 30.0, ordered=False, instances=False, outcomes=outcomes([c])
    )
    assert claims == []
    assert recorded is not None
    assert recorded.finished.completed == 1
    assert queued(box) == {}


def test_a_completion_whose_lease_another_instance_took_is_lost(box: MessageBox) -> None:
    consumer = setup(box, 1)
    [c] = consumer.claim(1, 0.001, ordered=False, instances=False)[0]
    other = box.consumer("h", "b")
    taken: list[Claim] = []

    def take() -> bool:
        taken.extend(other.claim(1, 30.0, ordered=False, instances=False)[0])
        return bool(taken)

    wait_for(take, "the lapsed lease taken by another instance")
    claims, recorded = consumer.claim(
        5, 30.0, ordered=False, instances=False, outcomes=outcomes([c])
    )
    assert recorded is not None
    assert (recorded.finished.completed, recorded.finished.lost) == (0, 1)
    assert claims == []
    assert queued(box) == {c.id: "b"}
    assert released(box) == Counter()


def test_failures_and_give_backs_are_recorded_with_the_next_claim(box: MessageBox) -> None:
    consumer = setup(box, 3)
    c0, c1, c2 = consumer.claim(3, 30.0, ordered=False, instances=False)[0]
    claims, recorded = consumer.claim(
        3,
        30.0,
        ordered=False,
        instances=False,
        outcomes=outcomes([c0], [Failure(c1, "boom", permanent=True)], [c2]),
    )
    assert recorded is not None
    assert (recorded.finished.completed, recorded.finished.suspended, recorded.given) == (1, 1, 1)
    assert [(c.id, c.attempts) for c in claims] == [(c2.id, 1)]  # given back, then claimed
    assert len(box.suspended()) == 1


def test_a_host_instance_whose_claims_fail_still_records_each_outcome_once(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's transaction fails every other time: the outcomes it carried are then
    recorded on their own, so nothing is delivered twice and nothing is lost."""
    setup(box, 0)
    real = mb_leases.claim
    real_fused = mb_leases.complete_and_claim
    calls = Counter[str]()
    lock = threading.Lock()

    def flaky(kind: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                calls[kind] += 1
                fail = calls[kind] % 2 == 0
            if fail:
                raise StorageError("the store refused the claim (test)")
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(mb_leases, "claim", flaky("claim", real))
    monkeypatch.setattr(mb_leases, "complete_and_claim", flaky("fused", real_fused))
    seen: Counter[int] = Counter()

    def service(d: Delivery) -> None:
        with lock:
            seen[int(d.properties["t.N"])] += 1  # type: ignore[arg-type]

    settings = {"claim_batch": 3, "poll_min_seconds": 0.01, "poll_max_seconds": 0.05}
    with HostInstance(box, "h", {"s": service}, settings=settings) as inst:
        box.publish([Message(b"x", promoted={"t.N": i}) for i in range(30)])
        # the counters follow the commit that empties the queue: wait for both
        wait_for(
            lambda: not box.queue_depth() and inst.stats.snapshot()["completed"] >= 30,
            "the queue drained and every outcome counted",
        )
        stats = inst.stats.snapshot()
    assert seen == Counter(range(30))
    assert stats["completed"] == 30
    assert stats["redelivered"] == 0
    assert sum(calls.values()) > 4  # claims did fail along the way


def test_permits_can_be_asked_without_waiting() -> None:
    permits, stopping = Permits(2), threading.Event()
    assert permits.take(5, stopping) == 2
    assert permits.take(5, stopping, wait=False) == 0
    permits.give(1)
    assert permits.take(5, stopping, wait=False) == 1


# --- PostgreSQL: pooled connections are tested only after being idle ---


def _kill_pooled(box: MessageBox) -> None:
    """End the server side of the store's pooled connection."""
    with box.store.transaction() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    url = box.store.dialect.listen_dsn(box.store.url)  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.mark.postgres
@pytest.mark.parametrize("idle_after", [0.0, 3600.0], ids=["tested", "recently-used"])
def test_a_pooled_connection_that_died_is_replaced(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, idle_after: float
) -> None:
    """Tested on checkout (idle past PING_AFTER_IDLE_SECONDS): replaced, unseen. Used
    within it: not tested, so its transaction fails once, and the pool recovers."""
    monkeypatch.setattr(pg_dialect, "PING_AFTER_IDLE_SECONDS", idle_after)
    box = MessageBox(pg_url)
    try:
        box.create_host("h")
        _kill_pooled(box)
        if idle_after:
            with pytest.raises(BackendUnavailable):
                box.queue_depth()
        assert box.queue_depth() == []
    finally:
        box.close()


def test_a_host_instance_warns_at_start_when_the_server_never_vacuums(
    box: MessageBox, caplog: pytest.LogCaptureFixture
) -> None:
    """On PostgreSQL with autovacuum off (as a test server may run), the queue's dead
    rows pile up and claims slow down: the instance says so when it starts. DuckDB, and
    a server with autovacuum on, start without a word of it."""
    setup(box, 0)
    off = False
    if box.store.dialect.name == "postgresql":
        with box.store.transaction() as conn:
            off = conn.exec_driver_sql("SHOW autovacuum").scalar() == "off"
    with (
        caplog.at_level("WARNING", logger="messagebox.hosts"),
        HostInstance(box, "h", {"s": lambda _d: None}),
    ):
        pass
    warned = [r for r in caplog.records if getattr(r, "event", None) == "store-warning"]
    assert bool(warned) == off
    if off:
        assert "autovacuum is off" in warned[0].getMessage()


def test_what_each_kind_of_claim_returns_is_what_it_stored(box: MessageBox) -> None:
    # Given plain, ordered and service-instance entries on one host, claimed once and
    # their leases lapsed, one of each kind marked started (its host ended during it)
    box.create_host("h")
    box.subscribe("plain", host="h", filter=P("t.K") == "p", name="plain")
    box.subscribe("seq", host="h", filter=P("t.K") == "o", name="seq", ordered=True)
    box.subscribe("conv", host="h", filter=P("t.K") == "i", name="conv", correlation=["t.N"])

    def publish(numbers: range) -> None:
        box.publish(
            [Message(b"m", promoted={"t.K": k, "t.N": i}) for k in ("p", "o", "i") for i in numbers]
        )

    def take(owner: str) -> list[Claim]:
        with box.store.transaction(serial=True) as conn:
            return mb_leases.claim(
                conn,
                box.store.dialect,
                host="h",
                owner=owner,
                n=20,
                lease_seconds=30.0,
                ordered=True,
                instances=True,
            )

    publish(range(3))
    first = take("gone")
    assert len(first) == 9
    started = {
        min(c.id for c in first if c.ordered),
        min(c.id for c in first if c.instance_id is not None),
        min(c.id for c in first if not c.ordered and c.instance_id is None),
    }
    q = mb_schema.queue
    with box.store.transaction() as conn:
        conn.execute(
            q.update().values(lease_expires=sa.func.now() - sa.text("INTERVAL '1 second'"))
        )
        conn.execute(q.update().where(q.c.id.in_(started)).values(started_by="gone"))
    # and entries never claimed
    publish(range(10, 13))
    # When each kind is claimed
    claims = take("me")
    # Then what each claim says of its entry is what the entry now holds
    assert len(claims) == 18
    with box.store.transaction() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(q))}
        now = conn.execute(sa.select(sa.func.now())).scalar_one()
    for c in claims:
        row = rows[c.id]
        assert (row.lease_owner, row.attempts, row.charges) == ("me", c.attempts, c.charges), c
        assert (row.interrupted, row.crashed_by) == (c.interrupted, c.crashed_by), c
        assert row.started_by is None
        assert (row.msg, row.sub, row.priority) == (c.msg, c.sub, c.priority), c
        assert (row.instance_id, row.ordered) == (c.instance_id, c.ordered), c
        assert row.lease_expires > now
        if c.id in started:  # after a delivery that ended while started: charged
            assert (c.attempts, c.charges, c.interrupted, c.crashed_by) == (2, 1, True, "gone"), c
        elif c.id in {f.id for f in first}:  # after a lapsed lease, unstarted: not charged
            assert (c.attempts, c.charges, c.interrupted, c.crashed_by) == (2, 0, True, None), c
        else:  # a first delivery, and how long it waited
            assert (c.attempts, c.charges, c.interrupted, c.crashed_by) == (1, 0, False, None), c
            assert c.waited is not None
            assert c.waited >= 0
        if c.attempts > 1:
            assert c.waited is None
