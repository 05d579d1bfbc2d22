"""``schema.one_of``: ``column IN values`` on both backends (on PostgreSQL an array
parameter) selects exactly the rows whose value is among those given, for ints, UUIDs
and text that an array literal would have to quote (hypothesis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import schema
from messagebox.engine import MessageBox
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


def _table() -> sa.Table:
    return sa.Table(
        "t_one_of",
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

        assert where(schema.one_of(conn, t.c.n, ns)) == {n for n in ns if 0 <= n < len(IDS)}
        assert where(schema.one_of(conn, t.c.id, ids)) == set(picks)
        assert where(schema.one_of(conn, t.c.name, names)) == {
            i for i in range(len(IDS)) if NAMES[i % len(NAMES)] in names
        }
        # a NULL among the values matches nothing
        assert where(schema.one_of(conn, t.c.id, [*ids, None])) == set(picks)


def test_text_with_a_nul_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="NUL character in text: 'a\\\\x00b'"):
        schema.array_literal(["ok", "a\x00b"])


@settings(max_examples=60, deadline=None)
@given(values=st.lists(TEXT | st.none() | st.sampled_from(NAMES)))
def test_postgresql_reads_an_array_literal_back_as_the_values(
    pg_connection: sa.Connection, values: list[str | None]
) -> None:
    """The text form ``one_of`` sends parses, on the server, into exactly the list given."""
    typed = sa.bindparam("v", values, type_=schema._ArrayLiteral("TEXT"))
    assert pg_connection.execute(sa.select(typed)).scalar_one() == values


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
