"""Per-key order in storage (``subscribe(..., ordered_by=...)``; docs/concepts.md: Per-key
order), on both backends: a claim takes the runs of free keys, each in publish order; a
key with an entry in hand, an older entry still to deliver (a retry, a scheduled one) or
a suspended entry holding it waits, and only that key; keys are values by the engine's
equality, a message without the property has a key of its own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.claims import Claim, Failure
from messagebox.models import HostSettings
from messagebox.order_keys import ABSENT, describe, encode
from messagebox.outcomes import Outcomes
from messagebox.predicates import P
from messagebox.storage import schema
from messagebox.storage.dialects.postgresql import PostgreSQLDialect
from tests.conftest import FAST_HOST, wait_for


def _setup(box: MessageBox, *, on_failure: str = "suspend") -> None:
    box.create_host("h", **FAST_HOST)
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="k", ordered_by="t.K", on_failure=on_failure
    )


def _publish(box: MessageBox, keys: Sequence[object], **extra: object) -> list[uuid.UUID]:
    """One message per key given, numbered in order (``t.N``); None: no ``t.K``."""
    messages = [
        Message(b"x", promoted={"t.N": i, **({} if k is None else {"t.K": k})}, **extra)  # type: ignore[arg-type]
        for i, k in enumerate(keys)
    ]
    return [r.message_id for r in box.publish(messages)]


def _claim(box: MessageBox, owner: str = "a", n: int = 50, per_key: int = 50) -> list[Claim]:
    claims, _ = box.consumer("h", owner).claim(
        n, 30.0, ordered=False, instances=False, keyed=n, per_key=per_key, keyed_only=True
    )
    return claims


def _runs(claims: Sequence[Claim], ids: Sequence[uuid.UUID]) -> dict[str, list[int]]:
    """Each claimed key's message numbers, in claim order."""
    number = {m: i for i, m in enumerate(ids)}
    runs: dict[str, list[int]] = {}
    for c in claims:
        runs.setdefault(describe(c.key), []).append(number[c.msg])
    return runs


def _record(
    box: MessageBox,
    owner: str,
    done: Sequence[Claim] = (),
    failed: Sequence[Failure] = (),
    unstarted: Sequence[Claim] = (),
    stop: set[int] | None = None,
) -> None:
    settings = HostSettings(max_attempts=1, retry_backoff_seconds=3600)
    box.consumer("h", owner).record(Outcomes(done, failed, unstarted, settings, stop or set()))


def test_a_claim_takes_each_free_keys_run_in_publish_order_and_a_key_in_hand_waits(
    box: MessageBox,
) -> None:
    _setup(box)
    ids = _publish(box, ["a", "b", "c", "a", "b", "c", "a", "b", "c"])
    first = _claim(box, "one", per_key=2)
    assert _runs(first, ids) == {"'a'": [0, 3], "'b'": [1, 4], "'c'": [2, 5]}
    assert all(c.key is not None and not c.run for c in first)
    # every key has an entry in hand: the rest of each waits
    assert _claim(box, "two") == []
    _record(box, "one", done=[c for c in first if c.key == encode("a")])
    assert _runs(_claim(box, "two"), ids) == {"'a'": [6]}


def test_a_retry_holds_only_its_key(box: MessageBox) -> None:
    _setup(box)
    _publish(box, ["a", "b", "a", "b"])
    claims = _claim(box)
    by_key = {k: [c for c in claims if c.key == encode(k)] for k in "ab"}
    # a's first fails (retried in an hour); the rest of its run goes back unstarted
    failure = Failure(by_key["a"][0], "boom", charge=False, retry_after=3600)
    _record(box, "a", done=by_key["b"], failed=[failure], unstarted=by_key["a"][1:])
    assert _claim(box, "b") == []  # a waits for its retry; b is done
    _publish(box, ["b"])
    assert [describe(c.key) for c in _claim(box, "c")] == ["'b'"]


