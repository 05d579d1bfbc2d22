"""Backends as siblings behind one small interface.

Every difference between DuckDB and PostgreSQL lives in ``dialects/<name>.py``: how a
URL becomes an engine, how a batch is staged and routed, how rows are bulk-inserted,
how subscription changes are serialised and how driver errors are translated. Business
code asks for capabilities (``supports_skip_locked``, ``supports_notify``), never for a
dialect's name.
"""

from __future__ import annotations

import sqlalchemy as sa

from messagebox.errors import ValidationError
from messagebox.storage.dialects.base import (
    Dialect,
    Indexed,
    RouteRow,
    Same,
    StagedBatch,
    Target,
    Uuids,
)

__all__ = [
    "Dialect",
    "Indexed",
    "RouteRow",
    "Same",
    "StagedBatch",
    "Target",
    "Uuids",
    "dialect_for",
    "parse_url",
]


def parse_url(url: str | sa.URL) -> sa.URL:
    """A store's URL, parsed and checked: one that is not a URL, names a backend other
    than DuckDB and PostgreSQL, or that its backend would misread, is refused
    (:class:`~messagebox.errors.ValidationError`) saying how to write it."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise ValidationError(
            f"not a database URL: {str(url)!r} (duckdb:///relative.duckdb, "
            "duckdb:////absolute/path.duckdb or postgresql+psycopg://user@host/db)"
        ) from exc
    _dialect_class(parsed).check_url(parsed)
    return parsed


def dialect_for(url: sa.URL) -> Dialect:
    """The dialect for a URL's backend (``duckdb`` or ``postgresql``), once
    :func:`parse_url` accepts it."""
    dialect = _dialect_class(url)
    dialect.check_url(url)
    return dialect()


def _dialect_class(url: sa.URL) -> type[Dialect]:
    backend = url.get_backend_name()
    if backend == "duckdb":
        from messagebox.storage.dialects.duckdb import DuckDBDialect

        return DuckDBDialect
    if backend == "postgresql":
        from messagebox.storage.dialects.postgresql import PostgreSQLDialect

        return PostgreSQLDialect
    if backend == "postgres":
        raise ValidationError(
            f"{url.drivername}:// is not a scheme SQLAlchemy reads: write "
            "postgresql+psycopg://user@host/db"
        )
    raise ValidationError(
        f"unsupported backend {backend!r}: use duckdb:///path or postgresql+psycopg://…"
    )
