"""The PgQueuer peer of ``bench.deliver``: install, enqueue, and queue managers as
consumers (PgQueuer is imported lazily: it is optional).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import metadata
from typing import Any

import psycopg

from bench.deliver_common import PUBLISH_BATCH, SERVICE, Add, Body, EventLike


def pgqueuer_version() -> str | None:
    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return None


def _pgq_settings(schema: str) -> Any:
    from pgqueuer.domain.settings import DBSettings
    from pgqueuer.domain.types import Channel

    return DBSettings(db_schema=schema, channel=Channel(f"{schema}_pgq"))


def pgq_install(conn: psycopg.Connection[Any], schema: str) -> None:
    """PgQueuer's tables, types and trigger in ``schema`` (which exists)."""
    from pgqueuer.adapters.persistence import qb

    conn.execute(qb.QueryBuilderEnvironment(_pgq_settings(schema)).build_install_query(False))


def pgq_enqueue(conn: psycopg.Connection[Any], schema: str, n: int) -> None:
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.queries import SyncQueries

    queries = SyncQueries(SyncPsycopgDriver(conn), qbq=qb.QueryQueueBuilder(_pgq_settings(schema)))
    for start in range(0, n, PUBLISH_BATCH):
        m = min(n, start + PUBLISH_BATCH) - start
        queries.enqueue([SERVICE] * m, [b"x"] * m, [0] * m)


async def pgq_connect(driver: str, dsn: str) -> tuple[Any, Any]:
    """A connection and PgQueuer's driver over it."""
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

        conn: Any = await asyncpg.connect(dsn)
        return conn, AsyncpgDriver(conn)
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return conn, PsycopgDriver(conn)


def pgq_queries(pg_driver: Any, schema: str, add: Add | None) -> Any:
    """PgQueuer's ``Queries`` on ``schema``; ``add`` hears of each written completion."""
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.queries import Queries

    class CountingQueries(Queries):
        async def log_jobs(self, job_status: Any) -> None:
            await super().log_jobs(job_status)
            if add is not None:
                add(len(job_status))

    settings = _pgq_settings(schema)
    return CountingQueries(
        pg_driver,
        qbe=qb.QueryBuilderEnvironment(settings),
        qbq=qb.QueryQueueBuilder(settings),
        qbs=qb.QuerySchedulerBuilder(settings),
    )


async def _pgq_noop(job: Any) -> None:
    """The do-nothing entrypoint."""


async def pgq_manager(
    driver: str, dsn: str, schema: str, add: Add | None, handler: Callable[[Any], Any]
) -> tuple[Any, Any]:
    """A queue manager with ``handler`` as the entrypoint, and its connection."""
    from pgqueuer import QueueManager

    conn, pg_driver = await pgq_connect(driver, dsn)
    qm = QueueManager(pgq_queries(pg_driver, schema, add), channel=_pgq_settings(schema).channel)
    qm.entrypoint(SERVICE, accepts_context=False)(handler)
    return qm, conn


def pgq_body(driver: str, dsn: str, schema: str, batch: int, consumers: int) -> Body:
    """``consumers`` queue managers on one asyncio loop."""

    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        async def main() -> dict[str, Any]:
            made = [
                await pgq_manager(driver, dsn, schema, add, _pgq_noop) for _ in range(consumers)
            ]
            try:
                ready()
                await asyncio.to_thread(go.wait)
                runs = [asyncio.create_task(qm.run(batch_size=batch)) for qm, _ in made]
                await asyncio.to_thread(stop.wait)
                for qm, _ in made:
                    qm.shutdown.set()
                await asyncio.gather(*runs)
            finally:
                for _, conn in made:
                    await conn.close()
            return {}

        return asyncio.run(main())

    return body
