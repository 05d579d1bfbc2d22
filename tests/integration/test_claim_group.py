"""Claims that several threads of one host instance ask for while a transaction runs are
made together in the next one where transactions are serialised in-process (DuckDB):
one claim for the lot, with every thread's outcomes, each thread taking its share. A
shared claim that fails leaves each thread to claim alone. On PostgreSQL each thread
claims on its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from messagebox import Message, MessageBox, consumer
from messagebox.consumer import Outcomes
from messagebox.errors import BackendUnavailable
from messagebox.leases import Claim
from messagebox.models import HostSettings
from messagebox.predicates import P
from tests.integration.orchestration_support import wait_until


@pytest.fixture
def box(backend_url: str) -> Iterator[MessageBox]:
    b = MessageBox(backend_url, publisher="tests")
    b.create_host("h")
    b.subscribe("s", host="h", filter=P("a.N") >= 0, name="s")
    try:
        yield b
    finally:
        b.close()


def _claim_in_threads(
    box: MessageBox, asks: list[tuple[int, Outcomes | None]]
) -> tuple[list[Any], list[int]]:
    """Claim ``(n, outcomes)`` from a thread each, all started while this thread holds
    the store's in-process lock (where there is one), so that they wait together;
    returns each thread's result and the size of each claim statement made."""
    results: list[Any] = [None] * len(asks)
    made: list[int] = []
    claim = consumer.Consumer._claim

    def counted(self: consumer.Consumer, n: int, *args: Any) -> Any:
        made.append(n)
        return claim(self, n, *args)

    def run(i: int) -> None:
        n, outcomes = asks[i]
        try:
            results[i] = box.consumer("h", "a").claim(
                n, 30.0, ordered=False, instances=False, outcomes=outcomes
            )
        except Exception as exc:
            results[i] = exc

    mp = pytest.MonkeyPatch()
    mp.setattr(consumer.Consumer, "_claim", counted)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
        store = box.messages._store
        if store.dialect.one_process:
            group = consumer._claim_group(store, "a")
            with store.dialect.serial():
                for t in threads:
                    t.start()
                wait_until(lambda: len(group.pending) == len(asks), what="all claims waiting")
        else:
            for t in threads:
                t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        mp.undo()
    return results, made


def _done(claims: list[Claim]) -> Outcomes:
    return Outcomes(claims, [], [], HostSettings(), set())


def test_waiting_claims_share_one_claim_and_record_every_outcome(box: MessageBox) -> None:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(10)])
    first, _ = box.consumer("h", "a").claim(4, 30.0, ordered=False, instances=False)
    asks = [(2, _done(first[:2])), (2, _done(first[2:])), (2, None)]
    results, made = _claim_in_threads(box, asks)
    shares = [claims for claims, _ in results]
    assert [len(s) for s in shares] == [2, 2, 2]
    ids = [c.id for s in shares for c in s]
    assert len(set(ids)) == 6
    assert not {c.id for c in first} & set(ids)
    # the four completed entries are gone; six are leased, none left ready
    assert sum(d.depth for d in box.queue_depth()) == 6
    recorded = [r for _, r in results if r is not None]
    if box.messages._store.dialect.one_process:
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
    results, made = _claim_in_threads(box, [(2, None)] * 3)
    assert [len(claims) for claims, _ in results] == [2, 2, 2]
    assert len({c.id for claims, _ in results for c in claims}) == 6
    if box.messages._store.dialect.one_process:
        assert made == [6, 2, 2, 2]  # the shared attempt, then each thread alone
    else:
        assert made == [2, 2, 2]
