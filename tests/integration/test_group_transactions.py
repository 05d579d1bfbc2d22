"""Where transactions are serialised in-process (DuckDB), the threads of a host
instance that wait for one another share transactions:

- the claims that threads ask for while a transaction runs are made together in the
  next one, with every thread's outcomes: one claim for the lot, each thread taking its
  share;
- the orchestration steps that threads bring while a commit runs are committed
  together in the next one;
- the batches that threads publish through one ``MessageBox`` while a publish runs
  are published together in the next one.

A shared transaction that fails leaves each thread to do its own work alone, so an
error stays with what caused it. On PostgreSQL each thread does its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.delivery import consumer
from messagebox.delivery.service_instances import LeaseLost
from messagebox.errors import AlreadyExists, BackendUnavailable
from messagebox.models import HostSettings, Outcome, RoutingPolicy
from messagebox.outcomes import Outcomes
from messagebox.routing import publishing
from messagebox.steps import Step
from messagebox.storage import schema
from tests.integration.conftest import catch_all_box
from tests.integration.orchestration_support import wait_until


@pytest.fixture
def box(backend_url: str) -> Iterator[MessageBox]:
    with catch_all_box(backend_url) as b:
        yield b


def _serialised(box: MessageBox) -> bool:
    return box.messages._store.dialect.one_process


def _in_threads(
    box: MessageBox,
    calls: list[Callable[[], Any]],
    pending: Callable[[], list[Any]],
    spied: tuple[type, str],
    busy: AbstractContextManager[Any] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Run each call on a thread of its own, all started while this thread holds
    ``busy`` (by default the store's in-process lock; where there is none, they run as
    they come), until ``pending()`` holds them all; returns each call's result (or
    exception) and the first argument of each call of the ``spied`` method (what each
    transaction took)."""
    results: list[Any] = [None] * len(calls)
    taken: list[Any] = []
    owner, name = spied
    real = getattr(owner, name)

    def spy(self: Any, first: Any, *args: Any) -> Any:
        taken.append(first)
        return real(self, first, *args)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    mp = pytest.MonkeyPatch()
    mp.setattr(owner, name, spy)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
        dialect = box.messages._store.dialect
        if dialect.one_process:
            with busy if busy is not None else box.messages._store.local.serial():
                for t in threads:
                    t.start()
                wait_until(lambda: len(pending()) == len(calls), what="all threads waiting")
        else:
            for t in threads:
                t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        mp.undo()
    return results, taken


# --- claims ---


def _claims_in_threads(
    box: MessageBox, asks: list[tuple[int, Outcomes | None]]
) -> tuple[list[Any], list[int]]:
    """Claim ``(n, outcomes)`` from a thread each; each thread's result and the size of
    each claim made."""

    def call(n: int, outcomes: Outcomes | None) -> Callable[[], Any]:
        return lambda: box.consumer("h", "a").claim(
            n, 30.0, ordered=False, instances=False, outcomes=outcomes
        )

    group = consumer._claim_group(box.messages._store, "a")
    return _in_threads(
        box, [call(*a) for a in asks], lambda: group.pending, (consumer.Consumer, "_claim")
    )


def _done(claims: list[Claim]) -> Outcomes:
    return Outcomes(claims, [], [], HostSettings(), set())


def test_waiting_claims_share_one_claim_and_record_every_outcome(box: MessageBox) -> None:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(10)])
    first, _ = box.consumer("h", "a").claim(4, 30.0, ordered=False, instances=False)
    asks = [(2, _done(first[:2])), (2, _done(first[2:])), (2, None)]
    results, made = _claims_in_threads(box, asks)
    shares = [claims for claims, _ in results]
    assert [len(s) for s in shares] == [2, 2, 2]
    ids = [c.id for s in shares for c in s]
    assert len(set(ids)) == 6
    assert not {c.id for c in first} & set(ids)
    # the four completed entries are gone; six are leased, none left ready
    assert sum(d.depth for d in box.queue_depth()) == 6
    recorded = [r for _, r in results if r is not None]
    if _serialised(box):
        assert made == [6]  # one claim for the three threads
        assert len(recorded) == 1
        assert recorded[0].finished.completed == 4
    else:
        assert sorted(made) == [2, 2, 2]
        assert sum(r.finished.completed for r in recorded) == 4


def test_a_failing_shared_claim_leaves_each_thread_to_claim_alone(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(6)])
    claim = consumer.Consumer._claim
    failed: list[int] = []

    def fails_once(self: consumer.Consumer, n: int, *args: Any) -> Any:
        if n > 2 and not failed:
            failed.append(n)
            raise BackendUnavailable("lost the connection")
        return claim(self, n, *args)

    monkeypatch.setattr(consumer.Consumer, "_claim", fails_once)
    results, made = _claims_in_threads(box, [(2, None)] * 3)
    assert [len(claims) for claims, _ in results] == [2, 2, 2]
    assert len({c.id for claims, _ in results for c in claims}) == 6
    if _serialised(box):
        assert made == [6, 2, 2, 2]  # the shared attempt, then each thread alone
    else:
        assert made == [2, 2, 2]


