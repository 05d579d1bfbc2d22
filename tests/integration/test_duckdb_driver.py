"""What the store changes in duckdb_engine's SQLAlchemy dialect: each statement is
compiled once (the driver leaves the compiled-statement cache off; every statement then
cost 0.3-1 ms of compiling), and a connection given back to the pool is rolled back only
when a transaction is open (a rollback with nothing open fails on DuckDB, 0.4 ms); work
done with ``isolation_level="AUTOCOMMIT"`` runs no BEGIN and COMMIT (a statement each)."""

from __future__ import annotations

from typing import Any

import duckdb_engine
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import default

from messagebox import MessageBox
from messagebox.storage import schema


def test_a_statement_run_twice_is_compiled_once(duckdb_url: str) -> None:
    box = MessageBox(duckdb_url)
    try:
        box.create_host("h")

        def query(name: str) -> sa.Select[Any]:  # a shape only this test uses
            return sa.select(schema.host.c.name.label("test_cache")).where(
                schema.host.c.name == name
            )

        with box.store.engine.connect() as conn:
            first = conn.execute(query("h"))
            assert first.scalar_one() == "h"
            again = conn.execute(query("x"))
            assert again.scalar_one_or_none() is None
        assert first.context.cache_hit is default.CACHE_MISS
        assert again.context.cache_hit is default.CACHE_HIT  # same shape, other value
    finally:
        box.close()


def test_a_connection_given_back_mid_transaction_is_rolled_back(duckdb_url: str) -> None:
    box = MessageBox(duckdb_url)
    try:
        with box.store.engine.connect() as conn:  # begins a transaction, never commits
            conn.execute(schema.meta.insert().values(key="test.lost", value="1"))
        assert _test_keys(box) == []
        box.create_host("kept")  # and the connection works on
        assert [h.name for h in box.hosts()] == ["kept"]
    finally:
        box.close()


def test_a_committed_transaction_costs_no_rollback(
    duckdb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = MessageBox(duckdb_url)
    rollbacks: list[object] = []
    real = duckdb_engine.Dialect.do_rollback

    def counted(self: Any, conn: Any) -> None:
        rollbacks.append(conn)
        real(self, conn)

    monkeypatch.setattr(duckdb_engine.Dialect, "do_rollback", counted)
    try:
        for i in range(3):
            with box.store.transaction() as conn:
                conn.execute(schema.meta.insert().values(key=f"test.{i}", value="1"))
        assert rollbacks == []
        with pytest.raises(RuntimeError, match="the work failed"):
            _insert_then_fail(box)
        assert len(rollbacks) == 1  # the failed one, once
        assert _test_keys(box) == ["test.0", "test.1", "test.2"]
    finally:
        box.close()


def test_autocommit_work_runs_no_begin_or_commit_and_each_statement_commits_alone(
    duckdb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = MessageBox(duckdb_url)
    calls: list[str] = []
    for name in ("do_begin", "do_commit", "do_rollback"):
        real = getattr(duckdb_engine.Dialect, name)

        def counted(self: Any, conn: Any, real: Any = real, name: str = name) -> None:
            calls.append(name)
            real(self, conn)

        monkeypatch.setattr(duckdb_engine.Dialect, name, counted)
    try:
        # When work without a transaction writes, then fails
        with pytest.raises(RuntimeError, match="the work failed"):
            _insert_then_fail(box, autocommit=True)
        # Then its statement committed alone, with no BEGIN, COMMIT or ROLLBACK
        assert calls == []
        assert _test_keys(box) == ["test.failed"]
        # And the pooled connection is back to transactions
        calls.clear()
        with pytest.raises(RuntimeError, match="the work failed"):
            _insert_then_fail(box, key="test.rolled-back")
        assert calls == ["do_begin", "do_rollback"]
        assert _test_keys(box) == ["test.failed"]
    finally:
        box.close()


def _test_keys(box: MessageBox) -> list[str]:
    m = schema.meta
    with box.store.engine.connect() as conn:
        keys = conn.execute(sa.select(m.c.key).where(m.c.key.like("test.%")).order_by(m.c.key))
        return list(keys.scalars())


def _insert_then_fail(box: MessageBox, key: str = "test.failed", autocommit: bool = False) -> None:
    with box.store.transaction(autocommit=autocommit) as conn:
        conn.execute(schema.meta.insert().values(key=key, value="1"))
        raise RuntimeError("the work failed")
