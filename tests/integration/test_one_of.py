"""``arrays.one_of``: ``column IN values`` on both backends (on PostgreSQL an array
parameter) selects exactly the rows whose value is among those given, for ints, UUIDs
and text that an array literal would have to quote (hypothesis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox.engine import MessageBox
from messagebox.storage import arrays
from tests.conftest import require_pg, scratch_url

IDS = [uuid.UUID(int=i * 7919) for i in range(12)]
NAMES = ["a", "b,c", 'd"e', "f\\g", "{h}", "NULL", " i ", "j'k"]
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
"""Any text a store can hold (PostgreSQL refuses NUL)."""


@pytest.fixture
def stored(backend_url: str) -> Iterator[MessageBox]:
    """A store with a table of rows (n, id, name), one per index of IDS and NAMES."""
    box = MessageBox(backend_url)
    with box.store.transaction() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE t_one_of (n BIGINT PRIMARY KEY, id UUID NOT NULL, name TEXT NOT NULL)"
        )
        table = _table()
        conn.execute(
            table.insert(),
            [{"n": i, "id": IDS[i], "name": NAMES[i % len(NAMES)]} for i in range(len(IDS))],
        )
    try:
        yield box
    finally:
        box.close()


def _table(name: str = "t_one_of") -> sa.Table:
    """The table (n, id, name) as SQLAlchemy sees it."""
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("n", sa.BigInteger),
        sa.Column("id", sa.Uuid),
        sa.Column("name", sa.Text),
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ns=st.lists(st.integers(min_value=-3, max_value=15)),
    picks=st.lists(st.integers(min_value=0, max_value=len(IDS) - 1)),
    names=st.lists(st.sampled_from([*NAMES, "absent"]) | TEXT),
)
def test_one_of_selects_exactly_the_rows_given(
    stored: MessageBox, ns: list[int], picks: list[int], names: list[str]
) -> None:
    t = _table()
    ids = [IDS[i] for i in picks]
    with stored.store.transaction() as conn:

        def where(clause: sa.ColumnElement[bool]) -> set[int]:
            return set(conn.execute(sa.select(t.c.n).where(clause)).scalars())

        assert where(arrays.one_of(conn, t.c.n, ns)) == {n for n in ns if 0 <= n < len(IDS)}
        assert where(arrays.one_of(conn, t.c.id, ids)) == set(picks)
        assert where(arrays.one_of(conn, t.c.name, names)) == {
            i for i in range(len(IDS)) if NAMES[i % len(NAMES)] in names
        }
        # a NULL among the values matches nothing
        assert where(arrays.one_of(conn, t.c.id, [*ids, None])) == set(picks)


def test_text_with_a_nul_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="NUL character in text: 'a\\\\x00b'"):
        arrays.array_literal(["ok", "a\x00b"])


@settings(max_examples=60, deadline=None)
@given(values=st.lists(TEXT | st.none() | st.sampled_from(NAMES)))
def test_postgresql_reads_an_array_literal_back_as_the_values(
    pg_connection: sa.Connection, values: list[str | None]
) -> None:
    """The text form ``one_of`` sends parses, on the server, into exactly the list given."""
    typed = sa.bindparam("v", values, type_=arrays._ArrayLiteral("TEXT"))
    assert pg_connection.execute(sa.select(typed)).scalar_one() == values


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(TEXT | st.sampled_from(NAMES), min_size=1),
    ids=st.lists(st.uuids(), min_size=1),
)
def test_postgresql_reads_lists_of_one_type_back_exactly(
    pg_connection: sa.Connection, texts: list[str], ids: list[uuid.UUID]
) -> None:
    """Lists all of text, or all of UUIDs, take a shorter way to their literal (the
    text escaped at once); the server reads them back as the values."""
    for values, element in ((texts, "TEXT"), (ids, "UUID")):
        typed = sa.bindparam("v", values, type_=arrays._ArrayLiteral(element))
        assert pg_connection.execute(sa.select(typed)).scalar_one() == values
    assert arrays.array_literal(texts) == _literal_one_by_one(texts)


def _literal_one_by_one(values: list[str]) -> str:
    """The array literal of texts, each quoted and escaped alone."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


def test_a_nul_is_named_in_a_list_of_texts() -> None:
    for values in (["a\x00b"], ["ok", "a\x00b", "c"], ["\x00"]):
        with pytest.raises(ValueError, match="NUL character in text: '"):
            arrays.array_literal(values)
    with pytest.raises(ValueError, match="'b\\\\x00'"):
        arrays.array_literal(["ok", "b\x00"])


