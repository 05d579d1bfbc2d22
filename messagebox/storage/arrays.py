"""Lists as one array parameter: ``column IN values`` (:func:`one_of`) and arrays for
``CAST(:p AS T[])`` (:func:`array_param`). On PostgreSQL an array goes as its text
literal, one parameter, typed in the statement."""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from messagebox.storage import capabilities

_hex = operator.attrgetter("hex")
"""A UUID's 32 hex digits, which PostgreSQL reads as the UUID (a third of the time of
its hyphenated form, made by ``UUID.__str__`` in Python)."""


class _ArrayLiteral(sa.types.UserDefinedType[list[Any]]):
    """A list sent to PostgreSQL as one array literal in text, the parameter typed in the
    statement (``$1::UUID[]``): psycopg would dump a list item by item (a 10,000-id
    cleanup chunk made a 2.9 MB peak of Python objects; 50 UUIDs 47 us against 24). The
    cast is on the parameter itself, so the array is a constant the planner sees, not a
    text converted again for each row a scan reads."""

    cache_ok = True
    render_bind_cast = True

    def __init__(self, element: str) -> None:
        self.element = element

    def get_col_spec(self, **kw: Any) -> str:
        return f"{self.element}[]"

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        bare = _BARE.get(self.element)
        if bare is None:
            return array_literal

        def process(values: Iterable[Any]) -> str:
            try:
                return "{" + ",".join(map(bare, values)) + "}"
            except (TypeError, AttributeError):  # not all of one type: the general form
                return array_literal(values)

        return process


_ELEMENTS: dict[type[sa.types.TypeEngine[Any]], str] = {
    sa.BigInteger: "BIGINT",
    sa.Integer: "INTEGER",
    sa.Uuid: "UUID",
    sa.Text: "TEXT",
    sa.String: "TEXT",
}
_BARE: dict[str, Any] = {"BIGINT": int.__repr__, "INTEGER": int.__repr__, "UUID": _hex}


def array_param(conn: sa.Connection, values: Sequence[Any]) -> Any:
    """A list as one array parameter (``CAST(:p AS T[])``): on PostgreSQL, its text
    literal (psycopg dumps a list item by item, escaping text with a regular expression:
    200 JSON states took 2.0 ms against 0.1); elsewhere, or for text PostgreSQL refuses
    (a NUL), the list itself."""
    return pg_array(values) if capabilities.of(conn).arrays_as_text else values


def pg_array(values: Iterable[Any]) -> str | list[Any]:
    """A PostgreSQL array parameter: the values' text literal, or their list where
    PostgreSQL refuses the text (a NUL), so that psycopg's own error names it."""
    values = values if isinstance(values, list) else list(values)
    try:
        return array_literal(values)
    except ValueError:
        return values


def array_literal(values: Iterable[Any]) -> str:
    """PostgreSQL's text form of a one-dimensional array: ints and UUIDs bare, anything
    else double-quoted with backslash escapes, ``None`` as NULL."""
    values = values if isinstance(values, list) else list(values)
    if values and all(type(v) is str for v in values):
        return _text_literal(values)
    if all(type(v) is uuid.UUID for v in values):
        return "{" + ",".join(map(_hex, values)) + "}"
    if all(type(v) is int for v in values):
        return "{" + ",".join(map(int.__repr__, values)) + "}"
    items = []
    for v in values:
        if v is None:
            items.append("NULL")
        elif isinstance(v, (int, uuid.UUID)) and not isinstance(v, bool):
            items.append(str(v))
        else:
            text = str(v)
            if "\x00" in text:
                raise ValueError(f"PostgreSQL refuses a NUL character in text: {text!r}")
            items.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(items) + "}"


def bytea_literal(values: Iterable[Any]) -> str:
    """PostgreSQL's text form of a ``bytea[]``: each value in hex (``\\x...``), None
    as NULL (psycopg would escape each value's text form with a regular expression).
    ``TypeError`` for a value that is not bytes-like."""
    items = []
    for v in values:
        if v is None:
            items.append("NULL")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            items.append('"\\\\x' + v.hex() + '"')
        else:
            raise TypeError(f"not bytes: {type(v).__name__}")
    return "{" + ",".join(items) + "}"


def _text_literal(values: list[str]) -> str:
    """:func:`array_literal` of strings, escaped all at once: the escapes of a joined
    text are the joined escapes, so the work is a few passes in C, not a few calls a
    value (the contexts of a publish, 1,000 JSON texts, took 0.6 ms against 2.3)."""
    joined = "\x00".join(values)  # PostgreSQL refuses a NUL in text: none can be in one
    if joined.count("\x00") != len(values) - 1:
        bad = next(v for v in values if "\x00" in v)
        raise ValueError(f"PostgreSQL refuses a NUL character in text: {bad!r}")
    escaped = joined.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", '","')
    return '{"' + escaped + '"}'


def one_of(
    conn: sa.Connection, column: sa.ColumnElement[Any], values: Iterable[Any]
) -> sa.ColumnElement[bool]:
    """``column IN values``, as one array parameter: an IN list is a parameter per value,
    which psycopg parses anew for each list length (a third of an orchestration step's
    CPU went there) and SQLAlchemy renders one by one (5-10 us a value). On PostgreSQL
    ``= ANY($1::T[])``, the array sent as one literal (``_ArrayLiteral``); on DuckDB
    ``list_contains``, which measured faster than its IN list at every table size tried
    (20k to 10M rows: 100 ids deleted in 1.6 ms against 2.4 at 1M rows), or for a long
    list a semi-join on the array (``DUCKDB_SEMI_JOIN_FROM``)."""
    values = list(values)
    if capabilities.of(conn).arrays_as_text:
        element = _ELEMENTS.get(type(column.type))
        if element is not None:
            return column == sa.any_(sa.bindparam(None, values, type_=_ArrayLiteral(element)))
        return column == sa.any_(sa.bindparam(None, values, type_=sa.ARRAY(column.type)))
    kind = sa.ARRAY(column.type)
    array = sa.cast(sa.bindparam(None, values, type_=kind), kind)  # UUIDs given as text too
    if len(values) > DUCKDB_SEMI_JOIN_FROM:
        return column.in_(sa.select(sa.func.unnest(array)).scalar_subquery())
    return sa.type_coerce(sa.func.list_contains(array, column), sa.Boolean)


DUCKDB_SEMI_JOIN_FROM = 100
"""On DuckDB, lists longer than this are matched as a semi-join (``IN (SELECT
unnest(...))``, hashed): ``list_contains`` tests every row against the whole list. 800
ids of a 10k-row table: 2.4 ms selected and 2.8 deleted, against 4.8 and 6.3 (1M rows:
2.7 and 3.1 against 7.2 and 9.3); at 50 ids the two are within 10%."""
