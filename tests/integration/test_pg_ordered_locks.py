"""PostgreSQL: what an ordered run's claim locks, and the locks it respects. A run locks
only the entries it takes, and ends at an entry of a service instance that another
claim is taking (claim_instance's advisory lock on the instance)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from messagebox.claims import Claim
from messagebox.delivery import leases
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import complete

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("backend_url", ["postgresql"], indirect=True),  # conftest's box
]


def _run(box: MessageBox, conn: sa.Connection, n: int) -> list[Claim]:
    return leases.claim_run(conn, box.store.dialect, host="h", owner="t", n=n, lease_seconds=30)


def _queued(box: MessageBox) -> list[tuple[int, str | None]]:
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return [
            (r.id, r.instance_id)
            for r in conn.execute(sa.select(q.c.id, q.c.instance_id).order_by(q.c.id))
        ]


def test_an_ordered_run_locks_only_the_entries_it_takes(box: MessageBox) -> None:
    """(Its function locked every row its loop fetched, ten at least.)"""
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, ordered=True)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(5)])
    ids = [i for i, _ in _queued(box)]
    with box.store.transaction(serial=True) as conn:
        assert [c.id for c in _run(box, conn, 1)] == ids[:1]
        with box.store.engine.connect() as other:
            for entry in ids[1:]:  # not locked: taken at once
                other.exec_driver_sql(
                    "SELECT id FROM mb_queue WHERE id = %(id)s FOR UPDATE NOWAIT", {"id": entry}
                ).all()
            with pytest.raises(sa.exc.OperationalError) as caught:
                other.exec_driver_sql(
                    "SELECT id FROM mb_queue WHERE id = %(id)s FOR UPDATE NOWAIT", {"id": ids[0]}
                ).all()
            assert isinstance(caught.value.orig, psycopg.errors.LockNotAvailable)
            other.rollback()


def test_an_ordered_run_ends_at_an_instance_another_claim_is_taking(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, ordered=True, correlation=["t.K"])
    box.publish([Message(b"x", promoted={"t.N": i, "t.K": i}) for i in range(3)])
    queued = _queued(box)
    with box.store.engine.connect() as other:
        # a claim of the second one's instance in flight, as claim_instance takes it
        other.exec_driver_sql(
            "SELECT pg_advisory_xact_lock(724011, hashtext(%(i)s))", {"i": queued[1][1]}
        ).all()
        with box.store.transaction(serial=True) as conn:
            [taken] = _run(box, conn, 10)
        assert taken.id == queued[0][0]
        other.rollback()
    complete(box, taken)  # and once that claim is over, the rest
    with box.store.transaction(serial=True) as conn:
        assert [c.id for c in _run(box, conn, 10)] == [i for i, _ in queued[1:]]


def test_an_ordered_run_is_taken_by_one_claim_at_a_time(box: MessageBox) -> None:
    """A second claim, while the first one's transaction runs, takes nothing of it."""
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, ordered=True)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(3)])
    with box.store.transaction(serial=True) as first:
        assert len(_run(box, first, 1)) == 1
        with box.store.transaction(serial=True) as second:
            assert _run(box, second, 10) == []
