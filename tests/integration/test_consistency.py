"""``box.check()`` and ``messagebox check`` (:mod:`messagebox.storage.consistency`): a store
that published, delivered, suspended and cleaned up is consistent; rows that break
what every transaction keeps (a queue entry gone without its reference released, a
message gone without its rows, a part nothing uses) are named. On both backends."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes
from messagebox.predicates import P
from messagebox.storage import schema
from tests.cli_support import run_cli
from tests.conftest import claim, complete, fail_for_good


def stocked(box: MessageBox) -> None:
    """Messages routed to two subscriptions, one unroutable (suspended), one delivered,
    one failed for good (suspended), a cleanup."""
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0, name="all")
    box.subscribe("s", host="h", filter=P("t.N") >= 5, name="big")
    box.publish([Message(b"x" * 10, promoted={"t.N": i}) for i in range(10)])
    box.publish([Message(b"nobody", promoted={"t.Other": 1})])
    done, failed = claim(box, "h", n=2)
    complete(box, done)
    fail_for_good(box, failed, "no")
    box.cleanup()


def test_a_store_in_use_is_consistent(box: MessageBox) -> None:
    stocked(box)
    assert box.check() == []


def test_broken_rows_are_named(box: MessageBox) -> None:
    stocked(box)
    q, mp = schema.queue, schema.message_part
    with box.store.transaction() as conn:
        dropped = conn.execute(sa.select(q.c.msg).order_by(q.c.id).limit(1)).scalar_one()
        conn.execute(q.delete().where(q.c.msg == dropped))  # references not released
        gone = conn.execute(
            sa.select(mp.c.msg).where(mp.c.msg != dropped).order_by(mp.c.msg).limit(1)
        ).scalar_one()
        conn.execute(schema.spool.delete().where(schema.spool.c.id == gone))
        stray = uuid.uuid4()
        conn.execute(schema.part.insert().values(id=stray, size=1, n_fragments=1, data=b"x"))
    found = {p.what: p for p in box.check()}
    refs = found["messages whose references differ from their entries"]
    assert refs.count == 1
    assert str(dropped) in refs.examples[0]
    orphans = found["rows naming a message not in the spool"]
    assert all(str(gone) in e for e in orphans.examples)
    assert {e.split()[0] for e in orphans.examples} >= {"mb_message_part", "mb_ref_add"}
    assert found["stored parts no message uses"].examples == [str(stray)]


def test_the_command_exits_4_on_a_problem(backend_url: str) -> None:
    with MessageBox(backend_url) as box:
        stocked(box)
    clean = run_cli(["--url", backend_url, "check"])
    assert (clean.returncode, clean.stdout.split(":")[0]) == (0, "consistent")
    with MessageBox(backend_url) as box, box.store.transaction() as conn:
        conn.execute(schema.queue.delete())
    broken = run_cli(["--url", backend_url, "check"])
    assert broken.returncode == 4
    assert broken.stdout.startswith("messages whose references differ from their entries: ")


def test_a_void_claim_is_not_recorded_against_the_entry_given_its_id(box: MessageBox) -> None:
    """After a failover that lost the last commits (asynchronous replication), a host
    instance may hold a claim whose entry is gone, its id given to a new entry of
    another message, which it claimed too: recording the old claim late (``recheck``)
    leaves the new entry alone."""
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0, name="all")
    box.publish([Message(b"lost", promoted={"t.N": 1})])
    [void] = claim(box, "h", owner="a")
    q, mp = schema.queue, schema.message_part
    with box.store.transaction() as conn:  # the new primary never had that message
        conn.execute(q.delete().where(q.c.id == void.id))
        parts = list(conn.execute(sa.select(mp.c.part).where(mp.c.msg == void.msg)).scalars())
        for table in (schema.ref_add, schema.ref_release, mp):
            conn.execute(table.delete().where(table.c.msg == void.msg))
        conn.execute(schema.part.delete().where(schema.part.c.id.in_(parts)))
        conn.execute(schema.spool.delete().where(schema.spool.c.id == void.msg))
    [kept] = box.publish([Message(b"kept", promoted={"t.N": 2})])
    with box.store.transaction() as conn:  # its entry has the lost one's id, claimed by "a"
        conn.execute(
            q.update()
            .where(q.c.msg == kept.message_id)
            .values(id=void.id, lease_owner="a", attempts=void.attempts)
        )
    late = Outcomes([void], [], [], HostSettings(), set())
    recorded = box.consumer("h", "a").record(late, recheck=True)
    assert recorded.finished.completed == 0
    assert [e.message_id for e in box.peek_queue("h")] == [kept.message_id]
    assert box.check() == []
