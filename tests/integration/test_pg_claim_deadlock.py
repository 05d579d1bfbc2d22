"""PostgreSQL: the statement that completes a batch and claims the next one
(``complete_claim``) deletes its completed entries before it locks any entry to claim.

A claim locks rows with ``FOR UPDATE SKIP LOCKED``; when a row it saw unleased was
claimed by another thread meanwhile, PostgreSQL locks the newest version to recheck it
and keeps that lock until the statement ends, though the row fails the recheck. A
statement that claimed first and then waited to delete its completed entries held such
locks while it waited: two threads of a host instance, each holding a row the other was
deleting, deadlocked ("claim failed: deadlock detected", seen with 8 dequeue threads).
Deleting first, a statement waits only while it holds nothing another waits for."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from messagebox.claims import Claim, Finished
from messagebox.delivery import leases as mb_leases
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.predicates import P
from tests.conftest import claim

pytestmark = pytest.mark.postgres


@pytest.fixture
def box(pg_url: str) -> Iterator[MessageBox]:
    b = MessageBox(pg_url, publisher="tests")
    b.create_host("h")
    b.subscribe("svc", host="h", filter=P("t.N") >= 0)
    try:
        yield b
    finally:
        b.close()


def _raw(box: MessageBox) -> psycopg.Connection[tuple[object, ...]]:
    """A connection of its own to the box's schema, autocommit."""
    dsn = box.store.dialect.listen_dsn(box.store.url)  # type: ignore[attr-defined]
    return psycopg.connect(dsn, autocommit=True)


def _waiting_on_lock(conn: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_completions_are_deleted_before_the_claim_locks_anything(box: MessageBox) -> None:
    box.publish([Message(b"a", promoted={"t.N": 1}), Message(b"b", promoted={"t.N": 2})])
    (done,) = claim(box, "h", owner="o1")  # the older entry, in hand; the other is ready
    holder, prober = _raw(box), _raw(box)
    holder.autocommit = False
    holder.execute("SELECT 1 FROM mb_queue WHERE id = %s FOR UPDATE", (done.id,))
    pid: list[int] = []
    result: list[tuple[Finished, list[Claim]]] = []

    def complete_and_claim() -> None:
        with box.store.transaction(serial=True) as conn:
            pid.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            result.append(
                mb_leases.complete_and_claim(
                    conn,
                    box.store.dialect,
                    host="h",
                    owner="o1",
                    completed=[done],
                    n=1,
                    lease_seconds=30.0,
                )
            )

    worker = threading.Thread(target=complete_and_claim)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not (pid and _waiting_on_lock(prober, pid[0])):
            assert time.monotonic() < deadline, "the statement never waited for the held row"
            time.sleep(0.01)
        # it waits to delete; the ready entry must not be locked by it meanwhile
        ready = prober.execute(
            "SELECT id FROM mb_queue WHERE id <> %s AND lease_owner IS NULL", (done.id,)
        ).fetchone()
        assert ready is not None
        with prober.transaction():
            locked = prober.execute(
                "SELECT id FROM mb_queue WHERE id = %s FOR UPDATE SKIP LOCKED", (ready[0],)
            ).fetchall()
        assert locked == [ready], "the claim locked an entry while it waited to delete"
    finally:
        holder.rollback()
        worker.join(30)
        holder.close()
        prober.close()
    assert not worker.is_alive()
    (finished, claims) = result[0]
    assert finished.completed == 1
    assert [c.id for c in claims] == [ready[0]]
