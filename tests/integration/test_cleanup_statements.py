"""Cleanup finds unreferenced messages in short statements: the sums of the reference
logs in one, the probe of the queue and suspended entries in another. As one statement,
on PostgreSQL, its probes ran under the snapshot of its start while hosts churned the
queue, each walking more row versions than the last: one cleanup ran for 15 minutes in
a million-message run, and held vacuum back all along."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.predicates import P
from tests.conftest import claim, complete


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
