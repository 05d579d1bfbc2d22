"""PostgreSQL, for several processes and machines: ``postgresql+psycopg://user@host/db``.

``postgresql://`` URLs are given the psycopg 3 driver. A batch is staged as arrays and
unnested inside the routing statement (one round trip); bulk writes are multi-row
``INSERT … SELECT FROM unnest(…)`` statements. Subscription changes take a transaction-
scoped advisory lock so that shared predicates are created and collected safely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

import sql
from messagebox.dialects import Dialect, RouteRow, StagedBatch
from messagebox.dialects._ddl import create_all
from messagebox.errors import AlreadyExists, BackendUnavailable, MessageBoxError

_PG = pg.dialect()  # type: ignore[no-untyped-call]


def _array_type(column: sa.Column[Any]) -> str:
    compiled = column.type.compile(dialect=_PG)
    return compiled.split(" COLLATE ")[0] + "[]"


class PostgreSQLDialect(Dialect):
    name: ClassVar[str] = "postgresql"
    supports_skip_locked: ClassVar[bool] = True
    supports_notify: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._inserts: dict[tuple[str, tuple[str, ...]], str] = {}

    def create_engine(self, url: sa.URL) -> sa.Engine:
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        return sa.create_engine(url, pool_pre_ping=True)

    def create_schema(self, conn: sa.Connection, metadata: sa.MetaData) -> None:
        conn.exec_driver_sql(sql.load(self.name, "lock_schema"))
        create_all(conn, metadata, indexes=True)

    def route(self, conn: sa.Connection, batch: StagedBatch) -> list[RouteRow]:
        params = {
            "n": batch.n,
            "msg": batch.msg,
            "name": batch.name,
            "fam": batch.fam,
            "v_str": batch.v_str,
            "hi": batch.hi,
            "lo": batch.lo,
            "v_int": batch.v_int,
        }
        rows = conn.exec_driver_sql(self.route_sql, params).fetchall()
        return [tuple(r) for r in rows]

    def insert(
        self, conn: sa.Connection, table: sa.Table, columns: Mapping[str, Sequence[Any]]
    ) -> None:
        key = (table.name, tuple(columns))
        statement = self._inserts.get(key)
        if statement is None:
            arrays = ", ".join(f"%({name})s::{_array_type(table.c[name])}" for name in columns)
            statement = (
                f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"
            )
            self._inserts[key] = statement
        conn.exec_driver_sql(statement, {name: list(values) for name, values in columns.items()})

    def lock_subscriptions(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql(sql.load(self.name, "lock_subscriptions"))

    def translate(self, exc: BaseException, statement: str | None = None) -> MessageBoxError:
        if isinstance(exc, sa.exc.OperationalError) and statement is None:
            return BackendUnavailable(f"cannot reach PostgreSQL: {str(exc.orig).strip()}")
        if isinstance(getattr(exc, "orig", None), psycopg.errors.UniqueViolation):
            return AlreadyExists(f"postgresql: {str(exc.orig).strip().splitlines()[0]}")  # type: ignore[attr-defined]
        return super().translate(exc, statement)