# --- orchestration steps ---


def _leased(box: MessageBox, n: int) -> list[Claim]:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(n)])
    claims, _ = box.consumer("h", "a").claim(n, 30.0, ordered=False, instances=False)
    assert len(claims) == n
    return sorted(claims, key=lambda c: c.id)


def _step(claim: Claim, *, owner: str = "a") -> Step:
    return Step(
        owner=owner,
        entry_id=claim.id,
        instance_id=f"i-{claim.id}",
        service="s",
        host="h",
        sub=claim.sub,
        version=None,
        data={"state": {}},
    )


def _steps_in_threads(box: MessageBox, batches: list[list[Step]]) -> tuple[list[Any], list[int]]:
    """Commit each batch of steps from a thread of its own; each thread's result and,
    per transaction, how many threads' steps it held."""

    def call(steps: list[Step]) -> Callable[[], Any]:
        return lambda: box.consumer("h", "a").commit_steps(steps, publisher="tests")

    group = consumer._step_group(box.messages._store)
    results, taken = _in_threads(
        box,
        [call(b) for b in batches],
        lambda: group.pending,
        (consumer.Consumer, "_commit_steps"),
    )
    return results, [len(together) for together in taken]


def _instances(box: MessageBox) -> set[str]:
    with box.messages._store.transaction() as conn:
        return set(conn.execute(sa.select(schema.service_instance.c.id)).scalars())


def test_steps_of_several_threads_commit_and_settle_their_entries(box: MessageBox) -> None:
    claims = _leased(box, 6)
    batches = [[_step(c) for c in claims[k : k + 2]] for k in (0, 2, 4)]
    results, commits = _steps_in_threads(box, batches)
    assert results == [0, 0, 0]
    assert _instances(box) == {f"i-{c.id}" for c in claims}
    assert sum(d.depth for d in box.queue_depth()) == 0
    assert commits == ([3] if _serialised(box) else [1, 1, 1])  # one transaction for three


def test_a_failing_shared_commit_leaves_each_thread_its_own_outcome(box: MessageBox) -> None:
    claims = _leased(box, 6)
    good = [[_step(c) for c in claims[k : k + 2]] for k in (0, 4)]
    # entries leased by "a", committed as if by "b": the lease is not b's
    bad = [_step(c, owner="b") for c in claims[2:4]]
    results, commits = _steps_in_threads(box, [good[0], bad, good[1]])
    assert results[0] == 0
    assert results[2] == 0
    assert isinstance(results[1], LeaseLost)
    assert _instances(box) == {f"i-{c.id}" for c in (*claims[:2], *claims[4:])}
    assert sum(d.depth for d in box.queue_depth()) == 2  # the bad steps' entries stay
    # the shared attempt, then each thread alone
    assert commits == ([3, 1, 1, 1] if _serialised(box) else [1, 1, 1])


# --- publishes ---


def _publishes_in_threads(
    box: MessageBox, batches: list[list[Message]]
) -> tuple[list[Any], list[int]]:
    """Publish each batch from a thread of its own, all started while a publish runs;
    each thread's result and the size of each publish transaction."""
    group = box.messages._groups[RoutingPolicy.SUSPEND]

    def call(batch: list[Message]) -> Callable[[], Any]:
        return lambda: box.publish(batch)

    results, taken = _in_threads(
        box,
        [call(b) for b in batches],
        lambda: group.pending,
        (publishing.Messages, "_publish_tx"),
        busy=group.turn,
    )
    return results, [len(batch) for batch in taken]


def test_batches_of_several_threads_publish_together(box: MessageBox) -> None:
    batches = [
        [Message(b"x", promoted={"a.N": 10 * t + i}) for i in range(t + 1)] for t in range(3)
    ]
    results, sizes = _publishes_in_threads(box, batches)
    for batch, routed in zip(batches, results, strict=True):
        assert [r.outcome for r in routed] == [Outcome.ROUTED] * len(batch)
        for message, r in zip(batch, routed, strict=True):  # each its own results, in order
            assert box.read_message(r.message_id).promoted == message.promoted
    assert sum(d.depth for d in box.queue_depth()) == 6
    assert sorted(sizes) == ([6] if _serialised(box) else [1, 2, 3])  # one transaction for three


def test_a_failing_shared_publish_leaves_each_thread_its_own_outcome(box: MessageBox) -> None:
    [stored] = box.publish([Message(b"x", promoted={"a.N": 0})])
    again = Message(b"x", promoted={"a.N": 0}, id=stored.message_id)  # stored already
    batches = [[Message(b"a", promoted={"a.N": 1})], [again], [Message(b"c", promoted={"a.N": 2})]]
    results, sizes = _publishes_in_threads(box, batches)
    assert [r.outcome for r in results[0]] == [Outcome.ROUTED]
    assert [r.outcome for r in results[2]] == [Outcome.ROUTED]
    assert isinstance(results[1], AlreadyExists)
    assert sum(d.depth for d in box.queue_depth()) == 3  # the first, and the two good ones
    # the shared attempt, then each thread alone
    assert sizes == ([3, 1, 1, 1] if _serialised(box) else [1, 1, 1])
