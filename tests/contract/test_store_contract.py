"""One contract for every store a host instance uses (:class:`messagebox.port.HostStore`):
the in-memory store, DuckDB and PostgreSQL are driven through the same scenarios and
must give the same outcomes. Here: claims, leases and attempts, outcomes, retries and
suspension, ordered runs and per-key order; ``test_store_contract_upkeep`` has the rest.
The assignments below are the check (by mypy) that both stores satisfy the port."""

from __future__ import annotations

from typing import Any

from messagebox.claims import Failure
from messagebox.delivery.consumer import Consumer
from messagebox.memory import MemoryConsumer
from messagebox.models import DELIVERY_FAILURE, State
from messagebox.port import HostStore
from messagebox.predicates import P
from tests.contract.conftest import Harness, info
from tests.contract.support import LONG, SHORT, catch_all, claim, messages, outcomes

_sql_port: type[HostStore] = Consumer  # both satisfy the port (mypy checks these)
_memory_port: type[HostStore] = MemoryConsumer

# --- claims and leases ---


def test_each_entry_is_claimed_once_across_two_instances(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(*range(10)))
    a, b = store.port("h", "a"), store.port("h", "b")
    first = claim(a, 4)
    second = claim(b, 10)
    assert len(first) == 4
    assert len(second) == 6
    assert {c.id for c in first}.isdisjoint(c.id for c in second)
    assert {c.id for c in first + second} == {r.id for r in store.queue("h")}
    assert claim(a) == []
    assert claim(b) == []


def test_a_claim_hands_out_by_priority_then_age(store: Harness) -> None:
    low = store.subscribe("low", host="h", filter=P("a.K") == 1).id
    high = store.subscribe("high", host="h", filter=P("a.K") == 2, priority=5).id
    store.publish(messages(1, 2, 1, 2))
    claims = claim(store.port("h", "a"))
    assert [c.sub for c in claims] == [high, high, low, low]
    assert [c.priority for c in claims] == [5, 5, 0, 0]
    assert claims[0].id < claims[1].id
    assert claims[2].id < claims[3].id


def test_a_first_claim_is_attempt_one_and_knows_its_wait(store: Harness) -> None:
    sub = catch_all(store)
    [routed] = store.publish(messages(1))
    [c] = claim(store.port("h", "a"))
    assert (c.msg, c.sub, c.attempts, c.charges) == (routed.message_id, sub, 1, 0)
    assert not c.interrupted
    assert c.crashed_by is None
    assert not c.run
    assert c.key is None
    assert c.waited is not None
    assert c.waited >= 0
    assert c.enqueued_at is not None


def test_a_lapsed_lease_is_claimed_again_as_the_next_attempt(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a, b = store.port("h", "a"), store.port("h", "b")
    [first] = claim(a, lease=SHORT)
    assert claim(b) == []  # in hand
    again = store.eventually(lambda: claim(b))
    assert [c.id for c in again] == [first.id]
    assert again[0].attempts == 2
    assert again[0].interrupted
    assert again[0].waited is None
    assert again[0].charges == 0  # never marked started: not charged
    late = a.record(outcomes(done=[first]))  # a's outcome comes too late: b's now
    assert (late.finished.completed, late.finished.lost) == (0, 1)
    assert [r.lease_owner for r in store.queue("h")] == ["b"]


def test_a_started_delivery_whose_lease_lapses_is_charged(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a, b = store.port("h", "a"), store.port("h", "b")
    [first] = claim(a, lease=SHORT)
    a.mark_started([first])
    [again] = store.eventually(lambda: claim(b))
    assert (again.attempts, again.charges, again.crashed_by) == (2, 1, "a")
    assert again.interrupted


def test_a_heartbeat_extends_the_leases_in_flight(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2))
    a, b = store.port("h", "a"), store.port("h", "b")
    claims = claim(a, lease=SHORT)
    assert a.heartbeat(LONG, [claims[0].id], info("h", "a"))
    # the other entry's lease lapses; the one in flight stays a's
    taken = store.eventually(lambda: claim(b))
    assert [c.id for c in taken] == [claims[1].id]
    assert claim(b) == []


def test_a_heartbeat_of_an_unknown_instance_registers_it_again(store: Harness) -> None:
    a = store.port("h", "a", register=False)
    assert a.heartbeat(LONG, [], info("h", "a")) is False
    assert a.heartbeat(LONG, [], info("h", "a")) is True


def test_completing_deletes_the_entry(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2))
    a = store.port("h", "a")
    claims = claim(a)
    recorded = a.record(outcomes(done=claims[:1]))
    assert (recorded.finished.completed, recorded.finished.lost) == (1, 0)
    assert recorded.finished.completed_ids == [claims[0].id]
    assert [r.id for r in store.queue("h")] == [claims[1].id]


