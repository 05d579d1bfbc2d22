"""PostgreSQL bulk inserts: ``COPY`` in binary format when every value has the Python
type its column's binary dumper takes (ids given as text become UUIDs), in text format
otherwise; both store the same values for every column type the schema uses (naive
times as UTC), and a value out of its column's range is refused, never wrapped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from messagebox.models import State
from messagebox.storage.dialects import Same
from messagebox.storage.dialects import postgresql as pg_dialect
from tests.every_type import ROWS, every_type, metadata

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(pg_url)
    with eng.begin() as conn:
        metadata.create_all(conn)
    try:
        yield eng
    finally:
        eng.dispose()


def stored(
    engine: sa.Engine, rows: Mapping[str, Sequence[Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[object, ...]], str]:
    """The rows as stored, and the COPY format used."""
    formats: list[str] = []
    choose = pg_dialect._copy_columns

    def watched(table: sa.Table, columns: Mapping[str, Sequence[Any]]) -> Any:
        found = choose(table, columns)
        formats.append("text" if found[0] is None else "binary")
        return found

    monkeypatch.setattr(pg_dialect, "_copy_columns", watched)
    with engine.begin() as conn:
        conn.execute(every_type.delete())
        pg_dialect.PostgreSQLDialect().insert(conn, every_type, rows)
        got = [tuple(r) for r in conn.execute(sa.select(every_type).order_by(every_type.c.big))]
    return got, formats[0]


def test_binary_and_text_copies_store_the_same(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, used = stored(engine, ROWS, monkeypatch)
    assert used == "binary"
    # a Decimal is not a float: the whole table goes as text, as the driver adapts it
    text, used = stored(engine, {**ROWS, "real": [Decimal("1.5"), -0.0, None]}, monkeypatch)
    assert used == "text"
    assert binary == text
    assert {r[5] for r in binary} == {datetime(2024, 5, 1, 10, tzinfo=UTC)}
    assert {r[7] for r in binary} == {"é 😀\t\\N\n", "", None}


def test_ids_given_as_text_and_repeated_values_are_copied_in_binary(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_text = {**ROWS, "id": [str(uuid.UUID(int=1)), None, str(uuid.UUID(int=2**128 - 1))]}
    binary, used = stored(engine, as_text, monkeypatch)
    assert used == "binary"
    assert {r[8] for r in binary} == {uuid.UUID(int=1), None, uuid.UUID(int=2**128 - 1)}
    same = {**ROWS, "text": Same("x", 3), "stamp": Same(datetime(2024, 5, 1, 10), 3)}
    repeated, used = stored(engine, same, monkeypatch)
    assert used == "binary"
    assert {(r[5], r[7]) for r in repeated} == {(datetime(2024, 5, 1, 10, tzinfo=UTC), "x")}


def test_values_the_binary_dumpers_would_misread_go_as_text_and_are_refused(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a naive time is UTC on the text path too (a StrEnum sends the table as text)
    text, used = stored(
        engine,
        {**ROWS, "text": [State.STARTED, "", None], "stamp": Same(datetime(2024, 5, 1, 10), 3)},
        monkeypatch,
    )
    assert used == "text"
    assert {r[5] for r in text} == {datetime(2024, 5, 1, 10, tzinfo=UTC)}
    for column, bad in (("num", 2**31), ("small", 70_000), ("id", "not-a-uuid")):
        values = list(ROWS[column])
        values[0] = bad
        with pytest.raises(psycopg.Error, match=r"out of range|invalid input syntax"):
            stored(engine, {**ROWS, column: values}, monkeypatch)
        with engine.connect() as conn:  # the failed insert's transaction changed nothing
            assert sorted(conn.execute(sa.select(every_type)).all(), key=str) == sorted(
                text, key=str
            )
