"""PostgreSQL claims read the queue by an index, in its order, whatever the planner
believes of the queue's size: a queue's statistics are stale by nature, and with an
estimate of a few rows the planner used to read every ready entry of the host and sort
them (48 ms a claim at 100,000 entries, against 0.14 ms by the index). Plain claims have
an index of their own, so that they never walk past instance or ordered entries."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from messagebox.delivery import leases as mb_leases
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.predicates import P
from messagebox.storage import schema
from tests.conftest import claim

pytestmark = pytest.mark.postgres

BACKLOG = 100_000
"""Enough entries for the planner to prefer a sort to the index, unanalysed."""


@pytest.fixture
def backlog(pg_url: str) -> Iterator[MessageBox]:
    """Never-analysed queues (as a store's are between autovacuum runs) of BACKLOG ready
    entries each, plain on host ``h`` and ordered on host ``o``: one published to each,
    copied in SQL (publishing them all took 20 s)."""
    box = MessageBox(pg_url, publisher="tests")
    box.create_host("h")
    box.create_host("o")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0)
    box.subscribe("seq", host="o", filter=P("t.N") >= 0, ordered=True)
    box.publish([Message(b"x", promoted={"t.N": 1})])
    q = schema.queue
    others = ", ".join(c.name for c in q.columns if c.name != "id")
    with box.store.transaction() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO mb_queue (id, {others}) SELECT id + g * 2, {others} "
            f"FROM mb_queue, generate_series(1, {BACKLOG - 1}) AS g"
        )
    try:
        yield box
    finally:
        box.close()


def plans(
    box: MessageBox, statement: str, params: dict[str, object], *, analyze: bool = False
) -> list[str]:
    """The plans of ``statement`` and of the statements it runs inside functions, as
    auto_explain logs them (sent to this client as notices), with the rows and loops
    each node ran if ``analyze``; rolled back."""
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
            if analyze:
                cur.execute("SET auto_explain.log_analyze = on")
                cur.execute("SET auto_explain.log_timing = off")
            cur.execute(statement, params)
        conn.rollback()
    return [n for n in notices if "mb_queue" in n]


@pytest.mark.parametrize(
    ("statement", "host", "index"),
    [
        ("claim", "h", "mb_queue_plain"),
        ("complete_claim", "h", "mb_queue_plain"),
        ("claim_ordered", "o", "mb_queue_ordered"),
    ],
)
def test_a_claim_walks_its_index_even_when_the_queue_looks_empty(
    backlog: MessageBox, statement: str, host: str, index: str
) -> None:
    # Given a queue the planner believes holds a handful of rows
    with backlog.store.transaction() as conn:
        estimate = conn.execute(
            sa.text("SELECT reltuples FROM pg_class WHERE oid = 'mb_queue'::regclass")
        ).scalar_one()
    assert estimate < BACKLOG / 10  # never analysed: -1, or what it held when created
    # When the next entries are taken (as a host instance takes them)
    dialect = backlog.store.dialect
    sql = getattr(dialect, f"{statement}_sql")
    assert sql is not None
    found = plans(backlog, sql, {**dialect.claim_params(host, "me", 100, 30.0), "done": "{}"})
    # Then the entries to take are read by the index in its order, stopping at the
    # limit: no sort, no read of every ready entry
    own = [p for p in found if "p_host" in p]  # the claim functions' own statements
    assert [p for p in own if "ORDER BY" in p]  # the one that takes them
    in_hand = [p for p in own if "run_lease" in p]  # an ordered one's look for entries in hand
    assert bool(in_hand) == (statement == "claim_ordered")
    for looking in in_hand:  # by the index of entries in hand, not the backlog
        assert "Index Only Scan using mb_queue_run_lease" in looking, looking
    for taking in own:
        if taking in in_hand:
            continue
        assert f"Index Scan using {index}" in taking or f"Index Only Scan using {index}" in (
            taking
        ), taking
        assert "Sort" not in taking, taking
        assert "Bitmap" not in taking, taking
    # and claims take the oldest entries, in order
    with backlog.store.transaction() as conn:
        oldest = conn.execute(
            sa.select(schema.queue.c.id)
            .where(schema.queue.c.host == host)
            .order_by(schema.queue.c.id)
            .limit(100)
        ).scalars()
        first = list(oldest)
    if statement == "claim_ordered":
        with backlog.store.transaction(serial=True) as conn:
            taken = mb_leases.claim(
                conn, dialect, host=host, owner="t", n=100, lease_seconds=30.0, ordered=True
            )
    else:
        taken = claim(backlog, host, n=100)
    assert [c.id for c in taken] == first


@pytest.fixture
def instances_backlog(pg_url: str) -> Iterator[MessageBox]:
    """A never-analysed queue of BACKLOG ready entries on host ``i``, each the only
    entry of its own service instance (copied in SQL from one published to a correlated
    activation subscription), so that every one is a head."""
    box = MessageBox(pg_url, publisher="tests")
    box.create_host("i")
    box.subscribe("conv", host="i", filter=P("t.N") >= 0, correlation=["t.N"])
    box.publish([Message(b"x", promoted={"t.N": 1})])
    q = schema.queue
    others = ", ".join(c.name for c in q.columns if c.name not in ("id", "instance_id"))
    with box.store.transaction() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO mb_queue (id, instance_id, {others}) "
            f"SELECT id + g, instance_id || '-' || g, {others} "
            f"FROM mb_queue, generate_series(1, {BACKLOG - 1}) AS g"
        )
    try:
        yield box
    finally:
        box.close()


def test_an_instance_claim_walks_its_index_even_when_the_queue_looks_empty(
    instances_backlog: MessageBox,
) -> None:
    # Given a queue of instance entries the planner has never analysed (it took 3.5 s a
    # claim at 600,000 entries, reading and sorting them all)
    box = instances_backlog
    with box.store.transaction() as conn:
        estimate = conn.execute(
            sa.text("SELECT reltuples FROM pg_class WHERE oid = 'mb_queue'::regclass")
        ).scalar_one()
    assert estimate < BACKLOG / 10
    # When the heads of the service instances are claimed
    dialect = box.store.dialect
    assert dialect.claim_instance_sql is not None
    found = plans(box, dialect.claim_instance_sql, dialect.claim_params("i", "me", 100, 30.0))
    # Then they are read by mb_queue_claim in its order, stopping at the limit
    [taking] = [p for p in found if "p_host" in p]  # mb_instance_heads' own statement
    assert "Index Scan using mb_queue_claim" in taking, taking
    assert "Sort" not in taking, taking
    assert "Bitmap" not in taking, taking
    # and a claim takes the oldest heads, in order
    with box.store.transaction() as conn:
        first = list(
            conn.execute(
                sa.select(schema.queue.c.id)
                .where(schema.queue.c.host == "i")
                .order_by(schema.queue.c.id)
                .limit(100)
            ).scalars()
        )
    taken = claim(box, "i", n=100, instances=True)
    assert [c.id for c in taken] == first
    assert all(c.instance_id is not None for c in taken)


def test_an_instance_claim_passes_over_leased_heads_without_probing_them(
    instances_backlog: MessageBox,
) -> None:
    # Given service instances whose oldest heads are leased (steps in flight: 3,200 of
    # them, each probed for older entries, made a claim of 800 take 15 ms against 3)
    box = instances_backlog
    leased = 5_000
    with box.store.transaction() as conn:
        conn.exec_driver_sql(
            "UPDATE mb_queue SET lease_owner = 'other', "
            "lease_expires = now() + interval '1 hour' "
            f"WHERE id IN (SELECT id FROM mb_queue ORDER BY id LIMIT {leased})"
        )
    # When the next heads are claimed
    dialect = box.store.dialect
    assert dialect.claim_instance_sql is not None
    found = plans(
        box,
        dialect.claim_instance_sql,
        dialect.claim_params("i", "me", 100, 30.0),
        analyze=True,
    )
    # Then the scan itself passes over the leased heads, and only the heads it keeps
    # are probed for an older or leased entry of their instance
    [taking] = [p for p in found if "p_host" in p]
    probes = [line for line in taking.splitlines() if "using mb_queue_instance" in line]
    assert probes, taking
    assert all(re.search(r"loops=100\)", line) for line in probes), taking
    # and a claim takes the oldest free heads, in order
    with box.store.transaction() as conn:
        first = list(
            conn.execute(
                sa.select(schema.queue.c.id)
                .where(schema.queue.c.host == "i", schema.queue.c.lease_owner.is_(None))
                .order_by(schema.queue.c.id)
                .limit(100)
            ).scalars()
        )
    taken = claim(box, "i", n=100, instances=True)
    assert [c.id for c in taken] == first
