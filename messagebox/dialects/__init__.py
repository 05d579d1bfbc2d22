"""Backends as siblings behind one small interface.

Every difference between DuckDB and PostgreSQL lives in ``dialects/<name>.py``: how a
URL becomes an engine, how a batch is staged and routed, how rows are bulk-inserted,
how subscription changes are serialised and how driver errors are translated. Business
code asks for capabilities (``supports_skip_locked``, ``supports_notify``), never for a
dialect's name.
"""

from __future__ import annotations

import sqlalchemy as sa

from messagebox.dialects.base import (
    Dialect,
    Indexed,
    RouteRow,
    Same,
    StagedBatch,
    Target,
    Uuids,
)
from messagebox.errors import BackendUnavailable

__all__ = [
    "Dialect",
    "Indexed",
    "RouteRow",
    "Same",
    "StagedBatch",
    "Target",
    "Uuids",
    "dialect_for",
]


def dialect_for(url: sa.URL) -> Dialect:
    """The dialect for a URL's backend (``duckdb`` or ``postgresql``)."""
    backend = url.get_backend_name()
    if backend == "duckdb":
        from messagebox.dialects.duckdb import DuckDBDialect

        return DuckDBDialect()
    if backend == "postgresql":
        from messagebox.dialects.postgresql import PostgreSQLDialect

        return PostgreSQLDialect()
    raise BackendUnavailable(
        f"unsupported backend {backend!r}: use duckdb:///path or postgresql+psycopg://…"
    )
