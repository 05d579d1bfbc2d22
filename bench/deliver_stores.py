"""Where ``bench.deliver`` keeps its queues: one throw-away PostgreSQL schema for the
whole run, DuckDB files in a temporary directory; the PostgreSQL reachability check; and
:class:`Env`, what a run needs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
import sqlalchemy as sa

if TYPE_CHECKING:
    from bench.deliver_crews import WorkerPool


class PgStore:
    """The run's throw-away schema; reset (dropped and re-created) before each case."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.schema = f"bench_deliver_{secrets.token_hex(4)}"
        url = sa.make_url(base_url)
        self.dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.mb_url = url.update_query_dict(
            {"options": f"-csearch_path={self.schema}"}
        ).render_as_string(hide_password=False)
        self.admin = psycopg.connect(self.dsn, autocommit=True)
        self.admin.execute("SET lock_timeout = '30s'")  # never hang on a stray lock
        self.admin.execute(f"CREATE SCHEMA {self.schema}")

    def reset(self) -> None:
        """An empty schema, and a checkpoint so that none falls inside the next case."""
        self.admin.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.admin.execute(f"CREATE SCHEMA {self.schema}")
        with suppress(psycopg.errors.InsufficientPrivilege):
            self.admin.execute("CHECKPOINT")

    def count(self, table: str) -> int:
        row = self.admin.execute(f"SELECT count(*) FROM {self.schema}.{table}").fetchone()
        return int(row[0]) if row else 0

    def setting(self, name: str) -> str:
        row = self.admin.execute(f"SHOW {name}").fetchone()
        return str(row[0]) if row else "?"

    def close(self) -> None:
        try:
            self.admin.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        finally:
            self.admin.close()


class DuckStore:
    """A temporary directory with one DuckDB file per case."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="bench-deliver-")
        self._n = 0

    @contextmanager
    def fresh(self) -> Iterator[str]:
        """A new DuckDB file path, removed afterwards."""
        self._n += 1
        path = os.path.join(self.folder, f"case-{self._n}.duckdb")
        try:
            yield path
        finally:
            for leftover in (path, f"{path}.wal"):
                if os.path.exists(leftover):
                    os.remove(leftover)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def pg_check(base_url: str) -> str | None:
    """None when PostgreSQL answers, else why not."""
    dsn = sa.make_url(base_url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]


@dataclass
class Env:
    """Everything a case needs: the stores, the process pool and the options."""

    args: argparse.Namespace
    pg: PgStore | None = None
    duck: DuckStore | None = None
    pool: WorkerPool | None = None
    warnings: list[str] = field(default_factory=list)
