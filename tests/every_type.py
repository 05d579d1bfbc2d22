"""A table with a column of every type the schema uses, and rows that try each one's
edges: for the tests of the backends' bulk inserts."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()
every_type = sa.Table(
    "t_every_type",
    metadata,
    sa.Column("big", sa.BigInteger),
    sa.Column("small", sa.SmallInteger),
    sa.Column("num", sa.Integer),
    sa.Column("real", sa.Double),
    sa.Column("flag", sa.Boolean),
    sa.Column("stamp", sa.DateTime(timezone=True)),
    sa.Column("blob", sa.LargeBinary),
    sa.Column("text", sa.Text),
    sa.Column("id", sa.Uuid),
)

ROWS: dict[str, Sequence[Any]] = {
    "big": [2**62, -1, None],
    "small": [7, -32768, None],
    "num": [2**31 - 1, 0, None],
    "real": [1.5, -0.0, None],
    "flag": [True, False, None],
    "stamp": [
        datetime(2024, 5, 1, 10, tzinfo=UTC),
        datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2))),  # the same instant
        datetime(2024, 5, 1, 10),  # naive: taken as UTC
    ],
    "blob": [b"\x00\xff", b"", None],
    "text": ["é 😀\t\\N\n", "", None],
    "id": [uuid.UUID(int=1), None, uuid.UUID(int=2**128 - 1)],
}
