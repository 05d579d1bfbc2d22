"""A connection the caller owns, used for a while as this package's: its open
transaction is joined, never begun, committed, rolled back or closed here.

A SQLAlchemy ``Connection`` (or a ``Session``'s) on the psycopg 3 driver is used as it
is. A psycopg 3 ``Connection`` is lent to SQLAlchemy through an engine of its own whose
dialect leaves transactions and the connection alone (:class:`_LentDialect`): its pool
hands out the lent connection, and checking it in closes nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.pool import NullPool

from messagebox.errors import ValidationError

_LENT: contextvars.ContextVar[psycopg.Connection[Any]] = contextvars.ContextVar("mb_lent")


class _LentDialect(PGDialect_psycopg):
    """psycopg 3, on a connection the caller owns: no BEGIN, COMMIT, ROLLBACK or close
    of its own, and nothing set on the connection when it is handed out."""

    supports_statement_cache = True  # its statements compile as psycopg's do

    def do_begin(self, dbapi_connection: Any) -> None:
        """The caller's transaction is open already."""

    def do_commit(self, dbapi_connection: Any) -> None:
        """The caller commits."""

    def do_rollback(self, dbapi_connection: Any) -> None:
        """The caller rolls back."""

    def do_close(self, dbapi_connection: Any) -> None:
        """The caller closes it."""

    def on_connect(self) -> None:
        """No notice handler or isolation level set on the caller's connection."""


sa.dialects.registry.register("postgresql.mblent", __name__, "_LentDialect")


def lender(url: sa.URL) -> sa.Engine:
    """An engine that lends the connection :func:`lend` is given (one per store)."""
    return sa.create_engine(
        url.set(drivername="postgresql+mblent"),
        creator=_LENT.get,
        poolclass=NullPool,
        use_native_hstore=False,
    )


@contextmanager
def lend(engine: sa.Engine, raw: psycopg.Connection[Any]) -> Iterator[sa.Connection]:
    """``raw`` (in a transaction of its owner's) as a SQLAlchemy connection of
    ``engine`` (:func:`lender`)."""
    token = _LENT.set(raw)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        _LENT.reset(token)


def usable(external: object, dialect_name: str) -> sa.Connection | psycopg.Connection[Any]:
    """The connection of ``external`` (a SQLAlchemy ``Connection`` or ``Session``, or a
    psycopg 3 ``Connection``), checked to be open, in a transaction its owner began,
    on the psycopg 3 driver; :class:`ValidationError` says what is wrong otherwise."""
    if isinstance(external, psycopg.Connection):
        status = external.info.transaction_status
        if external.closed:
            raise ValidationError("connection= is closed")
        if status == TransactionStatus.INERROR:
            raise ValidationError(
                "connection= is in a failed transaction: roll it back (nothing was published)"
            )
        if status != TransactionStatus.INTRANS:
            raise ValidationError(
                "connection= has no open transaction: publish joins the caller's transaction "
                "(begin one: `with conn.transaction():`, or run a statement first without "
                "autocommit)"
            )
        return external
    if _is_session(external):
        if not external.in_transaction():  # type: ignore[attr-defined]
            raise ValidationError(
                "connection= is a Session with no open transaction: begin one "
                "(`with session.begin():`) and publish inside it"
            )
        external = external.connection()  # type: ignore[attr-defined]
    if not isinstance(external, sa.Connection):
        raise ValidationError(
            "connection= takes a SQLAlchemy Connection or Session, or a psycopg 3 "
            f"Connection, not {type(external).__name__}"
        )
    if external.closed or external.invalidated:
        raise ValidationError("connection= is closed")
    if external.dialect.name != dialect_name:
        raise ValidationError(
            f"connection= is a {external.dialect.name} connection; this store is {dialect_name}"
        )
    if external.dialect.driver not in ("psycopg", "mblent"):
        raise ValidationError(
            f"connection= uses the {external.dialect.driver} driver; messagebox publishes "
            "through psycopg 3 (postgresql+psycopg://)"
        )
    raw = external.connection.driver_connection
    if not external.in_transaction() or getattr(raw, "autocommit", False):
        raise ValidationError(
            "connection= has no open transaction (or is in autocommit): publish joins the "
            "caller's transaction (`with engine.begin() as conn:`)"
        )
    return external


def _is_session(obj: object) -> bool:
    try:
        from sqlalchemy.orm import Session
    except ImportError:  # pragma: no cover - the ORM is part of SQLAlchemy
        return False
    return isinstance(obj, Session)