@pytest.mark.parametrize("on_failure", ["stop", "suspend"])
def test_a_suspended_entry_holds_its_key_only_when_its_subscription_stops_on_failure(
    box: MessageBox, on_failure: str
) -> None:
    _setup(box, on_failure=on_failure)
    sub = box.subscription("k")
    ids = _publish(box, ["a", "b", "a", "b"])
    claims = _claim(box)
    by_key = {k: [c for c in claims if c.key == encode(k)] for k in "ab"}
    failure = Failure(by_key["a"][0], "boom", permanent=True)
    stop = {sub.id} if on_failure == "stop" else set()
    _record(box, "a", failed=[failure], unstarted=by_key["a"][1:], stop=stop)
    [suspended] = box.suspended()
    assert box.subscription("k").state == "started"  # never the whole subscription
    if on_failure == "suspend":  # suspended, and the key goes on
        assert _runs(_claim(box, "b"), ids) == {"'a'": [2]}
        assert box.held_keys() == []
        return
    # held: only its key; the other keys go on
    [held] = box.held_keys()
    assert (held.subscription, held.name, held.shown, held.entry) == (
        sub.id,
        "k",
        "'a'",
        suspended.id,
    )
    assert (held.waiting, held.error, held.reason) == (1, "boom", "delivery-failure")
    assert box.held_keys(host="h") == [held]
    [stats] = box.queue_stats()
    assert (stats.blocked, stats.leased) == (1, 2)
    [blocked] = box.peek_queue("h", state="blocked")
    assert blocked.message_id == ids[2]
    assert blocked.holder == f"blocked: its key 'a' is held by suspended entry {suspended.id}"
    _record(box, "a", done=by_key["b"])
    assert _claim(box, "b") == []
    # resumed: it goes first, then the rest of its key
    box.resume(suspended.id)
    assert box.held_keys() == []
    assert _runs(_claim(box, "c"), ids) == {"'a'": [0, 2]}


def test_a_terminated_holder_releases_its_key(box: MessageBox) -> None:
    _setup(box, on_failure="stop")
    ids = _publish(box, ["a", "a"])
    [first, second] = _claim(box, per_key=2)
    _record(
        box,
        "a",
        failed=[Failure(first, "boom", permanent=True)],
        unstarted=[second],
        stop={box.subscription("k").id},
    )
    [held] = box.held_keys()
    assert _claim(box, "b") == []
    box.terminate(held.entry)
    assert _runs(_claim(box, "c"), ids) == {"'a'": [1]}


def test_keys_are_values_by_the_engines_equality_and_absent_is_one_key(box: MessageBox) -> None:
    _setup(box)
    ids = _publish(box, [1, 1.0, "1", True, None, None, 2**53 + 1, float(2**53)])
    claims = _claim(box, per_key=8)
    assert _runs(claims, ids) == {
        "1": [0, 1],  # an int and a float are one number
        "'1'": [2],  # a string never equals a number
        "true": [3],
        "(absent)": [4, 5],  # every message without the property: one key
        "9007199254740993": [6],
        "9007199254740992": [7],
    }
    assert encode(None) == ABSENT
    assert describe(encode(datetime(2024, 5, 1, tzinfo=UTC))) == "2024-05-01T00:00:00+00:00"


