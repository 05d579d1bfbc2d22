"""Orchestration steps brought by several threads while a commit runs are committed
together in the next one where transactions are serialised in-process (DuckDB); a
shared commit that fails leaves each thread to commit its own steps, so an error stays
with the steps that caused it. On PostgreSQL each thread commits its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from messagebox import Message, MessageBox, consumer, service_instances
from messagebox.leases import Claim
from messagebox.predicates import P
from messagebox.service_instances import LeaseLost
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


def _claims(box: MessageBox, n: int) -> list[Claim]:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(n)])
    claims, _ = box.consumer("h", "a").claim(n, 30.0, ordered=False, instances=False)
    assert len(claims) == n
    return sorted(claims, key=lambda c: c.id)


def _step(claim: Claim, instance: str, *, owner: str = "a") -> service_instances.Step:
    return service_instances.Step(
        owner=owner,
        entry_id=claim.id,
        instance_id=instance,
        service="s",
        host="h",
        sub=claim.sub,
        version=None,
        data={"state": {"n": instance}},
    )


def _commit_in_threads(
    box: MessageBox, batches: list[list[service_instances.Step]]
) -> tuple[list[object], list[int]]:
    """Commit each batch from a thread of its own, all started while this thread holds
    the store's in-process lock (where there is one), so that they wait together; returns
    each thread's result (discarded count or exception) and, per transaction, how many
    threads' steps it held."""
    results: list[object] = [None] * len(batches)
    commits: list[int] = []
    calls = consumer.Consumer._commit_steps

    def counted(self: consumer.Consumer, together: Any) -> int:
        commits.append(len(together))
        return calls(self, together)

    def run(i: int) -> None:
        try:
            results[i] = box.consumer("h", "a").commit_steps(batches[i], publisher="tests")
        except Exception as exc:
            results[i] = exc

    mp = pytest.MonkeyPatch()
    mp.setattr(consumer.Consumer, "_commit_steps", counted)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
        dialect = box.messages._store.dialect
        if dialect.one_process:
            group = consumer._step_group(box.messages._store)
            with dialect.serial():
                for t in threads:
                    t.start()
                wait_until(lambda: len(group.pending) == len(batches), what="all steps waiting")
        else:
            for t in threads:
                t.start()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        mp.undo()
    return results, commits


def _instances(box: MessageBox) -> set[str]:
    import sqlalchemy as sa

    from messagebox import schema

    with box.messages._store.transaction() as conn:
        return set(conn.execute(sa.select(schema.service_instance.c.id)).scalars())


def test_steps_of_several_threads_commit_and_settle_their_entries(box: MessageBox) -> None:
    claims = _claims(box, 6)
    batches = [[_step(c, f"i-{c.id}") for c in claims[k : k + 2]] for k in (0, 2, 4)]
    results, commits = _commit_in_threads(box, batches)
    assert results == [0, 0, 0]
    assert _instances(box) == {f"i-{c.id}" for c in claims}
    assert sum(d.depth for d in box.queue_depth()) == 0
    if box.messages._store.dialect.one_process:
        assert commits == [3]  # one transaction for the three threads' steps
    else:
        assert commits == [1, 1, 1]


def test_a_failing_shared_commit_leaves_each_thread_its_own_outcome(box: MessageBox) -> None:
    claims = _claims(box, 6)
    good = [[_step(c, f"i-{c.id}") for c in claims[k : k + 2]] for k in (0, 4)]
    # entries leased by "a", committed as if by "b": the lease is not b's
    bad = [_step(c, f"i-{c.id}", owner="b") for c in claims[2:4]]
    results, commits = _commit_in_threads(box, [good[0], bad, good[1]])
    assert results[0] == 0
    assert results[2] == 0
    assert isinstance(results[1], LeaseLost)
    assert _instances(box) == {f"i-{c.id}" for c in (*claims[:2], *claims[4:])}
    assert sum(d.depth for d in box.queue_depth()) == 2  # the bad steps' entries stay
    if box.messages._store.dialect.one_process:
        assert commits == [3, 1, 1, 1]  # the shared attempt, then each thread alone
    else:
        assert commits == [1, 1, 1]
