"""DuckDB engines compile each SQLAlchemy statement once (duckdb_engine leaves the
compiled-statement cache off; every statement then cost 0.3-1 ms of compiling)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import default

from messagebox import MessageBox, schema


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
