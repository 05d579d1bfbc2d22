"""Instances that fall silent (issue 55's fault round, scenarios 2 and 4): a process
frozen in the middle of its heartbeat no longer stalls the other instances' heartbeats;
an instance never declares itself dead; on DuckDB a process that ended has its leases
released as soon as another starts; and ``--until-idle`` does not end while entries
are held by an instance that has gone silent."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from messagebox import MessageBox
from messagebox.delivery import registry as mb_registry
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import InstanceInfo
from messagebox.storage import schema as mb_schema
from tests.conftest import claim, wait_for
from tests.integration.test_delivery import msgs
from tests.integration.test_host_faults import setup_host


def _info(owner: str) -> InstanceInfo:
    now = datetime.now(UTC)
    return InstanceInfo(owner, "h", "elsewhere", 1, now, now, "running")


def _age(box: MessageBox, owner: str, seconds: float) -> None:
    i = mb_schema.instance
    with box.store.transaction() as conn:
        conn.execute(
            i.update()
            .where(i.c.id == owner)
            .values(heartbeat_at=box.store.dialect.now_plus(-seconds))
        )


def test_a_frozen_heartbeat_does_not_stall_the_others(pg_url: str) -> None:
    """The frozen process holds its own instance row and its leases (its heartbeat's
    transaction, never committed); the live instance's search for dead instances skips
    them instead of waiting, so its own heartbeats go on."""
    with MessageBox(pg_url) as box:
        setup_host(box)
        box.publish(msgs(2))
        claimed = claim(box, "h", n=2, owner="frozen", lease_seconds=30)
        with box.store.transaction(serial=True) as conn:
            mb_registry.register(conn, _info("frozen"))
        _age(box, "frozen", 3600)  # long dead by its heartbeat
        live = box.consumer("h", "live")
        q, i = mb_schema.queue, mb_schema.instance
        with box.store.engine.connect() as frozen:  # SIGSTOPped inside its heartbeat
            frozen.execute(i.update().where(i.c.id == "frozen").values(state="running"))
            frozen.execute(
                q.update().where(q.c.id.in_([c.id for c in claimed])).values(attempts=q.c.attempts)
            )
            done: list[tuple[list[str], int]] = []
            worker = threading.Thread(target=lambda: done.append(live.release_dead(30.0)))
            started = time.monotonic()
            worker.start()
            wait_for(lambda: not worker.is_alive(), what="release_dead to return", timeout=10)
            assert time.monotonic() - started < 5
            assert done == [([], 0)]  # its rows are held: skipped, not waited for
            frozen.rollback()
        assert live.release_dead(30.0) == (["frozen"], 2)  # once let go, released


def test_an_instance_never_declares_itself_dead(backend_url: str) -> None:
    with MessageBox(backend_url) as box:
        setup_host(box)
        with box.store.transaction(serial=True) as conn:
            mb_registry.register(conn, _info("me"))
        _age(box, "me", 3600)  # its heartbeat's transaction began before a long freeze
        assert box.consumer("h", "me").release_dead(30.0) == ([], 0)
        assert box.consumer("h", "other").release_dead(30.0) == (["me"], 0)


def test_on_duckdb_a_process_that_ended_has_its_leases_released_at_once(
    duckdb_url: str, instances: list[HostInstance]
) -> None:
    """One process holds a DuckDB file: an instance registered by another process is
    one that ended (killed), and its leases are released when the next one starts,
    not ``dead_after_seconds`` later."""
    with MessageBox(duckdb_url) as box:
        setup_host(box, dead_after_seconds=3600, heartbeat_seconds=1)
        box.publish(msgs(5))
        claim(box, "h", n=5, owner="killed", lease_seconds=3600)
        with box.store.transaction(serial=True) as conn:
            mb_registry.register(conn, _info("killed"))
        seen: list[int] = []

        def service(d: Delivery) -> None:
            seen.append(d.attempt)

        instances.append(HostInstance(box, "h", {"svc": service}).start())
        wait_for(lambda: len(seen) == 5, what="the killed process's entries delivered")
        assert all(a == 2 for a in seen)
        assert [x.id for x in box.instances()] == [instances[0].id]


def test_until_idle_waits_for_entries_another_process_holds(pg_url: str) -> None:
    """An instance that ended a moment ago (its last heartbeat fresh) still holds its
    entries for ``dead_after_seconds``: an instance with nothing else to do is not idle
    until they are released to it and handled."""
    with MessageBox(pg_url) as box:
        setup_host(box, dead_after_seconds=3.0, heartbeat_seconds=0.2)
        box.publish(msgs(3))
        claim(box, "h", n=3, owner="ended", lease_seconds=3600)
        with box.store.transaction(serial=True) as conn:
            mb_registry.register(conn, _info("ended"))
        _age(box, "ended", 0.1)  # it beat a moment ago: nothing tells it ended yet
        seen: list[int] = []
        inst = HostInstance(box, "h", {"svc": lambda d: seen.append(d.attempt)})
        inst.start()
        try:
            wait_for(
                lambda: inst._parts.idleness.empty_since is not None, what="a first empty claim"
            )
            time.sleep(0.3)  # what an idle instance would count as idle time (not a wait)
            assert inst.idle_seconds() == 0.0  # not idle: another process holds work
            wait_for(lambda: len(seen) == 3, what="the released entries handled", timeout=30)
            wait_for(lambda: inst.idle_seconds() > 0.3, what="idle at last")
        finally:
            inst.stop()


def test_the_store_ends_a_transaction_left_idle(pg_url: str) -> None:
    """A session of the store's that sits in a transaction with nothing to do (its
    process frozen) is ended by PostgreSQL, so the rows it holds are let go."""
    with MessageBox(pg_url) as box, box.store.engine.connect() as conn:
        setting = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
        assert setting == "1min"
