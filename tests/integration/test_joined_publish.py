"""Publishing in the caller's transaction (issue 56, part 1): ``publish(connection=)``
joins a transaction the application owns (a SQLAlchemy Connection or Session, a psycopg
3 Connection on PostgreSQL; ``box.transaction()`` on both backends). The caller's
rollback leaves nothing, its commit routes and delivers once; a connection that cannot
be joined is refused before anything is written; and a service writes its rows,
completes its delivery and publishes in one commit (``Delivery.transaction``)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from messagebox import Message, MessageBox
from messagebox.errors import Conflict, ValidationError
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import Outcome
from messagebox.predicates import P
from tests.apps import joined_publisher
from tests.conftest import table_counts, wait_for
from tests.integration.test_delivery import FAST

ROOT = Path(__file__).resolve().parents[2]

ORDERS = "CREATE TABLE IF NOT EXISTS app_orders (id integer PRIMARY KEY, note text)"


def setup(box: MessageBox) -> None:
    box.create_host("h", **FAST)
    box.subscribe("ship", host="h", filter=P("o.Id") >= 0, name="ship")
    with box.transaction() as conn:
        conn.exec_driver_sql(ORDERS)


def order(n: int) -> Message:
    return Message(f"order {n}".encode(), promoted={"o.Id": n})


def counts(box: MessageBox) -> dict[str, int]:
    """Every messagebox table's rows, and the application's."""
    with box.transaction() as conn:
        mine = conn.exec_driver_sql("SELECT count(*) FROM app_orders").scalar_one()
    return {**table_counts(box), "app_orders": int(mine)}


def depth(box: MessageBox) -> int:
    return sum(q.depth for q in box.queue_depth())


@pytest.fixture
def user_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(pg_url)
    yield engine
    engine.dispose()


def psycopg_dsn(pg_url: str) -> str:
    return sa.make_url(pg_url).set(drivername="postgresql").render_as_string(False)


# --- box.transaction(): both backends ---


def test_box_transaction_commits_rows_and_messages_together(box: MessageBox) -> None:
    setup(box)
    with box.transaction() as conn:
        conn.exec_driver_sql("INSERT INTO app_orders VALUES (1, 'one')")
        [routed] = box.publish([order(1)], connection=conn)
        assert routed.outcome is Outcome.ROUTED
    assert depth(box) == 1
    assert counts(box)["app_orders"] == 1


def test_box_transaction_rolled_back_leaves_nothing(box: MessageBox) -> None:
    setup(box)
    before = counts(box)

    def change_of_mind() -> None:
        with box.transaction() as conn:
            conn.exec_driver_sql("INSERT INTO app_orders VALUES (2, 'two')")
            box.publish([order(2), order(3)], connection=conn)
            raise RuntimeError("the application changed its mind")

    with pytest.raises(RuntimeError, match="the application changed its mind"):
        change_of_mind()
    assert counts(box) == before


def test_a_service_writes_completes_and_publishes_in_one_commit(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """``Delivery.transaction``: the service's row, the entry's completion and what it
    published commit together; a failure inside rolls all of it back and the delivery
    is retried, so the row is written once."""
    setup(box)
    box.create_host("next", **FAST)
    box.subscribe("confirm", host="next", filter=P("c.Id") >= 0, name="confirm")
    failed_once: set[int] = set()

    def ship(d: Delivery) -> None:
        n = int(d.properties["o.Id"])  # type: ignore[arg-type]
        with d.transaction() as conn:
            conn.exec_driver_sql(f"INSERT INTO app_orders VALUES ({n}, 'shipped')")
            d.publish_on_completion(Message(b"ok", promoted={"c.Id": n}))
            if n % 3 == 0 and n not in failed_once:
                failed_once.add(n)
                raise RuntimeError("the carrier refused it this time")
        with pytest.raises(ValidationError, match="after this delivery completed"):
            d.publish_on_completion(Message(b"late", promoted={"c.Id": n}))

    inst = HostInstance(box, "h", {"ship": ship}, settings={"max_attempts": 3})
    instances.append(inst.start())
    box.publish([order(n) for n in range(12)])
    wait_for(lambda: counts(box)["app_orders"] == 12 and not box.queue_depth("h"), what="shipped")
    assert box.suspended() == []
    assert [q.depth for q in box.queue_depth("next")] == [12]  # one confirmation each
    assert failed_once == {0, 3, 6, 9}


def test_a_service_transaction_whose_lease_was_lost_commits_nothing(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    setup(box)
    outcome: list[BaseException] = []
    seen = threading.Event()

    def ship(d: Delivery) -> None:
        try:
            with d.transaction() as conn:
                conn.exec_driver_sql("INSERT INTO app_orders VALUES (7, 'late')")
                q = "UPDATE mb_queue SET lease_owner = 'someone-else' WHERE id = " + str(d.entry_id)
                conn.exec_driver_sql(q)  # as if its lease lapsed and another took it
        except Conflict as exc:
            outcome.append(exc)
            raise
        finally:
            seen.set()

    inst = HostInstance(box, "h", {"ship": ship}, settings={"max_attempts": 1})
    instances.append(inst.start())
    box.publish([order(7)])
    wait_for(seen.is_set, what="the delivery")
    [exc] = outcome
    assert "no longer leased" in str(exc)
    assert counts(box)["app_orders"] == 0  # the service's row rolled back with it


# --- a connection the application owns: PostgreSQL ---


@pytest.mark.parametrize("kind", ["connection", "session", "psycopg"])
def test_the_callers_commit_publishes_and_its_rollback_leaves_nothing(
    pg_url: str, user_engine: sa.Engine, kind: str
) -> None:
    with MessageBox(pg_url) as box:
        setup(box)
        with joined(kind, pg_url, user_engine) as (conn, finish):
            conn_execute(conn, "INSERT INTO app_orders VALUES (1, 'kept')")
            [routed] = box.publish([order(1)], connection=conn)
            assert routed.outcome is Outcome.ROUTED
            assert depth(box) == 0  # not visible before the caller commits
            finish(commit=True)
        assert depth(box) == 1
        committed = counts(box)
        assert committed["app_orders"] == 1
        with joined(kind, pg_url, user_engine) as (conn, finish):
            conn_execute(conn, "INSERT INTO app_orders VALUES (2, 'dropped')")
            box.publish([order(2), order(3)], connection=conn)
            finish(commit=False)
        assert counts(box) == committed  # every table as the commit left it


def conn_execute(conn: Any, statement: str) -> None:
    if isinstance(conn, psycopg.Connection):
        conn.execute(statement)
    elif isinstance(conn, Session):
        conn.execute(sa.text(statement))
    else:
        conn.exec_driver_sql(statement)


class joined:
    """A connection of ``kind`` in an open transaction, and how to end it."""

    def __init__(self, kind: str, pg_url: str, engine: sa.Engine) -> None:
        self.kind, self.pg_url, self.engine = kind, pg_url, engine

    def __enter__(self) -> tuple[Any, Any]:
        if self.kind == "psycopg":
            self.conn: Any = psycopg.connect(psycopg_dsn(self.pg_url))
        elif self.kind == "session":
            self.conn = Session(self.engine)
            self.conn.begin()
        else:
            self.conn = self.engine.connect()
            self.conn.begin()

        def finish(*, commit: bool) -> None:
            (self.conn.commit if commit else self.conn.rollback)()

        return self.conn, finish

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def test_connections_that_cannot_be_joined_are_refused_and_nothing_is_written(
    pg_url: str, user_engine: sa.Engine
) -> None:
    with MessageBox(pg_url) as box:
        setup(box)
        before = counts(box)

        def refused(conn: Any, says: str) -> None:
            with pytest.raises(ValidationError, match=says):
                box.publish([order(1)], connection=conn)

        refused(5, "takes a SQLAlchemy Connection or Session, or a psycopg 3 Connection")
        with user_engine.connect() as idle:
            refused(idle, "no open transaction")
        with user_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as auto:
            auto.begin()
            refused(auto, "no open transaction")
        raw = psycopg.connect(psycopg_dsn(pg_url), autocommit=True)
        refused(raw, "no open transaction")
        with raw.transaction():
            raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            refused(raw, "repeatable read transaction; publish needs read committed")
        raw.close()
        refused(raw, "is closed")
        aborted = psycopg.connect(psycopg_dsn(pg_url))
        with pytest.raises(psycopg.Error):
            aborted.execute("SELECT 1/0")
        refused(aborted, "failed transaction")
        aborted.close()
        other = psycopg.connect(psycopg_dsn(pg_url).split("?")[0])  # public: no store there
        other.execute("SELECT 1")
        refused(other, "does not see this box.s store|another messagebox store")
        other.close()
        with Session(user_engine) as session:
            refused(session, "Session with no open transaction")
        assert counts(box) == before


def test_another_stores_connection_is_refused(pg_url: str, user_engine: sa.Engine) -> None:
    """Two stores in one schema cannot be; the same tables seen under another box's id
    (a copy of the schema, say) are refused by the store id."""
    with MessageBox(pg_url) as box:
        setup(box)
        box.store.id = "another-store"  # as a box of another store would hold it
        with (
            user_engine.begin() as conn,
            pytest.raises(ValidationError, match="another messagebox store"),
        ):
            box.publish([order(1)], connection=conn)


def test_duckdb_takes_only_its_own_transaction(duckdb_url: str, tmp_path: Any) -> None:
    import duckdb

    with MessageBox(duckdb_url) as box:
        setup(box)
        foreign = duckdb.connect(str(tmp_path / "other.duckdb"))
        with pytest.raises(ValidationError, match="only the connections of its own"):
            box.publish([order(1)], connection=foreign)
        with (
            box.store.engine.begin() as conn,  # the box's engine, not box.transaction()
            pytest.raises(ValidationError, match="only the connections of its own"),
        ):
            box.publish([order(1)], connection=conn)
        foreign.close()


def test_a_joined_publish_routes_by_the_subscriptions_committed_meanwhile(
    pg_url: str, user_engine: sa.Engine
) -> None:
    """The routing index catches up inside the caller's transaction, as every publish's
    does: a subscription another process added is routed to."""
    with MessageBox(pg_url) as box, MessageBox(pg_url) as other:
        setup(box)
        with user_engine.begin() as conn:
            box.publish([order(1)], connection=conn)  # the index is loaded
        other.create_host("late", **FAST)
        other.subscribe("late", host="late", filter=P("o.Id") == 2, name="late")
        with user_engine.begin() as conn:
            [routed] = box.publish([order(2)], connection=conn)
        assert len(routed.subscriptions) == 2


def kill_one_publisher(url: str, start: int, acked: Path, after: float) -> None:
    """Start a publisher at order ``start``; once it has committed one, SIGKILL it
    ``after`` seconds later (a random moment of its publishing, not a wait)."""
    if url.startswith("postgresql"):
        child = multiprocessing.get_context("fork").Process(
            target=joined_publisher.run, args=(url, start, str(acked))
        )
        child.start()
        pid, alive = child.pid, child.is_alive
    else:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.joined_publisher", url, str(start), str(acked)],
            cwd=ROOT,
        )
        pid, alive = proc.pid, lambda: proc.poll() is None
    assert pid is not None
    wait_for(lambda: str(start) in acked.read_text().split(), what="the first commit")
    time.sleep(after)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(), what="the publisher ended")


def test_a_row_and_its_message_commit_together_whatever_kills_the_publisher(
    backend_url: str, tmp_path: Path
) -> None:
    """20 runs of a publisher SIGKILLed at a random moment once it publishes: every
    order row has its one message and every message its row; every acknowledged one is
    there. (PostgreSQL: a forked child of this process, quick to start; DuckDB: a
    process of its own, as a fork would share this process's id blocks.)"""
    with MessageBox(backend_url) as box:
        setup(box)
    acked = tmp_path / "acked"
    acked.touch()
    rng = random.Random(56)
    for run in range(20):
        kill_one_publisher(backend_url, run * 100_000, acked, rng.uniform(0.0, 0.4))
    with MessageBox(backend_url) as box:
        with box.transaction() as conn:
            rows = {int(r[0]) for r in conn.exec_driver_sql("SELECT id FROM app_orders")}
        messages: list[int] = [
            int(props["o.Id"])  # type: ignore[arg-type]
            for chunk in box.iter_promoted()
            for _, props in chunk
        ]
    done = {int(line) for line in acked.read_text().split()}
    print(f"20 kills: {len(rows)} rows, {len(messages)} messages, {len(done)} acknowledged")
    assert len(messages) == len(set(messages))  # one message per order
    assert set(messages) == rows  # never a row without its message, nor a message alone
    assert done <= rows  # every acknowledged one committed
    assert len(rows) >= 20  # each run committed some
