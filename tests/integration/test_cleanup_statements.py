"""Cleanup finds unreferenced messages in short statements: the sums of the reference
logs in one, the probe of the queue and suspended entries in another. As one statement,
on PostgreSQL, its probes ran under the snapshot of its start while hosts churned the
queue, each walking more row versions than the last: one cleanup ran for 15 minutes in
a million-message run, and held vacuum back all along."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox, upkeep
from messagebox.delivery import cleanup
from messagebox.hosts import HostInstance
from messagebox.predicates import P
from tests.conftest import claim, complete, table_counts, wait_for


def test_the_reference_sums_and_the_queue_probe_are_separate_statements(box: MessageBox) -> None:
    # Given one delivered message and one still queued
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0)
    box.publish([Message(b"a", promoted={"t.N": 1})])
    [c] = claim(box, "h")
    complete(box, c)
    box.publish([Message(b"b", promoted={"t.N": 2})])
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa.event.listen(box.store.engine, "before_cursor_execute", seen)
    try:
        # When cleanup runs
        report = box.cleanup()
    finally:
        sa.event.remove(box.store.engine, "before_cursor_execute", seen)
    # Then it deleted the delivered message only
    assert report.messages == 1
    assert [d.depth for d in box.queue_depth()] == [1]
    # and no statement both sums the reference logs and probes the queue
    sums = [s for s in statements if "mb_ref_add" in s and "sum(" in s.lower()]
    assert sums, statements
    assert not [s for s in sums if "mb_queue" in s or "mb_suspended" in s]


def test_a_chunk_is_deleted_in_slices_and_its_ids_are_not_cached(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given eight delivered messages and two still queued, and slices of three
    monkeypatch.setattr(cleanup, "DELETE_SLICE", 3)
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0)
    box.publish([Message(f"m{i}".encode(), promoted={"t.N": i}) for i in range(10)])
    claims = claim(box, "h", n=10)
    for c in claims[:8]:
        complete(box, c)
    # When cleanup runs in chunks of five (slices 3 + 2, then 3)
    report = box.cleanup(batch=5)
    # Then every delivered message, its part and its log rows are gone, counted once
    assert (report.messages, report.parts, report.reference_rows) == (8, 8, 16)
    counts = table_counts(box)
    assert (counts["mb_spool"], counts["mb_part"], counts["mb_message_part"]) == (2, 2, 2)
    assert sorted(d.depth for d in box.queue_depth()) == [2]
    assert box.cleanup().messages == 0
    # and SQLAlchemy's statement cache keeps no deletion (each would keep its ids)
    cache = box.store.engine._compiled_cache
    assert cache is not None
    cached = [str(c.statement) for c in cache.values()]
    assert not [s for s in cached if s.startswith("DELETE FROM mb_spool")], cached


def test_a_host_instance_cleans_up_in_chunks_of_the_host_batch(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given seven delivered messages, a host batch of three, and the chunks recorded
    monkeypatch.setattr(upkeep, "HOST_BATCH", 3)
    chunks: list[int] = []
    delete = cleanup._delete_messages

    def recorded(conn: Any, msgs: list[Any], keep: bool = False) -> tuple[int, int, int]:
        chunks.append(len(msgs))
        return delete(conn, msgs, keep)

    monkeypatch.setattr(cleanup, "_delete_messages", recorded)
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0)
    box.publish([Message(f"m{i}".encode(), promoted={"t.N": i}) for i in range(7)])
    settings = {
        "poll_min_seconds": 0.01,
        "poll_max_seconds": 0.05,
        "heartbeat_seconds": 0.05,
        "cleanup_interval_seconds": 0.05,
    }
    # When a host instance delivers them and runs its own cleanup
    with HostInstance(box, "h", {"svc": lambda _d: None}, settings=settings):
        wait_for(lambda: table_counts(box)["mb_spool"] == 0, "the host's cleanup")
    # Then it deleted them all, never more than three in a transaction
    assert sum(chunks) == 7
    assert max(chunks) == 3, chunks