def test_a_scheduled_entry_holds_its_key_and_an_expired_one_is_passed_over(
    box: MessageBox,
) -> None:
    _setup(box)
    later = _publish(box, ["a"], deliver_at=datetime.now(UTC) + timedelta(hours=1))
    ids = _publish(box, ["a", "b", "b"])
    with box.store.transaction() as conn:  # b's first has expired
        q = schema.queue
        conn.execute(
            q.update()
            .where(q.c.msg == ids[1])
            .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    assert _runs(_claim(box), ids) == {"'b'": [2]}
    box.deliver_now(host="h")
    claims = _claim(box, "b")
    assert [c.msg for c in claims] == [later[0], ids[0]]


def test_an_older_entry_back_on_the_queue_waits_for_its_keys_entry_in_hand(
    box: MessageBox,
) -> None:
    # an entry resumed while a later one of its key is being delivered (or, on
    # PostgreSQL, one that committed after a later one was claimed) has the older id:
    # it waits, then goes first
    _setup(box)
    ids = _publish(box, ["a", "a", "a"])
    [first] = _claim(box, per_key=1)
    _record(box, "a", failed=[Failure(first, "boom", permanent=True)])
    [second] = _claim(box, "b", per_key=1)
    assert second.msg == ids[1]
    [suspended] = box.suspended()
    box.resume(suspended.id)
    assert _claim(box, "c") == []  # the second is in hand
    _record(box, "b", done=[second])
    assert _runs(_claim(box, "d"), ids) == {"'a'": [0, 2]}


def _publish_held_open(
    other: MessageBox, n: int, ids: list[uuid.UUID]
) -> tuple[threading.Thread, threading.Event]:
    """A thread that publishes message ``n`` of key ``a`` in a transaction it keeps
    open (its id appended to ``ids`` once published) until the event returned is set;
    started, the publish done."""
    started, commit = threading.Event(), threading.Event()

    def publish() -> None:
        with other.transaction() as conn:
            routed = other.publish(
                [Message(b"x", promoted={"t.N": n, "t.K": "a"})], connection=conn
            )
            ids.append(routed[0].message_id)
            started.set()
            commit.wait(10)

    t = threading.Thread(target=publish)
    t.start()
    assert started.wait(10)
    return t, commit


@pytest.mark.postgres
def test_a_publish_that_commits_late_waits_for_its_key_in_hand(pg_url: str) -> None:
    """Ids are taken when a publish begins: one that commits after a later publish of
    the same key was claimed has older ids, and waits for the key's entry in hand."""
    with MessageBox(pg_url, publisher="tests") as box, MessageBox(pg_url) as other:
        _setup(box)
        late: list[uuid.UUID] = []
        t, release = _publish_held_open(other, 0, late)
        [early] = _publish(box, ["a"])
        [in_hand] = _claim(box)
        assert in_hand.msg == early
        release.set()
        t.join(10)
        with box.store.transaction() as conn:  # it is older, and queued now
            q = schema.queue
            found = dict(conn.execute(sa.select(q.c.msg, q.c.id)).all())
        assert found[late[0]] < found[early]
        assert _claim(box, "b") == []
        _record(box, "a", done=[in_hand])
        assert [c.msg for c in _claim(box, "c")] == late


@pytest.mark.postgres
def test_an_entry_committed_while_a_claim_runs_is_leased_with_its_keys_run(
    pg_url: str,
) -> None:
    """A claim statement's snapshot is older than the ones its keyed runs are read in:
    an entry of a key that commits in between is read with the key's run, and is leased
    with it, the run's last entry carrying the key's lease (it was left unleased, the
    run in hand without the key's lease, and another claimer took the run again)."""
    with MessageBox(pg_url, publisher="tests") as box, MessageBox(pg_url) as other:
        _setup(box)
        ids = _publish(box, ["b", "a"])
        [done] = _claim(box, "one", n=1)  # b's entry, completed with the next claim
        got: list[list[Claim]] = []

        def complete_and_claim() -> None:
            outcomes = Outcomes([done], [], [], HostSettings(), set())
            claims, _ = box.consumer("h", "one").claim(
                50, 30.0, ordered=False, instances=False, outcomes=outcomes, keyed=50,
                per_key=50, keyed_only=True,
            )  # fmt: skip
            got.append(claims)

        publisher, commit = _publish_held_open(other, 2, ids)  # commits during the claim
        dialect = box.store.dialect
        assert isinstance(dialect, PostgreSQLDialect)
        with psycopg.connect(dialect.listen_dsn(box.store.engine.url)) as blocker:
            # the completion's delete waits for its row: the statement has begun
            blocker.execute("SELECT 1 FROM mb_queue WHERE lease_owner = 'one' FOR UPDATE")
            claimer = threading.Thread(target=complete_and_claim)
            claimer.start()
            wait_for(
                lambda: (
                    blocker.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' "
                        "AND NOT granted"
                    ).fetchone()
                    == (1,)
                ),
                what="the completion waiting for its row",
            )
            commit.set()
            publisher.join(10)
            blocker.rollback()
            claimer.join(10)
        assert _runs(got[0], ids) == {"'a'": [1, 2]}
        assert _claim(box, "two") == []  # the key is in hand
        _record(box, "one", done=got[0])
        assert _claim(box, "three") == []


def test_the_sql_router_and_a_reroute_give_the_same_keys(backend_url: str) -> None:
    with MessageBox(backend_url, router="sql", publisher="tests") as box:
        box.create_host("h", **FAST_HOST)
        box.publish([Message(b"x", promoted={"t.N": 0, "t.K": "late"})])  # a routing failure
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="k", ordered_by="t.K")
        ids = _publish(box, ["a", "b"])
        [failure] = box.suspended()
        box.reroute(failure.id)
        claims = _claim(box)
    assert sorted(describe(c.key) for c in claims) == ["'a'", "'b'", "'late'"]
    assert {c.msg for c in claims} >= set(ids)


def test_plain_and_ordered_subscriptions_beside_a_keyed_one_are_claimed_as_before(
    box: MessageBox,
) -> None:
    _setup(box)
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="plain")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="ordered", ordered=True)
    _publish(box, ["a", "b", "a", "b"])
    claims, _ = box.consumer("h", "a").claim(
        40, 30.0, ordered=True, instances=False, keyed=20, per_key=50
    )
    subs = {s.name: s.id for s in box.subscriptions()}
    kinds = {name: sorted(c.id for c in claims if c.sub == sub) for name, sub in subs.items()}
    assert all(len(v) == 4 for v in kinds.values())
    assert all(c.run for c in claims if c.sub == subs["ordered"])
    assert all(c.key is not None for c in claims if c.sub == subs["k"])
    assert all(c.key is None and not c.run for c in claims if c.sub == subs["plain"])
    # a plain claim never takes a keyed entry
    _publish(box, ["c"])
    plain, _ = box.consumer("h", "b").claim(40, 30.0, ordered=False, instances=False)
    assert {c.sub for c in plain} == {subs["plain"]}
