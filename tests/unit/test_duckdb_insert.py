"""DuckDB inserts: a few rows bind parameters, more go through an Arrow table; both
store the same values for every column type the schema uses."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from messagebox.storage.dialects import duckdb as duck
from messagebox.storage.ids import uuid7s
from tests.every_type import ROWS, every_type, metadata


def stored(monkeypatch: pytest.MonkeyPatch, small: int) -> list[tuple[object, ...]]:
    monkeypatch.setattr(duck, "SMALL_INSERT", small)
    engine = sa.create_engine("duckdb:///:memory:")
    with engine.begin() as conn:
        metadata.create_all(conn)
        duck.DuckDBDialect().insert(conn, every_type, ROWS)
        return [tuple(r) for r in conn.execute(sa.select(every_type))]


def test_bound_and_arrow_inserts_store_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    bound = stored(monkeypatch, small=100)
    arrow = stored(monkeypatch, small=0)
    assert bound == arrow
    assert [r[5] for r in bound] == [datetime(2024, 5, 1, 10, tzinfo=UTC)] * 3
    assert bound[0][8] == uuid.UUID(int=1)


def test_no_rows_insert_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duck, "SMALL_INSERT", 100)
    engine = sa.create_engine("duckdb:///:memory:")
    with engine.begin() as conn:
        metadata.create_all(conn)
        duck.DuckDBDialect().insert(conn, every_type, {name: [] for name in ROWS})
        assert conn.execute(sa.select(sa.func.count()).select_from(every_type)).scalar() == 0


@pytest.mark.parametrize("native", [True, False])
def test_uuid_columns_store_the_same_as_objects_text_or_none(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """UUIDs go as Arrow's ``arrow.uuid`` when the libraries allow and every value is a
    ``uuid.UUID`` or None, else as text cast in SQL: the stored values are the same."""
    if not native:
        monkeypatch.setattr(duck, "_native_uuids", lambda: False)
    monkeypatch.setattr(duck, "SMALL_INSERT", 0)
    ids = [uuid.UUID(int=i * 7919) for i in range(4)]
    table = sa.Table("t_uuid", sa.MetaData(), sa.Column("n", sa.Integer), sa.Column("u", sa.Uuid))
    engine = sa.create_engine("duckdb:///:memory:")
    with engine.begin() as conn:
        table.create(conn)
        dialect = duck.DuckDBDialect()
        dialect.insert(conn, table, {"n": [0, 1, 2, 3], "u": [ids[0], None, ids[2], ids[3]]})
        dialect.insert(conn, table, {"n": [4, 5], "u": [str(ids[1]), ids[0]]})  # text among
        edges = [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.uuid4(), *uuid7s(2)]
        dialect.insert(conn, table, {"n": [6, 7, 8, 9, 10], "u": edges})  # UUIDs only
        got = [tuple(r) for r in conn.execute(sa.select(table).order_by(table.c.n))]
    assert got == [
        (0, ids[0]),
        (1, None),
        (2, ids[2]),
        (3, ids[3]),
        (4, ids[1]),
        (5, ids[0]),
        *zip(range(6, 11), edges, strict=True),
    ]
    if native:
        assert duck._native_uuids()  # this machine's pyarrow and DuckDB take them
