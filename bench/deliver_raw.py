"""The raw baseline of ``bench.deliver``: a ``DELETE ... RETURNING`` loop over a plain
table, with ``SKIP LOCKED`` on PostgreSQL and under an in-process lock on DuckDB.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import psycopg

from bench.deliver_common import RAW_TABLE, Add, Body, EventLike, noop
from bench.deliver_stores import PgStore

RAW_PG_DELETE = (
    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT %s "
    "FOR UPDATE SKIP LOCKED) RETURNING id, sent"
)
RAW_DUCKDB_DELETE = (
    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT ?) "
    "RETURNING id, sent"
)


def _raw_loop(
    delete: Callable[[], list[Any]],
    stop: EventLike,
    add: Add,
    *,
    idle_s: float | None,
    latencies: list[float] | None,
) -> dict[str, Any]:
    """Delete batches until the table is empty (``idle_s`` None) or ``stop``; rows are
    ``(id, sent)``. Records ``now - sent`` per row when ``latencies`` is given."""
    done = 0
    while not stop.is_set():
        rows = delete()
        if rows:
            if latencies is not None:
                now = time.time()
                latencies.extend(now - sent for _, sent in rows)
            for row in rows:
                noop(row)
            done += len(rows)
            add(len(rows))
        elif idle_s is None:
            break
        else:
            stop.wait(idle_s)
    return {"completed": done, "latencies": latencies or []}


def raw_pg_body(
    dsn: str, schema: str, batch: int, *, idle_s: float | None = None, record: bool = False
) -> Body:
    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        sql = RAW_PG_DELETE.format(table=f"{schema}.{RAW_TABLE}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT 1")
            ready()
            go.wait()
            return _raw_loop(
                lambda: conn.execute(sql, (batch,), prepare=True).fetchall(),
                stop,
                add,
                idle_s=idle_s,
                latencies=[] if record else None,
            )

    return body


def raw_duckdb_body(
    db: duckdb.DuckDBPyConnection,
    lock: threading.Lock,
    batch: int,
    *,
    idle_s: float | None = None,
    record: bool = False,
) -> Body:
    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        sql = RAW_DUCKDB_DELETE.format(table=RAW_TABLE)
        cur = db.cursor()

        def delete() -> list[Any]:
            with lock:
                return cur.execute(sql, [batch]).fetchall()

        try:
            ready()
            go.wait()
            return _raw_loop(delete, stop, add, idle_s=idle_s, latencies=[] if record else None)
        finally:
            cur.close()

    return body


def raw_fill_pg(pg: PgStore, n: int) -> None:
    table = f"{pg.schema}.{RAW_TABLE}"
    pg.admin.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, sent double precision NOT NULL, "
        "body bytea NOT NULL)"
    )
    if n:
        pg.admin.execute(
            f"INSERT INTO {table} SELECT g, 0, 'x'::bytea FROM generate_series(1, %s) g", (n,)
        )
    pg.admin.execute(f"ANALYZE {table}")


def raw_fill_duckdb(db: duckdb.DuckDBPyConnection, n: int) -> None:
    db.execute(f"CREATE TABLE {RAW_TABLE} (id BIGINT PRIMARY KEY, sent DOUBLE NOT NULL, body BLOB)")
    if n:
        db.execute(f"INSERT INTO {RAW_TABLE} SELECT range, 0, 'x'::BLOB FROM range(1, ?)", [n + 1])
