"""The host store contract, continued (see ``test_store_contract``): scheduled delivery,
expiry, host instances (dead, unregistered, of no process), service instances' steps
and timers, stopped services, instances' heads, ordered runs beside plain and keyed
entries, and completing in a transaction; on the memory store, DuckDB and PostgreSQL
alike."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from messagebox.claims import Claim, Failure
from messagebox.errors import Conflict, LeaseLost
from messagebox.message import Message
from messagebox.models import EXPIRED, InstanceState
from messagebox.port import HostStore
from messagebox.predicates import P
from messagebox.steps import Step, TimerSpec
from messagebox.upkeep import Swept
from tests.contract.conftest import Harness, info
from tests.contract.support import LONG, SHORT, catch_all, claim, messages, outcomes

# --- scheduled delivery and expiry ---


def test_a_scheduled_entry_is_not_claimed_before_it_is_due(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1), delay=LONG)
    a = store.port("h", "a")
    assert claim(a) == []
    wait = a.next_available()
    assert wait is not None
    assert LONG - 10 < wait <= LONG


def test_a_scheduled_entry_is_claimed_once_due(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1), delay=SHORT)
    a = store.port("h", "a")
    [c] = store.eventually(lambda: claim(a))
    assert c.attempts == 1
    assert a.next_available() is None


def test_expired_entries_are_swept_as_their_subscriptions_say(store: Harness) -> None:
    kept = store.subscribe("kept", host="h", filter=P("a.K") == 1).id
    store.subscribe("dropped", host="h", filter=P("a.K") == 2, on_expiry="drop")
    store.publish(messages(1, 2, ttl=SHORT))
    a = store.port("h", "a")
    assert a.expire().total == 0
    swept = Swept()

    def sweep() -> bool:
        got = a.expire()
        swept.suspended += got.suspended
        swept.dropped += got.dropped
        return swept.total == 2

    assert store.eventually(sweep)
    assert (swept.suspended, swept.dropped) == (1, 1)
    assert store.queue("h") == []
    [parked] = store.suspended()
    assert (parked.sub, parked.reason, parked.resumable) == (kept, EXPIRED, True)


def test_an_expired_entry_is_never_claimed_and_one_in_hand_is_not_swept(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2, ttl=SHORT * 2))
    a = store.port("h", "a")
    [held] = claim(a, 1)
    assert store.eventually(lambda: a.expire().total == 1)
    assert [r.id for r in store.queue("h")] == [held.id]  # in hand: its delivery finishes
    assert claim(store.port("h", "b")) == []


# --- host instances ---


def test_a_dead_instances_leases_are_released(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2))
    a, b = store.port("h", "a"), store.port("h", "b")
    claimed = claim(a)
    assert b.release_dead(LONG) == ([], 0)

    def release() -> tuple[list[str], int] | None:
        found = b.release_dead(SHORT)
        return found if found[0] else None

    assert store.eventually(release) == (["a"], 2)
    again = claim(b)
    assert sorted(c.id for c in again) == sorted(c.id for c in claimed)
    assert all(c.interrupted and c.attempts == 2 for c in again)
    assert a.heartbeat(LONG, [], info("h", "a")) is False  # it was declared dead


def test_unregistering_releases_the_leases(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1, 2))
    a, b = store.port("h", "a"), store.port("h", "b")
    claimed = claim(a)
    assert a.unregister() == 2
    again = claim(b)
    assert sorted(c.id for c in again) == sorted(c.id for c in claimed)
    assert all(c.interrupted for c in again)


def test_leases_held_by_an_instance_of_no_process_are_seen(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a = store.port("h", "a")
    assert not a.held_elsewhere()
    claim(store.port("h", "stranger", register=False))
    assert a.held_elsewhere()


# --- service instances: steps and timers ---


def _activation(store: Harness) -> tuple[int, Claim, HostStore]:
    sub = store.subscribe("orch", host="h", filter=P("a.K").exists()).id
    store.publish(messages(1))
    port = store.port("h", "a")
    [c] = claim(port)
    return sub, c, port


def _step(c: Claim, sub: int, version: int | None, **fields: Any) -> Step:
    return Step(
        owner="a", entry_id=c.id, instance_id="i1", service="orch", host="h", sub=sub,
        version=version, data=fields.pop("data", {"n": 1}), **fields,
    )  # fmt: skip


def test_a_step_commits_the_instance_and_its_entry(store: Harness) -> None:
    sub, c, port = _activation(store)
    _now, stored, convoys = port.load(["i1"])
    assert stored == {}
    assert convoys == set()
    assert port.commit_steps([_step(c, sub, None)], "orchestration:orch") == 0
    _, stored, _ = port.load(["i1", "nobody"])
    assert set(stored) == {"i1"}
    i1 = stored["i1"]
    assert (i1.version, i1.state, i1.data, i1.service) == (
        1,
        InstanceState.RUNNING,
        {"n": 1},
        "orch",
    )
    assert store.queue("h") == []


def test_a_step_from_a_stale_version_or_a_lost_lease_commits_nothing(store: Harness) -> None:
    sub, c, port = _activation(store)
    port.commit_steps([_step(c, sub, None)], "p")
    store.publish(messages(2))
    [c2] = claim(port)
    with pytest.raises(Conflict):
        port.commit_steps([_step(c2, sub, 7)], "p")
    with pytest.raises(LeaseLost):
        port.commit_steps([_step(c2._replace(id=c2.id + 1000), sub, 1)], "p")
    assert [r.id for r in store.queue("h")] == [c2.id]
    port.commit_steps([_step(c2, sub, 1, data={"n": 2})], "p")
    assert port.load(["i1"])[1]["i1"].version == 2


def test_a_steps_publications_are_routed(store: Harness) -> None:
    sub, c, port = _activation(store)
    other = store.subscribe("out", host="h", filter=P("a.Out") == 1).id
    step = _step(c, sub, None, publish=[Message(b"y", promoted={"a.Out": 1})])
    port.commit_steps([step], "p")
    assert [r.sub for r in store.queue("h")] == [other]


def test_a_completed_instance_discards_its_queued_messages(store: Harness) -> None:
    sub, c, port = _activation(store)
    store.subscribe("feed", host="h", filter=P("a.Feed") == 1, kind="instance", instance_id="i1")
    port.commit_steps([_step(c, sub, None)], "p")
    store.publish([Message(b"z", promoted={"a.Feed": 1})])
    [fed] = claim(port, instances=True)
    assert fed.instance_id == "i1"
    port.record(outcomes(unstarted=[fed]))
    store.publish(messages(5))
    [c3] = [x for x in claim(port) if x.instance_id is None]
    assert port.commit_steps([_step(c3, sub, 1, complete=True)], "p") == 1
    assert port.load(["i1"])[1]["i1"].state is InstanceState.COMPLETED
    assert store.queue("h") == []


def test_a_timer_fires_when_due(store: Harness) -> None:
    sub, c, port = _activation(store)
    now, _, _ = port.load([])
    timer = TimerSpec("t", now + timedelta(seconds=SHORT))
    port.commit_steps([_step(c, sub, None, timers=[timer], data={"timers": ["t"]})], "p")
    due = port.next_due()
    assert due is not None
    assert due <= SHORT
    fired: Counter[str] = Counter()

    def fire() -> bool:
        fired.update(port.fire_timers())
        return bool(fired)

    assert store.eventually(fire)
    assert fired == Counter({"h": 1})
    assert port.next_due() is None
    [timeout] = claim(port, instances=True)
    assert (timeout.instance_id, timeout.sub) == ("i1", sub)


def test_a_cancelled_timer_never_fires(store: Harness) -> None:
    sub, c, port = _activation(store)
    now, _, _ = port.load([])
    timer = TimerSpec("t", now + timedelta(seconds=LONG))
    port.commit_steps([_step(c, sub, None, timers=[timer], data={"timers": ["t"]})], "p")
    assert port.next_due() is not None
    store.publish(messages(2))
    [c2] = claim(port)
    port.commit_steps([_step(c2, sub, 1, cancel=["t"])], "p")
    assert port.next_due() is None
    assert port.fire_timers() == Counter()


# --- more of the queue: stopped services, instances, completing in a transaction ---


def test_a_stopped_subscription_holds_its_entries(store: Harness) -> None:
    catch_all(store, state="stopped")
    store.publish(messages(1, 2))
    assert [r.state for r in store.queue("h")] == ["held", "held"]
    assert claim(store.port("h", "a"), ordered=True, instances=True) == []
    assert store.port("h", "b").next_available() is None


def test_a_service_instance_handles_one_message_at_a_time(store: Harness) -> None:
    store.subscribe("inst", host="h", filter=P("a.K").exists(), kind="instance", instance_id="x")
    store.publish(messages(1, 2, 3))
    ids = [r.id for r in store.queue("h")]
    a, b = store.port("h", "a"), store.port("h", "b")
    assert claim(a) == []  # never a plain claim's
    [head] = claim(a, instances=True)
    assert (head.id, head.instance_id) == (ids[0], "x")
    assert claim(b, instances=True) == []  # the instance is busy
    a.record(outcomes(done=[head]))
    [nxt] = claim(b, instances=True)
    assert nxt.id == ids[1]


def test_a_suspended_step_holds_its_instance(store: Harness) -> None:
    store.subscribe("inst", host="h", filter=P("a.K").exists(), kind="instance", instance_id="x")
    store.publish(messages(1, 2))
    a = store.port("h", "a")
    [head] = claim(a, instances=True)
    a.record(outcomes(failed=[Failure(head, "bad", permanent=True)]))
    assert [p.id for p in store.suspended()] == [head.id]
    assert claim(a, instances=True) == []  # its later message waits for the resume
    assert len(store.queue("h")) == 1


def test_an_ordered_run_comes_before_plain_entries(store: Harness) -> None:
    ordered = store.subscribe("o", host="h", filter=P("a.K") == 1, ordered=True).id
    store.subscribe("p", host="h", filter=P("a.K") == 2, priority=9)
    store.publish(messages(2, 1, 1, 2))
    claims = claim(store.port("h", "a"), 3, ordered=True, ordered_most=2)
    assert sorted(c.sub == ordered for c in claims) == [False, True, True]
    assert [c.run for c in claims if c.sub == ordered] == [True, True]
    assert len(store.queue("h")) == 4


def test_completing_in_a_transaction_publishes_with_the_completion(store: Harness) -> None:
    catch_all(store)
    out = store.subscribe("out", host="h", filter=P("a.Out") == 1).id
    store.publish(messages(1))
    a = store.port("h", "a")
    [c] = claim(a)
    reply = Message(b"r", promoted={"a.Out": 1})
    with a.completing(lambda: c._replace(publish=(reply,))):
        pass
    assert [r.sub for r in store.queue("h")] == [out]


def test_completing_an_entry_no_longer_held_conflicts(store: Harness) -> None:
    catch_all(store)
    store.publish(messages(1))
    a, b = store.port("h", "a"), store.port("h", "b")
    [c] = claim(a, lease=SHORT)
    [again] = store.eventually(lambda: claim(b))
    with pytest.raises(Conflict), a.completing(lambda: c):
        pass
    assert [r.id for r in store.queue("h")] == [again.id]


def test_keyed_runs_and_plain_entries_in_one_claim(store: Harness) -> None:
    keyed = store.subscribe("k", host="h", filter=P("a.K") == 1, ordered_by="a.Id").id
    plain = store.subscribe("p", host="h", filter=P("a.K") == 2).id
    store.publish(
        [Message(b"x", promoted={"a.K": k, "a.Id": i}) for k, i in ((1, 1), (2, 0), (1, 1), (1, 2))]
    )
    claims = claim(store.port("h", "a"), 10, keyed=10, per_key=1)
    assert sorted(c.sub for c in claims) == sorted([keyed, keyed, plain])
    assert len({c.key for c in claims if c.sub == keyed}) == 2  # one of each key
    assert all(c.key is None for c in claims if c.sub == plain)
    rest = claim(store.port("h", "b"), 10, keyed=10, per_key=1)
    assert rest == []  # key 1's second entry waits for its first
