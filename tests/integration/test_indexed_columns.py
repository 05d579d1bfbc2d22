"""Columns given in dictionary form (:class:`~messagebox.storage.dialects.Indexed`: distinct
values and each row's position among them, as a publish gives its queue entries'
subscriptions, hosts and messages) store the same rows as plain lists, for every column
type the schema uses, on both backends and on DuckDB's bound and Arrow paths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox.storage.dialects import Indexed, dialect_for
from messagebox.storage.dialects import duckdb as duck
from tests.every_type import ROWS, every_type, metadata

POSITIONS = [2, 0, 2, 1, 0]
"""Every value used, some twice, out of order."""


def _stored(engine: sa.Engine, rows: Mapping[str, Sequence[Any]]) -> list[tuple[object, ...]]:
    with engine.begin() as conn:
        conn.execute(every_type.delete())
        dialect_for(engine.url).insert(conn, every_type, rows)
        got = conn.execute(sa.select(every_type)).all()
    return sorted((tuple(r) for r in got), key=repr)


@pytest.mark.parametrize(
    ("url_fixture", "small"),
    [("duckdb_url", 0), ("duckdb_url", 100), ("pg_url", 0)],
    ids=["duckdb-arrow", "duckdb-bound", "postgresql-copy"],
)
def test_indexed_columns_store_what_lists_store(
    url_fixture: str, small: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend_url = str(request.getfixturevalue(url_fixture))
    monkeypatch.setattr(duck, "SMALL_INSERT", small)
    indexed = {name: Indexed(values, POSITIONS) for name, values in ROWS.items()}
    plain = {name: [values[i] for i in POSITIONS] for name, values in ROWS.items()}
    assert [list(c) for c in indexed.values()] == list(plain.values())
    assert indexed["text"][1:3] == plain["text"][1:3]
    assert indexed["id"][3] == plain["id"][3]
    engine = sa.create_engine(backend_url)
    try:
        with engine.begin() as conn:
            metadata.create_all(conn, checkfirst=False)
        got = _stored(engine, indexed)
        assert len(got) == len(POSITIONS)
        assert got == _stored(engine, plain)
    finally:
        engine.dispose()