@pytest.mark.parametrize("extra", [0, arrays.DUCKDB_SEMI_JOIN_FROM + 1, 2_000])
def test_long_lists_select_and_delete_exactly_the_rows_given(
    stored: MessageBox, extra: int
) -> None:
    """A list past ``DUCKDB_SEMI_JOIN_FROM`` (a semi-join on DuckDB) selects and
    deletes exactly the rows given, as a short one does; UUIDs may come as text."""
    t = _table()
    absent = [uuid.UUID(int=(1 << 100) + i) for i in range(extra)]
    picks = [1, 4, 5, 11]
    with stored.store.transaction() as conn:

        def where(clause: sa.ColumnElement[bool]) -> set[int]:
            return set(conn.execute(sa.select(t.c.n).where(clause)).scalars())

        ids = [IDS[i] for i in picks] + absent
        assert where(arrays.one_of(conn, t.c.id, ids)) == set(picks)
        assert where(arrays.one_of(conn, t.c.id, [str(i) for i in ids])) == set(picks)
        assert where(arrays.one_of(conn, t.c.n, [*picks, *range(100, 100 + extra)])) == set(picks)
        names = [NAMES[1], NAMES[2], *(f"absent {i}" for i in range(extra))]
        assert where(arrays.one_of(conn, t.c.name, names)) == {
            i for i in range(len(IDS)) if NAMES[i % len(NAMES)] in names[:2]
        }
        gone = conn.execute(
            t.delete().where(arrays.one_of(conn, t.c.id, ids)).returning(t.c.n)
        ).scalars()
        assert set(gone) == set(picks)
        assert where(sa.true()) == set(range(len(IDS))) - set(picks)


@pytest.fixture(scope="module")
def pg_connection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sa.Connection]:
    """One connection to a scratch PostgreSQL database (nothing is stored)."""
    require_pg()
    with scratch_url("postgresql", tmp_path_factory.mktemp("pg")) as url:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()


def _arrays_table(conn: sa.Connection) -> sa.Table:
    """A table of nullable (n, id, name), created once, emptied for each example."""
    conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t_arrays (n BIGINT, id UUID, name TEXT)")
    conn.exec_driver_sql("DELETE FROM t_arrays")
    return _table("t_arrays")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    names=st.lists(TEXT | st.none() | st.sampled_from(NAMES), min_size=1, max_size=12),
    nulls=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_small_writes_store_text_and_uuids_exactly(
    stored: MessageBox, names: list[str | None], nulls: list[bool]
) -> None:
    """A small write (on PostgreSQL one statement, its text and UUID columns sent as
    array literals) stores exactly the values given, quotes, braces and NULLs too."""
    ids = [None if nulls[i] else IDS[i] for i in range(len(names))]
    with stored.store.transaction() as conn:
        table = _arrays_table(conn)
        stored.store.dialect.insert_many(
            conn, [(table, {"n": list(range(len(names))), "id": ids, "name": names})]
        )
        rows = conn.execute(sa.select(table.c.id, table.c.name).order_by(table.c.n)).all()
    assert [tuple(r) for r in rows] == list(zip(ids, names, strict=True))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(
        st.tuples(
            st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.none() | st.binary(max_size=40),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_small_writes_store_ints_and_bytes_exactly(
    stored: MessageBox, rows: list[tuple[int | None, bytes | None]]
) -> None:
    """Ints and bytes of a small write (on PostgreSQL array literals too: bytes in hex)
    are stored exactly, NULLs, zero bytes and the 64-bit bounds too."""
    binary = "BYTEA" if stored.backend == "postgresql" else "BLOB"
    with stored.store.transaction() as conn:
        conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS t_ints (n BIGINT, k BIGINT, b {binary})")
        conn.exec_driver_sql("DELETE FROM t_ints")
        table = sa.Table(
            "t_ints",
            sa.MetaData(),
            sa.Column("n", sa.BigInteger),
            sa.Column("k", sa.BigInteger),
            sa.Column("b", sa.LargeBinary),
        )
        stored.store.dialect.insert_many(
            conn,
            [
                (
                    table,
                    {
                        "n": list(range(len(rows))),
                        "k": [k for k, _ in rows],
                        "b": [b for _, b in rows],
                    },
                )
            ],
        )
        back = conn.execute(sa.select(table.c.k, table.c.b).order_by(table.c.n)).all()
    assert [tuple(r) for r in back] == rows


def test_a_nul_in_a_small_write_is_refused_as_before(stored: MessageBox) -> None:
    """Text PostgreSQL refuses goes to psycopg as a list, which names the NUL; nothing
    is stored. (DuckDB stores it.)"""
    with stored.store.transaction() as conn:
        table = _arrays_table(conn)
    columns: dict[str, list[Any]] = {"n": [0, 1], "id": IDS[:2], "name": ["ok", "a\x00b"]}
    write = [(table, columns)]
    if stored.backend == "postgresql":
        with pytest.raises(Exception, match="NUL"), stored.store.transaction() as conn:
            stored.store.dialect.insert_many(conn, write)
        with stored.store.transaction() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
    else:
        with stored.store.transaction() as conn:
            stored.store.dialect.insert_many(conn, write)
            assert conn.execute(sa.select(table.c.name).order_by(table.c.n)).scalars().all() == [
                "ok",
                "a\x00b",
            ]


def test_array_params_are_literals_on_postgresql_only(stored: MessageBox) -> None:
    """``arrays.array_param``: PostgreSQL gets the array's text literal (it reads it
    back as the values), DuckDB the list; text with a NUL stays a list."""
    values = ['a"b', "c\\d", None, "{e,f}"]
    with stored.store.transaction() as conn:
        param = arrays.array_param(conn, values)
        if stored.backend == "postgresql":
            assert param == arrays.array_literal(values)
        else:
            assert param is values
        back = conn.execute(sa.text("SELECT CAST(:v AS TEXT[])").bindparams(v=param)).scalar_one()
        assert list(back) == values
        assert arrays.array_param(conn, ["a\x00b"]) == ["a\x00b"]
