"""PostgreSQL statements on the hot paths (issue 20): a publish of a few messages is two
statements (its prelude, then its writes with the wake-up of other processes), a large
one still routes and wakes, and a host's completions and next claim are one statement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from messagebox import Message, MessageBox
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes
from messagebox.predicates import P
from messagebox.steps import Step
from messagebox.storage import rollup
from messagebox.storage.dialects import postgresql as pg_dialect
from tests.integration.conftest import catch_all_box

pytestmark = pytest.mark.postgres


@pytest.fixture
def box(pg_url: str) -> Iterator[MessageBox]:
    with catch_all_box(pg_url) as b:
        yield b


def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements executed from now on (their first line); the per-minute counts
    are not written meanwhile (they are, every few seconds, after a later transaction)."""
    monkeypatch.setattr(rollup, "FLUSH_SECONDS", float("inf"))
    seen: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query).strip().splitlines()[0])
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return seen


class Listener:
    """LISTEN on the wake-up channel, for host ``h`` of this test's schema (the channel
    is shared: other tests' schemas notify on it too)."""

    def __init__(self, pg_url: str) -> None:
        url = pg_url.replace("postgresql+psycopg://", "postgresql://")
        self.conn = psycopg.connect(url, autocommit=True)
        row = self.conn.execute("SELECT current_schema()").fetchone()
        assert row is not None
        self.mine = f"{row[0]}/h"
        self.conn.execute("LISTEN messagebox")

    def woken(self) -> bool:
        """Whether host ``h`` is woken within 5 s."""
        notes = self.conn.notifies(timeout=5.0, stop_after=50)
        return any(n.payload == self.mine for n in notes)

    def close(self) -> None:
        self.conn.close()


def test_a_small_publish_is_two_statements_and_wakes_other_processes(
    box: MessageBox, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    box.publish([Message(b"warm", promoted={"a.N": 0})])  # routing index loaded
    listener = Listener(pg_url)
    try:
        seen = statements(monkeypatch)
        [routed] = box.publish([Message(b"x", promoted={"a.N": 1})])
        assert routed.subscriptions
        assert len(seen) == 2, seen  # the prelude; the writes, which also notify
        assert listener.woken()
    finally:
        listener.close()


def test_a_publish_too_large_for_one_statement_still_wakes_other_processes(
    box: MessageBox, pg_url: str
) -> None:
    listener = Listener(pg_url)
    try:
        n = pg_dialect.ONE_STATEMENT_ROWS  # spool, parts, queue and refs: 4 rows a message
        routed = box.publish([Message(b"x", promoted={"a.N": i}) for i in range(n)])
        assert all(r.subscriptions for r in routed)
        assert box.queue_depth()[0].depth == n
        assert listener.woken()
    finally:
        listener.close()


def test_completions_and_the_next_claim_are_one_statement(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(4)])
    consumer = box.consumer("h", "a")
    first, _ = consumer.claim(2, 30.0, ordered=False, instances=False)
    seen = statements(monkeypatch)
    done = Outcomes(first, [], [], HostSettings(), set())
    claims, recorded = consumer.claim(2, 30.0, ordered=False, instances=False, outcomes=done)
    assert len(claims) == 2
    assert recorded is not None
    assert recorded.finished.completed == 2
    assert len(seen) == 1, seen


def test_a_step_batch_reads_the_time_with_its_rows(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committing orchestration steps and loading instances ask for no ``now()`` of
    their own: the time comes back with the entries taken and the instances read."""
    box.publish([Message(b"x", promoted={"a.N": 1})])
    consumer = box.consumer("h", "a")
    [claim], _ = consumer.claim(1, 30.0, ordered=False, instances=False)
    step = Step(
        owner="a",
        entry_id=claim.id,
        instance_id="i-1",
        service="s",
        host="h",
        sub=claim.sub,
        version=None,
        data={"state": {}},
    )
    seen = statements(monkeypatch)
    consumer.commit_steps([step], publisher="tests")
    assert sum(d.depth for d in box.queue_depth()) == 0
    now, stored, _ = consumer.load(["i-1"])
    assert list(stored) == ["i-1"]
    assert (stored["i-1"].version, stored["i-1"].completed_at) == (1, None)
    assert now.tzinfo is not None
    assert not [s for s in seen if s.upper().startswith("SELECT NOW()")], seen
    assert any("mb_now" in s for s in seen)


def test_with_an_ordered_subscription_completions_and_the_next_claim_are_two_statements(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ordered run alone, then the completions and the rest of the claim in one
    statement: no transaction of several statements (it halved the delivery of the
    whole host)."""
    box.subscribe("svc", host="h", filter=P("a.N") < 3, name="ord", ordered=True)
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(6)])
    ord_id = next(s.id for s in box.subscriptions() if s.name == "ord")
    consumer = box.consumer("h", "a")
    first, _ = consumer.claim(4, 30.0, ordered=True, instances=False, ordered_most=4)
    run = [c for c in first if c.run]
    assert [c.sub for c in run] == [ord_id] * 3  # the whole run, first
    assert [c.id for c in run] == sorted(c.id for c in run)  # in publish order
    seen = statements(monkeypatch)
    done = Outcomes([c for c in first if not c.run], [], [], HostSettings(), set())
    claims, recorded = consumer.claim(4, 30.0, ordered=True, instances=False, outcomes=done)
    assert recorded is not None
    assert recorded.finished.completed == 1
    assert len(claims) == 4  # the run is still leased: plain entries only
    assert not any(c.run for c in claims)
    assert len(seen) == 2, seen


def test_the_claim_after_a_run_completes_it_first_and_takes_the_next_run(
    box: MessageBox,
) -> None:
    """A thread's next claim after an ordered run records the run before it claims:
    the subscription is free again in that claim and its next run comes at once (had
    the run been claimed first, its subscription would still be busy with the batch
    just done, and the next run would wait for another claim)."""
    box.subscribe("svc", host="h", filter=P("a.N") < 6, name="ord", ordered=True)
    box.publish([Message(b"x", promoted={"a.N": i}) for i in range(8)])
    consumer = box.consumer("h", "a")
    first, _ = consumer.claim(3, 30.0, ordered=True, instances=False, ordered_most=3)
    assert [c.run for c in first] == [True] * 3
    done = Outcomes(first, [], [], HostSettings(), set())
    claims, recorded = consumer.claim(
        3, 30.0, ordered=True, instances=False, outcomes=done, ordered_most=3
    )
    assert recorded is not None
    assert recorded.finished.completed == 3
    assert [c.run for c in claims] == [True] * 3  # the next run
    assert [c.id for c in claims] == sorted(c.id for c in claims)
    assert min(c.id for c in claims) > max(c.id for c in first)
