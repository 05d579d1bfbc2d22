"""What this process keeps about one database (messagebox.storage.database_local): every store of
a database in the process shares one DatabaseLocal (DuckDB's write lock and routing
fence, the wake-ups, the id block, the kept messages), two databases share nothing,
the last store to close drops what only an open store needs, and the object goes with
the last store of it."""

from __future__ import annotations

import gc
import threading
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from messagebox import Message, MessageBox
from messagebox.predicates import P
from messagebox.storage import database_local
from messagebox.storage.fence import Fence


def _with_host(box: MessageBox) -> MessageBox:
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("t.a").exists(), name="all")
    return box


def test_two_stores_of_one_file_share_it(duckdb_url: str) -> None:
    # Given two stores opened on one DuckDB file, one URL spelling it relatively
    with MessageBox(duckdb_url) as a, MessageBox(duckdb_url) as b:
        # Then both have the one state of the file, found under its key
        local = a.store.local
        assert b.store.local is local
        assert database_local.found(a.store.key) is local
        assert local.stores == 2
        # with its write lock, routing fence, wake-ups, id block and kept messages
        assert a.store.local.serial() is b.store.local.serial() is local.lock
        assert local.blocks is not None
        assert local.recent is not None
        assert a.store.recent is b.store.recent is local.recent
        # while each store keeps its own transaction groups
        assert a.store.groups is not b.store.groups


def test_two_files_share_nothing(tmp_path: Path) -> None:
    # Given stores of two DuckDB files
    with (
        MessageBox(f"duckdb:///{tmp_path / 'one.duckdb'}") as one,
        MessageBox(f"duckdb:///{tmp_path / 'two.duckdb'}") as two,
    ):
        _with_host(one)
        _with_host(two)
        # Then their states, locks and wake-ups are apart
        assert one.store.local is not two.store.local
        assert one.store.local.lock is not two.store.local.lock
        assert one.store.local.fence is not two.store.local.fence
        # and a publish to one wakes no watcher of the other
        woken: list[str] = []
        stop = two.consumer("h", "w2").watch(lambda: woken.append("two"))
        try:
            one.publish([Message(b"x", promoted={"t.a": 1})])
        finally:
            stop()
        assert woken == []


def test_a_publish_through_one_store_wakes_a_watcher_through_another(backend_url: str) -> None:
    # Given two stores of one database, a host instance watching through the second
    with MessageBox(backend_url) as a, MessageBox(backend_url) as b:
        _with_host(a)
        woken = threading.Event()
        stop = b.consumer("h", "w").watch(woken.set)
        try:
            # When the first publishes to the host
            a.publish([Message(b"x", promoted={"t.a": 1})])
            # Then the watcher is woken at once, in this process
            assert woken.is_set()
        finally:
            stop()
        # and once it stops watching, nothing is kept for it
        assert len(a.store.local.wakes) == 0


def _waits_for(hold: AbstractContextManager[object], box: MessageBox, fence: Fence | None) -> None:
    """A transaction of ``box`` (serial, or holding ``fence``) waits while this thread
    holds ``hold``, and runs once it lets go."""
    done = threading.Event()

    def write() -> None:
        with box.store.transaction(serial=fence is None, fence=fence) as conn:
            conn.exec_driver_sql("SELECT 1")
        done.set()

    with hold:
        thread = threading.Thread(target=write)
        thread.start()
        assert not done.wait(0.3)
    thread.join(10)
    assert done.is_set()


def test_the_locks_of_one_store_hold_the_other(duckdb_url: str) -> None:
    # Given two stores of one file
    with MessageBox(duckdb_url) as a, MessageBox(duckdb_url) as b:
        # Then while the first's in-process write lock is held, the second's serial
        # transaction waits
        _waits_for(a.store.local.serial(), b, None)
        # and while a publish of the first is in flight (the routing fence held
        # shared), a subscription change of the second waits
        _waits_for(a.store.local.hold_routing(Fence.ROUTES), b, Fence.CHANGES)


def _open_state(local: database_local.DatabaseLocal) -> tuple[int, object, object]:
    """How many stores have it open, its id block and its kept messages."""
    return local.stores, local.blocks, local.recent


def test_the_last_store_to_close_releases_it(duckdb_url: str) -> None:
    # Given two stores of one file
    a = MessageBox(duckdb_url)
    b = MessageBox(duckdb_url)
    local = a.store.local
    key = a.store.key
    # When one closes, the other keeps the id block and kept messages
    a.close()
    assert local.stores == 1
    assert local.blocks is not None
    assert local.recent is not None
    assert b.store.recent is local.recent
    assert a.store.recent is None
    # When the last closes, they go (a file made anew meanwhile starts with neither)
    b.close()
    assert _open_state(local) == (0, None, None)
    # while a closed store is still held, a store opened anew shares its state (lock,
    # wake-ups, host instances: a handler left running on a closed store)
    with MessageBox(duckdb_url) as c:
        assert c.store.local is local
        assert local.stores == 1
        assert local.blocks is not None
    # and once no store of the database is left, neither is its state
    del a, b, c, local
    gc.collect()
    assert database_local.found(key) is None
    with MessageBox(duckdb_url) as d:
        assert d.store.local.stores == 1


def test_closing_twice_gives_it_back_once(duckdb_url: str) -> None:
    with MessageBox(duckdb_url) as a, MessageBox(duckdb_url) as b:
        a.close()
        a.close()
        assert b.store.local.stores == 1


def test_an_in_memory_database_is_each_stores_own() -> None:
    # Given two stores of DuckDB's :memory: (each open a database of its own)
    with MessageBox("duckdb:///:memory:") as a, MessageBox("duckdb:///:memory:") as b:
        # Then they share nothing: not even an id block (each database's sequence
        # hands out the same values)
        assert a.store.local is not b.store.local
        assert a.store.local.blocks is not b.store.local.blocks
        assert database_local.found(a.store.key) is None


@pytest.mark.parametrize("one_process", [True, False])
def test_what_a_database_serialises_in_process(one_process: bool) -> None:
    # Given the state of a database only this process opens (DuckDB), or not
    local = database_local.DatabaseLocal("k", one_process=one_process)
    # Then only the first serialises in-process and keeps ids and messages
    assert (local.serial() is local.lock) is one_process
    local._opened()
    assert (local.blocks is not None) is one_process
    assert (local.recent is not None) is one_process
    # and it counts the routing changes committed here
    local.routing_changed()
    assert local.routing_changes == 1


def test_host_instances_and_timer_hints_are_the_databases() -> None:
    local = database_local.DatabaseLocal("k", one_process=True)
    assert local.instance_registered("b") == ["b"]
    assert local.instance_registered("a") == ["a", "b"]
    local.instance_unregistered("b")
    assert local.instances() == ["a"]
    local.timer_set("h", 20.0)
    local.timer_set("h", 10.0)
    assert local.timer_set_before("h", 11.0)
    assert not local.timer_set_before("h", 10.0)
    assert not local.timer_set_before("other", 1e12)
    local.timers_looked_at("h")
    assert not local.timer_set_before("h", 1e12)