def test_outcomes_recorded_with_the_next_claim(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2, 3))
    a = store.port("h", "a")
    first = claim(a, 1)
    claims, recorded = a.claim(5, LONG, ordered=False, instances=False, outcomes=outcomes(first))
    assert recorded is not None
    assert recorded.finished.completed == 1
    assert len(claims) == 2
    assert first[0].id not in {c.id for c in claims}
    assert len(store.queue("h")) == 2


def test_a_given_back_entry_is_not_an_attempt(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    assert a.record(outcomes(unstarted=[c])).given == 1
    [again] = claim(store.port("h", "b"))
    assert (again.id, again.attempts, again.interrupted) == (c.id, 1, False)


def test_a_recheck_records_only_deliveries_still_held(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a, b = store.port("h", "a"), store.port("h", "b")
    [first] = claim(a, lease=SHORT)
    [again] = store.eventually(lambda: claim(b))
    recorded = a.record(outcomes(done=[first]), recheck=True)
    assert recorded.finished.completed == 0
    assert recorded.finished.lost == 0
    assert [r.id for r in store.queue("h")] == [again.id]


# --- failures ---


def test_a_failure_is_retried_after_its_backoff(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    recorded = a.record(outcomes(failed=[Failure(c, "boom")], retry_backoff_seconds=LONG))
    assert recorded.finished.retried == 1
    assert claim(a) == []
    wait = a.next_available()
    assert wait is not None
    assert 0 < wait <= LONG


def test_a_retried_entry_is_the_next_attempt_charged_once(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    a.record(outcomes(failed=[Failure(c, "boom")], retry_backoff_seconds=SHORT))
    [again] = store.eventually(lambda: claim(a))
    assert (again.id, again.attempts, again.charges, again.interrupted) == (c.id, 2, 1, False)


def test_failures_past_max_attempts_suspend(store: Harness) -> None:
    sub = catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    settings: dict[str, Any] = {"max_attempts": 2, "retry_backoff_seconds": 0.0}
    [c] = claim(a)
    assert a.record(outcomes(failed=[Failure(c, "one")], **settings)).finished.retried == 1
    [c2] = store.eventually(lambda: claim(a))
    recorded = a.record(outcomes(failed=[Failure(c2, "two")], **settings))
    assert (recorded.finished.retried, recorded.finished.suspended) == (0, 1)
    assert store.queue("h") == []
    [parked] = store.suspended()
    assert (parked.id, parked.sub, parked.reason, parked.resumable) == (
        c.id,
        sub,
        DELIVERY_FAILURE,
        True,
    )


def test_a_permanent_failure_suspends_at_once(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    recorded = a.record(outcomes(failed=[Failure(c, "bad", permanent=True)]))
    assert recorded.finished.suspended == 1
    assert [p.id for p in store.suspended()] == [c.id]


def test_a_retry_later_is_not_charged_whatever_max_attempts(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    later = Failure(c, "not yet", retry_after=0.0, charge=False)
    assert a.record(outcomes(failed=[later], max_attempts=1)).finished.retried == 1
    [again] = store.eventually(lambda: claim(a))
    assert (again.attempts, again.charges) == (2, 0)


# --- ordered subscriptions ---


def test_an_ordered_subscription_is_one_run_at_a_time_in_order(store: Harness) -> None:
    catch_all(store, ordered=True)
    store.publish(messages(*range(5)))
    a, b = store.port("h", "a"), store.port("h", "b")
    ids = [r.id for r in store.queue("h")]
    run = claim(a, ordered=True, ordered_most=3)
    assert [c.id for c in run] == ids[:3]
    assert all(c.run and c.ordered for c in run)
    assert claim(b, ordered=True) == []  # its run is in hand
    assert claim(b) == []  # and an ordered entry is never a plain claim's
    a.record(outcomes(done=run))
    rest = claim(b, ordered=True)
    assert [c.id for c in rest] == ids[3:]


def test_an_ordered_failure_that_stops_holds_the_subscription(store: Harness) -> None:
    sub = catch_all(store, ordered=True, on_failure="stop")
    store.publish(messages(*range(3)))
    a = store.port("h", "a")
    run = claim(a, ordered=True, ordered_most=1)
    recorded = a.record(outcomes(failed=[Failure(run[0], "bad", permanent=True)], stop=[sub]))
    assert recorded.finished.stopped_subscriptions == (sub,)
    assert store.sub_state(sub) is State.STOPPED
    assert [r.state for r in store.queue("h")] == ["held", "held"]
    assert claim(a, ordered=True) == []


def test_an_ordered_failure_that_suspends_lets_the_next_go(store: Harness) -> None:
    sub = catch_all(store, ordered=True)
    store.publish(messages(*range(3)))
    a = store.port("h", "a")
    ids = [r.id for r in store.queue("h")]
    [head] = claim(a, ordered=True, ordered_most=1)
    a.record(outcomes(failed=[Failure(head, "bad", permanent=True)], stop=[]))
    assert store.sub_state(sub) is State.STARTED
    assert [c.id for c in claim(a, ordered=True)] == ids[1:]


def test_a_scheduled_head_holds_an_ordered_run(store: Harness) -> None:
    catch_all(store, ordered=True)
    store.publish(messages(1))
    store.publish(messages(2), delay=LONG)
    store.publish(messages(3))
    [first] = claim(store.port("h", "a"), ordered=True)
    assert first.id == store.queue("h")[0].id  # the run ends before the scheduled one
    assert claim(store.port("h", "b"), ordered=True) == []


# --- per-key order ---


def test_keys_go_in_parallel_each_one_at_a_time(store: Harness) -> None:
    catch_all(store, ordered_by="a.K")
    store.publish(messages(1, 2, 1, 2, 1))
    by_key: dict[str | None, list[int]] = {}
    for r in store.queue("h"):
        by_key.setdefault(r.order_key, []).append(r.id)
    a, b = store.port("h", "a"), store.port("h", "b")
    first = claim(a, keyed=10, per_key=1, keyed_only=True)
    assert sorted(c.id for c in first) == sorted(ids[0] for ids in by_key.values())
    assert len({c.key for c in first}) == 2
    assert claim(b, keyed=10, per_key=1, keyed_only=True) == []  # both keys in hand
    one = next(c for c in first if c.id == min(c.id for c in first))
    a.record(outcomes(done=[one]))
    [nxt] = claim(b, keyed=10, per_key=1, keyed_only=True)
    assert nxt.key == one.key
    assert nxt.id == by_key[one.key][1]


def test_a_key_run_comes_in_order(store: Harness) -> None:
    catch_all(store, ordered_by="a.K")
    store.publish(messages(7, 7, 8, 7))
    a = store.port("h", "a")
    claims = claim(a, keyed=10, per_key=2, keyed_only=True)
    sevens = [c.id for c in claims if c.key == claims[0].key]
    assert len(claims) == 3
    assert len(sevens) == 2
    assert sevens == sorted(sevens)
    assert claim(store.port("h", "b"), keyed=0) == []  # a keyed entry is never a plain claim's


def test_a_held_key_does_not_block_other_keys(store: Harness) -> None:
    sub = catch_all(store, ordered_by="a.K", on_failure="stop")
    store.publish(messages(1, 2, 1, 2))
    rows = store.queue("h")
    a = store.port("h", "a")
    first = {c.id: c for c in claim(a, keyed=10, per_key=1, keyed_only=True)}
    assert sorted(first) == [rows[0].id, rows[1].id]
    k1, k2 = first[rows[0].id], first[rows[1].id]
    recorded = a.record(
        outcomes(done=[k2], failed=[Failure(k1, "bad", permanent=True)], stop=[sub])
    )
    assert recorded.finished.held_keys == ((sub, k1.key),)
    assert recorded.finished.stopped_subscriptions == ()  # only the key stops
    [parked] = store.suspended()
    assert (parked.id, parked.holds_key, parked.order_key) == (k1.id, True, k1.key)
    assert store.sub_state(sub) is State.STARTED
    [nxt] = claim(store.port("h", "b"), keyed=10, per_key=5, keyed_only=True)
    assert (nxt.id, nxt.key) == (rows[3].id, k2.key)  # key 2 goes on; key 1 waits
    assert claim(a, keyed=10, per_key=5, keyed_only=True) == []
    assert [r.id for r in store.queue("h")] == [rows[2].id, rows[3].id]


def test_a_retrying_key_waits_while_others_go(store: Harness) -> None:
    catch_all(store, ordered_by="a.K")
    store.publish(messages(1, 2, 1, 2))
    rows = store.queue("h")
    a = store.port("h", "a")
    first = claim(a, keyed=10, per_key=1, keyed_only=True)
    k1 = next(c for c in first if c.id == rows[0].id)
    k2 = next(c for c in first if c.id == rows[1].id)
    a.record(outcomes(done=[k2], failed=[Failure(k1, "boom")], retry_backoff_seconds=LONG))
    [nxt] = claim(a, keyed=10, per_key=5, keyed_only=True)
    assert nxt.id == rows[3].id  # key 2 goes on; key 1's retry holds its later entry
