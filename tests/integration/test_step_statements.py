"""Statements of an orchestration step batch on both backends (issue 20): the batch's
instances and convoys load in one statement, and messages are read, outside a
transaction (no BEGIN and COMMIT: each cost a statement on DuckDB, a round trip on
PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from messagebox import Message, MessageBox
from messagebox.delivery.consumer import Consumer
from messagebox.steps import Step
from messagebox.storage import schema
from tests.integration.conftest import catch_all_box


@pytest.fixture
def box(backend_url: str) -> Iterator[MessageBox]:
    with catch_all_box(backend_url) as b:
        yield b


class Statements:
    """The statements run on the store from now on, with whether each ran in a
    transaction, and the transactions begun: through SQLAlchemy, and the hot ones its
    dialect runs itself (``fetch``, ``fetch_messages``: on the driver's own cursor)."""

    def __init__(self, box: MessageBox) -> None:
        self.engine = box.store.engine
        self.dialect = box.store.dialect
        self.ran: list[tuple[str, str | None]] = []
        self.begun = 0
        self._fetching = 0
        event.listen(self.engine, "before_cursor_execute", self._execute)
        event.listen(self.engine, "begin", self._begin)
        for name in ("fetch", "fetch_messages"):  # the latter: DuckDB's runs no fetch
            setattr(self.dialect, name, self._counted(getattr(self.dialect, name)))

    def _counted(self, run: Any) -> Any:
        def counted(conn: sa.Connection, *args: Any) -> Any:
            if not self._fetching:
                self._execute(conn, None, str(args[0]))
            self._fetching += 1  # one statement, whichever way the dialect runs it
            try:
                return run(conn, *args)
            finally:
                self._fetching -= 1

        return counted

    def _execute(self, conn: sa.Connection, _c: Any, statement: str, *_a: Any) -> None:
        if not self._fetching:
            self.ran.append((statement, conn.get_execution_options().get("isolation_level")))

    def _begin(self, conn: sa.Connection) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.begun += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._execute)
        event.remove(self.engine, "begin", self._begin)
        del self.dialect.fetch, self.dialect.fetch_messages


def _step(claim_id: int, sub: int, instance_id: str) -> Step:
    return Step(
        owner="a",
        entry_id=claim_id,
        instance_id=instance_id,
        service="s",
        host="h",
        sub=sub,
        version=None,
        data={"state": {"n": 1}},
    )


def _saved_and_routed(box: MessageBox, saved: str, routed: str) -> Consumer:
    """Instance ``saved`` stored by a committed first step, and a convoy routing to
    ``routed``; the consumer that took the step."""
    box.publish([Message(b"x", promoted={"a.N": 1})])
    consumer = box.consumer("h", "a")
    [claim], _ = consumer.claim(1, 30.0, ordered=False, instances=False)
    consumer.commit_steps([_step(claim.id, claim.sub, saved)], publisher="tests")
    with box.store.transaction() as conn:
        conn.execute(
            schema.convoy.insert().values(
                service="s", key='[["s","k"]]', instance_id=routed, created_at=datetime.now(UTC)
            )
        )
    return consumer


def test_a_batch_loads_its_instances_and_their_convoys_in_one_statement(
    box: MessageBox,
) -> None:
    # Given a stored instance (its first step committed), an instance that routing made
    # for a convoy (its first step not committed yet) and an id the store never had
    consumer = _saved_and_routed(box, saved="i-saved", routed="i-routed")
    seen = Statements(box)
    try:
        # When a batch of steps loads them
        now, stored, convoys = consumer.load(["i-saved", "i-routed", "i-unknown"])
    finally:
        seen.close()
    # Then the saved one comes with its state, the routed one as a convoy, the other not
    assert list(stored) == ["i-saved"]
    assert (stored["i-saved"].version, stored["i-saved"].data["state"]) == (1, {"n": 1})
    assert convoys == {"i-routed"}
    assert now.tzinfo is not None
    # And that was one statement, outside a transaction
    assert len(seen.ran) == 1, seen.ran
    assert seen.ran[0][1] == "AUTOCOMMIT"
    assert seen.begun == 0


def test_a_saved_instance_is_not_also_a_convoy_being_created(box: MessageBox) -> None:
    # Given an instance whose first step committed, its convoy still routing to it
    consumer = _saved_and_routed(box, saved="i-1", routed="i-1")
    # When it is loaded, Then it is stored, and not among the convoys being created
    _, stored, convoys = consumer.load(["i-1"])
    assert list(stored) == ["i-1"]
    assert convoys == set()


def test_a_batch_of_messages_is_read_outside_a_transaction(box: MessageBox) -> None:
    # Given messages in the store (not held in memory: no host instance runs)
    routed = box.publish([Message(b"body %d" % i, promoted={"a.N": i}) for i in range(3)])
    seen = Statements(box)
    try:
        # When they are read together
        read = box.read_messages([r.message_id for r in routed], max_bytes=1024)
    finally:
        seen.close()
    # Then each comes whole, read in one statement, outside a transaction
    assert sorted(m.parts["body"] for m in read.values()) == [b"body 0", b"body 1", b"body 2"]  # type: ignore[union-attr]
    assert [level for _, level in seen.ran] == ["AUTOCOMMIT"]
    assert seen.begun == 0


def test_completing_an_instance_with_nothing_queued_for_it_deletes_no_queue_entry(
    box: MessageBox,
) -> None:
    # Given instance i-1, made by a first step, and a second message for a step of it
    box.publish([Message(b"x", promoted={"a.N": n}) for n in (1, 2)])
    consumer = box.consumer("h", "a")
    first, second = consumer.claim(2, 30.0, ordered=False, instances=False)[0]
    consumer.commit_steps([_step(first.id, first.sub, "i-1")], publisher="tests")
    seen = Statements(box)
    try:
        # When that step completes i-1 (nothing else is queued for it)
        done = replace(_step(second.id, second.sub, "i-1"), version=1, complete=True)
        consumer.commit_steps([done], publisher="tests")
    finally:
        seen.close()
    # Then the step's own entry is the only one deleted: the lookup found none for i-1
    deletes = [s for s, _ in seen.ran if s.lstrip().upper().startswith("DELETE FROM MB_QUEUE")]
    assert len(deletes) == 1, deletes
    _, stored, _ = consumer.load(["i-1"])
    assert stored["i-1"].completed_at is not None
