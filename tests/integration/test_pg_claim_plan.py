"""PostgreSQL claims read the queue by its claim index, in its order, whatever the
planner believes of the queue's size: a queue's statistics are stale by nature, and with
an estimate of a few rows the planner used to read every ready entry of the host and
sort them (48 ms a claim at 100,000 entries, against 0.14 ms by the index)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from messagebox import schema
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.predicates import P
from tests.conftest import claim

pytestmark = pytest.mark.postgres

BACKLOG = 100_000
"""Enough entries for the planner to prefer a sort to the index, unanalysed."""


@pytest.fixture
def backlog(pg_url: str) -> Iterator[MessageBox]:
    """A never-analysed queue (as a store's is between autovacuum runs) of BACKLOG ready
    entries: one published, copied in SQL (publishing them all took 20 s)."""
    box = MessageBox(pg_url, publisher="tests")
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0)
    box.publish([Message(b"x", promoted={"t.N": 1})])
    q = schema.queue
    others = ", ".join(c.name for c in q.columns if c.name != "id")
    with box.store.transaction() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO mb_queue (id, {others}) SELECT id + g, {others} "
            f"FROM mb_queue, generate_series(1, {BACKLOG - 1}) AS g"
        )
    try:
        yield box
    finally:
        box.close()


def plans(box: MessageBox, statement: str, params: dict[str, object]) -> list[str]:
    """The plans of ``statement`` and of the statements it runs inside functions, as
    auto_explain logs them (sent to this client as notices); rolled back."""
    raw: psycopg.Connection[object]
    notices: list[str] = []
    with box.store.engine.connect() as conn:
        raw = conn.connection.driver_connection  # type: ignore[assignment]
        raw.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        with raw.cursor() as cur:
            cur.execute("LOAD 'auto_explain'")
            cur.execute("SET auto_explain.log_min_duration = 0")
            cur.execute("SET auto_explain.log_nested_statements = on")
            cur.execute("SET client_min_messages = log")
            cur.execute(statement, params)
        conn.rollback()
    return [n for n in notices if "mb_queue" in n]


@pytest.mark.parametrize("statement", ["claim", "complete_claim"])
def test_a_claim_walks_the_claim_index_even_when_the_queue_looks_empty(
    backlog: MessageBox, statement: str
) -> None:
    # Given a queue the planner believes holds a handful of rows
    with backlog.store.transaction() as conn:
        estimate = conn.execute(
            sa.text("SELECT reltuples FROM pg_class WHERE oid = 'mb_queue'::regclass")
        ).scalar_one()
    assert estimate < BACKLOG / 10  # never analysed: -1, or what it held when created
    # When the next entries are taken (as a host instance takes them)
    dialect = backlog.store.dialect
    sql = dialect.claim_sql if statement == "claim" else dialect.complete_claim_sql
    assert sql is not None
    found = plans(backlog, sql, {**dialect.claim_params("h", "me", 100, 30.0), "done": "{}"})
    # Then the claim index is walked in its order and stops at the limit: no sort, no
    # read of every ready entry
    assert any("Index Scan using mb_queue_claim" in p for p in found), found
    assert not any("Sort" in p or "Bitmap Heap Scan on mb_queue" in p for p in found), found
    # and claims take entries in that order, oldest first
    with backlog.store.transaction() as conn:
        oldest = conn.execute(
            sa.select(schema.queue.c.id).order_by(schema.queue.c.id).limit(100)
        ).scalars()
        first = list(oldest)
    assert [c.id for c in claim(backlog, "h", n=100)] == first
