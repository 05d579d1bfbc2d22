"""Delivery: host-instance dequeue + complete throughput and publish-to-handler latency,
beside PgQueuer and a raw ``SKIP LOCKED`` delete loop, in the same run.

What it measures
    Throughput: for each backend, each consumer shape (1, 2 and 4 threads of one
    process; on PostgreSQL also 2 and 4 processes) and each claim batch (1, 10, 100),
    a fresh store gets a backlog of M messages (published in batches of 1,000 before the
    clock starts), then consumers with a do-nothing handler drain it. The clock runs from
    releasing the (already connected) consumers until the last completion is committed,
    or until ``--cap`` seconds, whichever comes first (a capped figure is marked ``*``).
    Completions are counted in memory (no polling queries competing for the two CPUs a
    small machine has): the raw loops count their deletes, PgQueuer its written
    completions, and a messagebox consumer copies its instance's ``stats`` every 5 ms.
    The queue tables are checked afterwards. Worker processes are spawned once and
    reused; PostgreSQL is checkpointed before each case.

    Systems, on the same PostgreSQL and the same machine:

    - ``raw SKIP LOCKED``: the limit. Workers loop ``DELETE FROM t WHERE id IN (SELECT id
      FROM t ORDER BY id LIMIT b FOR UPDATE SKIP LOCKED) RETURNING ...`` with psycopg in
      autocommit, one statement per batch. On DuckDB (no row locks) the same delete
      runs under an in-process lock, as messagebox serialises its claims.
    - ``PgQueuer``: the peer. N jobs enqueued with batch ``enqueue``; consumers are
      ``QueueManager.run(batch_size=b)`` with a do-nothing entrypoint. "Threads" for
      PgQueuer means k queue managers (k connections) on one asyncio loop; "processes"
      means one queue manager per process. A job counts once its completion is written
      (PgQueuer buffers those and deletes the jobs in batches).
    - ``messagebox``: a :class:`~hosts.instance.HostInstance` with ``dequeue_threads=k``
      and ``claim_batch=b`` (threads), or one single-threaded instance per process
      (processes, each with its own MessageBox on the same URL).

    Latency: one message per publish at a steady ``--rate`` (default 200/s) for
    ``--latency-seconds``, into an idle consumer (one thread or queue manager, batch 10);
    the latency of a message is handler start minus the wall time just before its publish
    call. Published from the same process as the consumer, except the messagebox
    "1 process" row (woken across processes by NOTIFY).

Run it from the project root::

    python -m bench.deliver                         # 20,000 messages, full matrix (~6 min)
    python -m bench.deliver --quick                 # smoke run: 2,000 messages, 1 s caps (~1 min)
    python -m bench.deliver --backends postgresql --batches 10 --threads 1,4 --processes 4
    python -m bench.deliver --systems messagebox --latency-seconds 0

PostgreSQL is reached at ``--pg-url`` (default ``$MESSAGEBOX_BENCH_PG_URL`` or
``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and skipped, with a note, when it
cannot be reached. Everything lives in one throw-away schema ``bench_deliver_<random>``
(reset between runs, dropped at the end; PgQueuer is installed into it too) and DuckDB
files in a temporary directory. PgQueuer (``pip install 'pgqueuer[asyncpg]'``: the
``bench`` extra) is optional; without it its columns are skipped, and without asyncpg it
runs on its psycopg driver (``--pgq-driver``), which is slower.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

import duckdb
import psycopg
import sqlalchemy as sa

from hosts.instance import HostInstance
from hosts.service import Delivery
from messagebox import schema as mb_schema
from messagebox.engine import MessageBox
from messagebox.message import Message
from predicates import P

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ("duckdb", "postgresql")
SYSTEMS = ("raw", "pgqueuer", "messagebox")
PUBLISH_BATCH = 1_000
HOST = "bench"
SERVICE = "noop"
POLL_MIN_S = 0.01
POLL_MAX_S = 0.2
LATENCY_BATCH = 10
RAW_IDLE_S = 0.001  # the raw loop's poll interval when idle (latency runs)
RAW_TABLE = "raw_queue"
WATCH_S = 0.002  # how often the parent reads the completion counters
COUNT_EVERY_S = 0.005  # how often a messagebox consumer publishes its completed count
SETTLE_S = 0.3  # idle time for a latency consumer before the first publish
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 10.0  # latency runs: wait this long for the last deliveries

RAW_PG_DELETE = (
    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT %s "
    "FOR UPDATE SKIP LOCKED) RETURNING id, sent"
)
RAW_DUCKDB_DELETE = (
    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT ?) "
    "RETURNING id, sent"
)


class EventLike(Protocol):
    """``threading.Event`` or a multiprocessing event."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def is_set(self) -> bool: ...
    def set(self) -> None: ...


Add = Callable[[int], None]
"""Report n more completions."""
Body = Callable[[Callable[[], None], EventLike, EventLike, Add], dict[str, Any]]
"""One consumer: ``body(ready, go, stop, add)`` connects, calls ``ready()``, waits for
``go``, consumes (reporting completions through ``add``) until ``stop`` or drained, and
returns a picklable summary."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _noop(_item: object) -> None:
    """The do-nothing handler."""


# --- raw delete loops ---


def _raw_loop(
    delete: Callable[[], list[Any]],
    stop: EventLike,
    add: Add,
    *,
    idle_s: float | None,
    latencies: list[float] | None,
) -> dict[str, Any]:
    """Delete batches until the table is empty (``idle_s`` None) or ``stop``; rows are
    ``(id, sent)``. Records ``now - sent`` per row when ``latencies`` is given."""
    done = 0
    while not stop.is_set():
        rows = delete()
        if rows:
            if latencies is not None:
                now = time.time()
                latencies.extend(now - sent for _, sent in rows)
            for row in rows:
                _noop(row)
            done += len(rows)
            add(len(rows))
        elif idle_s is None:
            break
        else:
            stop.wait(idle_s)
    return {"completed": done, "latencies": latencies or []}


def _raw_pg_body(
    dsn: str, schema: str, batch: int, *, idle_s: float | None = None, record: bool = False
) -> Body:
    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        sql = RAW_PG_DELETE.format(table=f"{schema}.{RAW_TABLE}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT 1")
            ready()
            go.wait()
            return _raw_loop(
                lambda: conn.execute(sql, (batch,), prepare=True).fetchall(),
                stop,
                add,
                idle_s=idle_s,
                latencies=[] if record else None,
            )

    return body


def _raw_duckdb_body(
    db: duckdb.DuckDBPyConnection,
    lock: threading.Lock,
    batch: int,
    *,
    idle_s: float | None = None,
    record: bool = False,
) -> Body:
    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        sql = RAW_DUCKDB_DELETE.format(table=RAW_TABLE)
        cur = db.cursor()

        def delete() -> list[Any]:
            with lock:
                return cur.execute(sql, [batch]).fetchall()

        try:
            ready()
            go.wait()
            return _raw_loop(delete, stop, add, idle_s=idle_s, latencies=[] if record else None)
        finally:
            cur.close()

    return body


# --- messagebox ---


def _mb_settings(threads: int, batch: int) -> dict[str, Any]:
    return {
        "dequeue_threads": threads,
        "claim_batch": batch,
        "max_in_flight": max(1_000, threads * batch),
        "cleanup_interval_seconds": 0,
        "poll_min_seconds": POLL_MIN_S,
        "poll_max_seconds": POLL_MAX_S,
    }


def _mb_open(url: str, n: int) -> MessageBox:
    """A MessageBox with the bench host and one catch-all subscription."""
    box = MessageBox(url, publisher="bench.deliver")
    box.create_host(
        HOST,
        poll_min_seconds=POLL_MIN_S,
        poll_max_seconds=POLL_MAX_S,
        throttle_queue_depth=max(100_000, n + 1),
    )
    box.subscribe(SERVICE, host=HOST, filter=P("b.N") >= 0, name=SERVICE)
    return box


def _mb_body(box: MessageBox | str, threads: int, batch: int, *, record: bool = False) -> Body:
    """A host instance on ``box`` (or a MessageBox it opens on that URL)."""

    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        mb = box if isinstance(box, MessageBox) else MessageBox(box, publisher="bench.deliver")
        received: list[tuple[str, float]] = []

        def record_handler(delivery: Delivery) -> None:
            received.append((str(delivery.message_id), time.time()))

        try:
            inst = HostInstance(
                mb,
                HOST,
                {SERVICE: record_handler if record else _noop},
                settings=_mb_settings(threads, batch),
            )
            ready()
            go.wait()
            inst.start()
            reported = 0
            try:
                while not stop.wait(COUNT_EVERY_S):
                    completed = inst.stats.snapshot()["completed"]
                    add(completed - reported)
                    reported = completed
            finally:
                inst.stop()
            completed = inst.stats.snapshot()["completed"]
            add(completed - reported)
            return {"completed": completed, "received": received}
        finally:
            if mb is not box:
                mb.close()

    return body


# --- PgQueuer ---


def pgqueuer_version() -> str | None:
    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return None


def _pgq_settings(schema: str) -> Any:
    from pgqueuer.domain.settings import DBSettings
    from pgqueuer.domain.types import Channel

    return DBSettings(db_schema=schema, channel=Channel(f"{schema}_pgq"))


def _pgq_install(conn: psycopg.Connection[Any], schema: str) -> None:
    """PgQueuer's tables, types and trigger in ``schema`` (which exists)."""
    from pgqueuer.adapters.persistence import qb

    conn.execute(qb.QueryBuilderEnvironment(_pgq_settings(schema)).build_install_query(False))


def _pgq_enqueue(conn: psycopg.Connection[Any], schema: str, n: int) -> None:
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.queries import SyncQueries

    queries = SyncQueries(SyncPsycopgDriver(conn), qbq=qb.QueryQueueBuilder(_pgq_settings(schema)))
    for start in range(0, n, PUBLISH_BATCH):
        m = min(n, start + PUBLISH_BATCH) - start
        queries.enqueue([SERVICE] * m, [b"x"] * m, [0] * m)


async def _pgq_connect(driver: str, dsn: str) -> tuple[Any, Any]:
    """A connection and PgQueuer's driver over it."""
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

        conn: Any = await asyncpg.connect(dsn)
        return conn, AsyncpgDriver(conn)
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return conn, PsycopgDriver(conn)


def _pgq_queries(pg_driver: Any, schema: str, add: Add | None) -> Any:
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


async def _pgq_manager(
    driver: str, dsn: str, schema: str, add: Add | None, handler: Callable[[Any], Any]
) -> tuple[Any, Any]:
    """A queue manager with ``handler`` as the entrypoint, and its connection."""
    from pgqueuer import QueueManager

    conn, pg_driver = await _pgq_connect(driver, dsn)
    qm = QueueManager(_pgq_queries(pg_driver, schema, add), channel=_pgq_settings(schema).channel)
    qm.entrypoint(SERVICE, accepts_context=False)(handler)
    return qm, conn


def _pgq_body(driver: str, dsn: str, schema: str, batch: int, consumers: int) -> Body:
    """``consumers`` queue managers on one asyncio loop."""

    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        async def main() -> dict[str, Any]:
            made = [
                await _pgq_manager(driver, dsn, schema, add, _pgq_noop) for _ in range(consumers)
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


# --- consumer crews: threads of this process, or reused worker processes ---


class Crew(Protocol):
    def launch(self) -> None:
        """Start the consumers and wait until each is connected and ready."""

    def go(self) -> None:
        """Let them consume."""

    def completed(self) -> int:
        """Completions so far."""

    def finish(self) -> list[dict[str, Any]]:
        """Stop them and return their summaries (raises a consumer's error)."""


class Threads:
    """Consumers as threads of this process, one body each."""

    def __init__(self, bodies: Sequence[Body]) -> None:
        self._bodies = list(bodies)
        self._go = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Semaphore(0)
        self._counts = [0] * len(self._bodies)
        self._results: list[Any] = [None] * len(self._bodies)
        self._threads: list[threading.Thread] = []

    def _run(self, i: int, body: Body) -> None:
        readied = False

        def ready() -> None:
            nonlocal readied
            readied = True
            self._ready.release()

        def add(n: int) -> None:
            self._counts[i] += n

        try:
            self._results[i] = body(ready, self._go, self._stop, add)
        except BaseException as exc:
            self._results[i] = exc
        finally:
            if not readied:
                self._ready.release()

    def launch(self) -> None:
        for i, body in enumerate(self._bodies):
            t = threading.Thread(
                target=self._run, args=(i, body), name=f"consumer-{i}", daemon=True
            )
            self._threads.append(t)
            t.start()
        try:
            for _ in self._bodies:
                if not self._ready.acquire(timeout=READY_TIMEOUT_S):
                    raise RuntimeError("a consumer did not get ready in time")
            self._raise()
        except BaseException:
            self._stop.set()
            self._go.set()
            raise

    def go(self) -> None:
        self._go.set()

    def completed(self) -> int:
        return sum(self._counts)

    def finish(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._go.set()
        for t in self._threads:
            t.join()
        self._raise()
        return list(self._results)

    def _raise(self) -> None:
        for r in self._results:
            if isinstance(r, BaseException):
                raise RuntimeError(f"a consumer failed: {r!r}") from r


@dataclass(frozen=True)
class WorkerTask:
    """What one worker process runs (picklable)."""

    system: str
    batch: int
    dsn: str
    schema: str
    mb_url: str = ""
    pgq_driver: str = "asyncpg"
    record: bool = False


def _task_body(task: WorkerTask) -> Body:
    if task.system == "raw":
        return _raw_pg_body(task.dsn, task.schema, task.batch)
    if task.system == "pgqueuer":
        return _pgq_body(task.pgq_driver, task.dsn, task.schema, task.batch, 1)
    return _mb_body(task.mb_url, 1, task.batch, record=task.record)


def _worker_main(
    index: int,
    tasks: mp.Queue[WorkerTask | None],
    results: mp.Queue[tuple[str, int, Any]],
    go: EventLike,
    stop: EventLike,
    counts: Any,
) -> None:
    """A worker process: run tasks until told to exit (``None``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    logging.basicConfig(level=logging.WARNING)
    results.put(("up", index, None))  # imports done: no longer competing for the CPUs
    while (task := tasks.get()) is not None:

        def ready() -> None:
            results.put(("ready", index, None))

        def add(n: int) -> None:
            counts[index] += n

        try:
            summary = _task_body(task)(ready, go, stop, add)
            results.put(("done", index, summary))
        except BaseException:
            results.put(("error", index, traceback.format_exc()))


class WorkerPool:
    """Spawned worker processes, reused across runs (each costs ~1 s of imports)."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.size = size
        self._go = ctx.Event()
        self._stop = ctx.Event()
        self._counts = ctx.Array("q", size, lock=False)
        self._results: mp.Queue[tuple[str, int, Any]] = ctx.Queue()
        self._tasks: list[mp.Queue[WorkerTask | None]] = [ctx.Queue() for _ in range(size)]
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(i, q, self._results, self._go, self._stop, self._counts),
                name=f"bench-deliver-{i}",
                daemon=True,
            )
            for i, q in enumerate(self._tasks)
        ]
        for p in self._procs:
            p.start()
        self._expect("up", size, READY_TIMEOUT_S)

    def crew(self, task: WorkerTask, k: int) -> Crew:
        if k > self.size:
            raise ValueError(f"{k} processes asked of a pool of {self.size}")
        return _PoolCrew(self, task, k)

    def _expect(self, kind: str, k: int, timeout: float) -> list[Any]:
        out: list[Any] = []
        errors: list[str] = []
        while len(out) + len(errors) < k:
            try:
                status, index, payload = self._results.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"worker processes did not report {kind!r} in time") from None
            if status == "error":
                errors.append(f"worker process {index}:\n{payload}")
            elif status != kind:
                raise RuntimeError(f"worker process {index} said {status!r}, not {kind!r}")
            else:
                out.append(payload)
        if errors:
            raise RuntimeError("\n".join(errors))
        return out

    def close(self) -> None:
        self._go.set()
        self._stop.set()
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)


class _PoolCrew:
    def __init__(self, pool: WorkerPool, task: WorkerTask, k: int) -> None:
        self._pool = pool
        self._task = task
        self._k = k

    def launch(self) -> None:
        pool = self._pool
        pool._go.clear()
        pool._stop.clear()
        for i in range(pool.size):
            pool._counts[i] = 0
        for q in pool._tasks[: self._k]:
            q.put(self._task)
        try:
            pool._expect("ready", self._k, READY_TIMEOUT_S)
        except BaseException:
            pool._stop.set()  # let the ready ones finish; the run is aborted
            pool._go.set()
            raise

    def go(self) -> None:
        self._pool._go.set()

    def completed(self) -> int:
        return int(sum(self._pool._counts[: self._k]))

    def finish(self) -> list[dict[str, Any]]:
        self._pool._stop.set()
        self._pool._go.set()
        return self._pool._expect("done", self._k, READY_TIMEOUT_S)


# --- stores: one PostgreSQL schema for the whole run, DuckDB files in a temp dir ---


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


# --- throughput ---


@dataclass(frozen=True)
class Case:
    backend: str
    system: str
    mode: str  # "threads" | "processes"
    workers: int
    batch: int

    def __str__(self) -> str:
        return f"{self.backend} {self.system} {self.workers} {self.mode} batch {self.batch}"


@dataclass(frozen=True)
class Measured:
    completed: int
    seconds: float
    capped: bool

    @property
    def msgs_per_s(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0


def _raw_fill_pg(pg: PgStore, n: int) -> None:
    table = f"{pg.schema}.{RAW_TABLE}"
    pg.admin.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, sent double precision NOT NULL, "
        "body bytea NOT NULL)"
    )
    if n:
        pg.admin.execute(
            f"INSERT INTO {table} SELECT g, 0, 'x'::bytea FROM generate_series(1, %s) g", (n,)
        )
    pg.admin.execute(f"ANALYZE {table}")


def _raw_fill_duckdb(db: duckdb.DuckDBPyConnection, n: int) -> None:
    db.execute(f"CREATE TABLE {RAW_TABLE} (id BIGINT PRIMARY KEY, sent DOUBLE NOT NULL, body BLOB)")
    if n:
        db.execute(f"INSERT INTO {RAW_TABLE} SELECT range, 0, 'x'::BLOB FROM range(1, ?)", [n + 1])


def _mb_publish(box: MessageBox, n: int) -> None:
    for start in range(0, n, PUBLISH_BATCH):
        box.publish(
            [
                Message(b"x", promoted={"b.N": i})
                for i in range(start, min(n, start + PUBLISH_BATCH))
            ]
        )


@contextmanager
def prepared(env: Env, case: Case, n: int) -> Iterator[tuple[Crew, Callable[[], int]]]:
    """A fresh store with a backlog of ``n``, the case's (not yet launched) consumers, and
    a function counting what is left in the queue."""
    a = env.args
    processes = case.mode == "processes"
    if case.backend == "postgresql":
        pg = env.pg
        assert pg is not None
        pg.reset()

        def task(system: str) -> WorkerTask:
            return WorkerTask(
                system, case.batch, pg.dsn, pg.schema, mb_url=pg.mb_url, pgq_driver=a.pgq_driver
            )

        def crew(threads: Crew) -> Crew:
            if not processes:
                return threads
            assert env.pool is not None
            return env.pool.crew(task(case.system), case.workers)

        if case.system == "raw":
            _raw_fill_pg(pg, n)
            body = _raw_pg_body(pg.dsn, pg.schema, case.batch)
            yield crew(Threads([body] * case.workers)), lambda: pg.count(RAW_TABLE)
        elif case.system == "pgqueuer":
            _pgq_install(pg.admin, pg.schema)
            _pgq_enqueue(pg.admin, pg.schema, n)
            pg.admin.execute(f"ANALYZE {pg.schema}.pgqueuer")
            body = _pgq_body(a.pgq_driver, pg.dsn, pg.schema, case.batch, case.workers)
            yield crew(Threads([body])), lambda: pg.count("pgqueuer")
        else:
            box = _mb_open(pg.mb_url, n)
            try:
                _mb_publish(box, n)
                body = _mb_body(box, case.workers, case.batch)
                yield crew(Threads([body])), lambda: pg.count(mb_schema.queue.name)
            finally:
                box.close()
        return

    duck = env.duck
    assert duck is not None
    assert not processes
    with duck.fresh() as path:
        if case.system == "raw":
            db = duckdb.connect(path)
            try:
                _raw_fill_duckdb(db, n)
                body = _raw_duckdb_body(db, threading.Lock(), case.batch)

                def left() -> int:
                    row = db.execute(f"SELECT count(*) FROM {RAW_TABLE}").fetchone()
                    return int(row[0]) if row else 0

                yield Threads([body] * case.workers), left
            finally:
                db.close()
        else:
            box = _mb_open(f"duckdb:///{path}", n)
            try:
                _mb_publish(box, n)
                yield (
                    Threads([_mb_body(box, case.workers, case.batch)]),
                    lambda: sum(d.depth for d in box.queue_depth(HOST)),
                )
            finally:
                box.close()


def measure(crew: Crew, n: int, cap_s: float) -> Measured:
    """Release the consumers; time them until ``n`` completions or ``cap_s`` seconds."""
    crew.launch()
    done = 0
    elapsed = 0.0
    try:
        start = time.perf_counter()
        crew.go()
        while True:
            done = crew.completed()
            elapsed = time.perf_counter() - start
            if done >= n or elapsed >= cap_s:
                break
            time.sleep(WATCH_S)
    finally:
        crew.finish()
    return Measured(completed=min(done, n), seconds=elapsed, capped=done < n)


def run_case(env: Env, case: Case) -> Measured:
    n = env.args.messages
    with prepared(env, case, n) as (crew, left):
        result = measure(crew, n, env.args.cap)
        remaining = left()
    if not result.capped and remaining:
        env.warnings.append(f"{case}: {remaining} entries left in the queue after the run")
    elif result.capped and n - remaining < result.completed:
        env.warnings.append(
            f"{case}: counted {result.completed} completions but only {n - remaining} "
            "entries are gone"
        )
    return result


def cases(env: Env, backends: Sequence[str], systems: Sequence[str]) -> list[Case]:
    """Every case, the systems of one consumer shape next to each other."""
    a = env.args
    out: list[Case] = []
    for backend in backends:
        shapes = [("threads", k) for k in a.threads]
        if backend == "postgresql":
            shapes += [("processes", k) for k in a.processes]
        for mode, k in shapes:
            for b in a.batches:
                for system in systems:
                    if backend == "duckdb" and system == "pgqueuer":
                        continue
                    out.append(Case(backend, system, mode, k, b))
    return out


# --- latency ---


@dataclass(frozen=True)
class Sample:
    """One latency run: how long producing took, each publish call's duration and each
    delivered message's publish-to-handler time (seconds)."""

    produce_s: float
    calls: list[float]
    seconds: list[float]


@dataclass(frozen=True)
class Latency:
    backend: str
    system: str
    consumer: str
    sent: int
    sample: Sample


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of non-empty ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def paced(count: int, rate: float) -> Iterator[int]:
    """0 .. count-1, the i-th no earlier than i / rate seconds from the start."""
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i


def produce(m: int, rate: float, send: Callable[[int, float], None]) -> tuple[float, list[float]]:
    """``send(i, wall_time_before_the_call)`` m times at ``rate``; returns the elapsed time
    and each call's duration."""
    calls: list[float] = []
    start = time.perf_counter()
    for i in paced(m, rate):
        t = time.time()
        before = time.perf_counter()
        send(i, t)
        calls.append(time.perf_counter() - before)
    return time.perf_counter() - start, calls


def _wait_for(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(WATCH_S)


def _publisher(box: MessageBox, sent: dict[str, float]) -> Callable[[int, float], None]:
    """One message per publish; remembers each message's send time by id."""

    def send(i: int, t: float) -> None:
        [routed] = box.publish([Message(b"x", promoted={"b.N": i})])
        sent[str(routed.message_id)] = t

    return send


def _latencies(sent: dict[str, float], received: dict[str, float]) -> list[float]:
    return [received[k] - t for k, t in sent.items() if k in received]


def latency_messagebox(url: str, m: int, rate: float) -> Sample:
    """Publisher and a one-thread host instance in this process, on one MessageBox."""
    box = _mb_open(url, m)
    sent: dict[str, float] = {}
    received: dict[str, float] = {}

    def handler(delivery: Delivery) -> None:
        received[str(delivery.message_id)] = time.time()

    try:
        inst = HostInstance(box, HOST, {SERVICE: handler}, settings=_mb_settings(1, LATENCY_BATCH))
        inst.start()
        try:
            time.sleep(SETTLE_S)
            produce_s, calls = produce(m, rate, _publisher(box, sent))
            _wait_for(lambda: len(received) >= m, DRAIN_TIMEOUT_S)
        finally:
            inst.stop()
    finally:
        box.close()
    return Sample(produce_s, calls, _latencies(sent, received))


def latency_messagebox_process(pg: PgStore, pool: WorkerPool, m: int, rate: float) -> Sample:
    """Publisher here, a one-thread host instance in a worker process (NOTIFY wakes it)."""
    box = _mb_open(pg.mb_url, m)
    sent: dict[str, float] = {}
    try:
        task = WorkerTask(
            "messagebox", LATENCY_BATCH, pg.dsn, pg.schema, mb_url=pg.mb_url, record=True
        )
        crew = pool.crew(task, 1)
        crew.launch()
        try:
            crew.go()
            time.sleep(2 * SETTLE_S)  # the instance starts and LISTENs after go
            produce_s, calls = produce(m, rate, _publisher(box, sent))
            _wait_for(lambda: crew.completed() >= m, DRAIN_TIMEOUT_S)
        finally:
            [summary] = crew.finish()
    finally:
        box.close()
    return Sample(produce_s, calls, _latencies(sent, dict(summary["received"])))


def latency_pgqueuer(pg: PgStore, driver: str, m: int, rate: float) -> Sample:
    """Producer and one queue manager (batch 10) on one asyncio loop in this process."""
    _pgq_install(pg.admin, pg.schema)
    seconds: list[float] = []
    calls: list[float] = []

    async def handler(job: Any) -> None:
        seconds.append(time.time() - float(job.payload.decode()))

    async def main() -> float:
        qm, consumer_conn = await _pgq_manager(driver, pg.dsn, pg.schema, None, handler)
        producer_conn, producer_driver = await _pgq_connect(driver, pg.dsn)
        producer = _pgq_queries(producer_driver, pg.schema, None)
        run = asyncio.create_task(qm.run(batch_size=LATENCY_BATCH))
        try:
            await asyncio.sleep(SETTLE_S)
            start = time.perf_counter()
            for i in range(m):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                before = time.perf_counter()
                await producer.enqueue(SERVICE, repr(time.time()).encode())
                calls.append(time.perf_counter() - before)
            produce_s = time.perf_counter() - start
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while len(seconds) < m and time.monotonic() < deadline:
                await asyncio.sleep(WATCH_S)
        finally:
            qm.shutdown.set()
            await run
            await consumer_conn.close()
            await producer_conn.close()
        return produce_s

    produce_s = asyncio.run(main())
    return Sample(produce_s, calls, seconds)


def _latency_raw_run(
    body: Body, insert: Callable[[int, float], None], m: int, rate: float
) -> Sample:
    crew = Threads([body])
    crew.launch()
    try:
        crew.go()
        time.sleep(SETTLE_S)
        produce_s, calls = produce(m, rate, lambda i, t: insert(i + 1, t))
        _wait_for(lambda: crew.completed() >= m, DRAIN_TIMEOUT_S)
    finally:
        [summary] = crew.finish()
    return Sample(produce_s, calls, list(summary["latencies"]))


def latency_raw_pg(pg: PgStore, m: int, rate: float) -> Sample:
    """A one-thread raw delete loop (batch 10, 1 ms poll when idle); inserts from here."""
    _raw_fill_pg(pg, 0)
    body = _raw_pg_body(pg.dsn, pg.schema, LATENCY_BATCH, idle_s=RAW_IDLE_S, record=True)
    sql = f"INSERT INTO {pg.schema}.{RAW_TABLE} VALUES (%s, %s, 'x')"

    def insert(i: int, t: float) -> None:
        pg.admin.execute(sql, (i, t), prepare=True)

    return _latency_raw_run(body, insert, m, rate)


def latency_raw_duckdb(path: str, m: int, rate: float) -> Sample:
    """The DuckDB raw loop (under the lock, as are the inserts from here)."""
    db = duckdb.connect(path)
    cur = db.cursor()
    try:
        _raw_fill_duckdb(db, 0)
        lock = threading.Lock()
        body = _raw_duckdb_body(db, lock, LATENCY_BATCH, idle_s=RAW_IDLE_S, record=True)

        def insert(i: int, t: float) -> None:
            with lock:
                cur.execute(f"INSERT INTO {RAW_TABLE} VALUES (?, ?, 'x')", [i, t])

        return _latency_raw_run(body, insert, m, rate)
    finally:
        cur.close()
        db.close()


def latency_runs(env: Env, backend: str, m: int) -> list[tuple[str, str, Callable[[], Sample]]]:
    """(system, consumer, run) for one backend."""
    a = env.args
    runs: list[tuple[str, str, Callable[[], Sample]]] = []
    if backend == "postgresql":
        pg, pool = env.pg, env.pool
        assert pg is not None
        runs.append(("raw", "1 thread, 1 ms poll", lambda: latency_raw_pg(pg, m, a.rate)))
        runs.append(
            ("pgqueuer", "1 queue manager", lambda: latency_pgqueuer(pg, a.pgq_driver, m, a.rate))
        )
        runs.append(("messagebox", "1 thread", lambda: latency_messagebox(pg.mb_url, m, a.rate)))
        if pool is not None:
            runs.append(
                (
                    "messagebox",
                    "1 process (NOTIFY)",
                    lambda: latency_messagebox_process(pg, pool, m, a.rate),
                )
            )
        return runs
    duck = env.duck
    assert duck is not None

    def in_fresh_file(fn: Callable[[str], Sample]) -> Callable[[], Sample]:
        def run() -> Sample:
            with duck.fresh() as path:
                return fn(path)

        return run

    runs.append(
        (
            "raw",
            "1 thread, 1 ms poll",
            in_fresh_file(lambda path: latency_raw_duckdb(path, m, a.rate)),
        )
    )
    runs.append(
        (
            "messagebox",
            "1 thread",
            in_fresh_file(lambda path: latency_messagebox(f"duckdb:///{path}", m, a.rate)),
        )
    )
    return runs


def run_latencies(env: Env, backends: Sequence[str], systems: Sequence[str]) -> list[Latency]:
    m = max(1, round(env.args.rate * env.args.latency_seconds))
    out: list[Latency] = []
    for backend in backends:
        for system, consumer, run in latency_runs(env, backend, m):
            if system not in systems:
                continue
            if env.pg is not None and backend == "postgresql":
                env.pg.reset()
            sample = run()
            if len(sample.seconds) < m:
                env.warnings.append(
                    f"latency {backend} {system} ({consumer}): {m - len(sample.seconds)} of {m} "
                    f"messages not delivered within {DRAIN_TIMEOUT_S:g} s of the last publish"
                )
            out.append(Latency(backend, system, consumer, m, sample))
            if sample.seconds:
                log(
                    f"latency {backend} {system} ({consumer}): "
                    f"p50 {1000 * pct(sample.seconds, 0.5):.1f} ms, "
                    f"p99 {1000 * pct(sample.seconds, 0.99):.1f} ms"
                )
    return out


# --- output ---


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A plain-text table; the first ``left`` columns are left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _rate(r: Measured | None) -> str:
    if r is None:
        return "-"
    return f"{r.msgs_per_s:,.0f}" + ("*" if r.capped else "")


def _ratio(a: Measured | None, b: Measured | None) -> str:
    if a is None or b is None or b.msgs_per_s == 0:
        return "-"
    return f"{a.msgs_per_s / b.msgs_per_s:.2f}x"


def throughput_table(backend: str, results: dict[Case, Measured]) -> str:
    """One row per consumer shape; a column per system that ran, then the ratios."""
    mine = {c: r for c, r in results.items() if c.backend == backend}
    shapes = sorted(
        {(c.mode, c.workers, c.batch) for c in mine},
        key=lambda s: (s[0] != "threads", s[1], s[2]),
    )
    ran = [s for s in SYSTEMS if any(c.system == s for c in mine)]
    short = {"raw": "raw", "pgqueuer": "PgQ", "messagebox": "mb"}
    ratios = (("pgqueuer", "raw"), ("messagebox", "raw"), ("messagebox", "pgqueuer"))
    pairs = [(a, b) for a, b in ratios if a in ran and b in ran]
    headers = ["mode", "workers", "batch", *(system_name(backend, s) for s in ran)]
    headers += [f"{short[a]}/{short[b]}" for a, b in pairs]
    rows = []
    for mode, k, batch in shapes:
        got = {s: mine.get(Case(backend, s, mode, k, batch)) for s in ran}
        row = [mode, str(k), str(batch), *(_rate(got[s]) for s in ran)]
        row += [_ratio(got[a], got[b]) for a, b in pairs]
        rows.append(row)
    return _table(headers, rows, left=1)


def system_name(backend: str, system: str) -> str:
    """The column/row label of a system on a backend."""
    if system == "raw":
        return "raw SKIP LOCKED" if backend == "postgresql" else "raw DELETE loop"
    return "PgQueuer" if system == "pgqueuer" else system


def latency_table(results: Sequence[Latency]) -> str:
    """One row per latency run, in milliseconds."""
    rows = []
    for r in results:
        ms = [1000 * s for s in r.sample.seconds]
        call_ms = [1000 * s for s in r.sample.calls]
        produce_s = r.sample.produce_s
        rows.append(
            [
                r.backend,
                system_name(r.backend, r.system),
                r.consumer,
                f"{len(ms)}/{r.sent}",
                f"{r.sent / produce_s:,.0f}" if produce_s > 0 else "-",
                f"{pct(call_ms, 0.5):.1f}" if call_ms else "-",
                f"{pct(ms, 0.5):.1f}" if ms else "-",
                f"{pct(ms, 0.99):.1f}" if ms else "-",
                f"{max(ms):.1f}" if ms else "-",
                f"{statistics.fmean(ms):.1f}" if ms else "-",
            ]
        )
    headers = ["backend", "system", "consumer", "delivered", "sent/s", "publish ms p50"]
    headers += ["p50 ms", "p99 ms", "max ms", "mean ms"]
    return _table(headers, rows, left=3)


def header(env: Env) -> list[str]:
    """What ran where: sizes, versions, the PostgreSQL durability settings."""
    a = env.args
    versions = [f"messagebox {metadata.version('messagebox')}", f"DuckDB {duckdb.__version__}"]
    if "pgqueuer" in a.systems and pgqueuer_version():
        driver = a.pgq_driver
        versions.append(
            f"PgQueuer {pgqueuer_version()} ({driver} {metadata.version(driver)} driver)"
        )
    lines = [
        "",
        f"Delivery benchmark: {a.messages:,} messages per throughput run (published in batches "
        f"of {PUBLISH_BATCH:,} before the clock starts), each run stopped after {a.cap:g} s; "
        "do-nothing handlers",
        f"{'; '.join(versions)}; {os.cpu_count()} CPUs",
    ]
    if env.pg is not None:
        pg = env.pg
        lines.append(
            f"PostgreSQL {pg.setting('server_version').split()[0]} (fsync {pg.setting('fsync')}, "
            f"synchronous_commit {pg.setting('synchronous_commit')}), schema {pg.schema}"
        )
    return lines


def report(
    env: Env,
    backends: Sequence[str],
    results: dict[Case, Measured],
    latencies: Sequence[Latency],
) -> str:
    """The whole printed report."""
    a = env.args
    out = header(env)
    titles = {
        "postgresql": "PostgreSQL throughput, msgs/s (PgQueuer threads = queue managers on one "
        "asyncio loop; processes = 1 thread / 1 queue manager each)",
        "duckdb": "DuckDB throughput, msgs/s (raw = the same DELETE ... RETURNING loop under "
        "an in-process lock)",
    }
    for backend in backends:
        if any(c.backend == backend for c in results):
            out += ["", titles[backend], throughput_table(backend, results)]
    if results:
        out.append(f"* stopped at the {a.cap:g} s cap before the backlog was drained")
    if latencies:
        out += [
            "",
            f"Latency publish -> handler start, one message per publish at {a.rate:g}/s for "
            f"{a.latency_seconds:g} s, idle consumer, claim batch {LATENCY_BATCH} (publish ms: "
            "the publish/enqueue/insert call alone, which the latency includes)",
            latency_table(latencies),
        ]
    return "\n".join(out)


# --- main ---


def _ints(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("give positive integers, comma-separated")
    return values


def _names(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        return names

    return parse


def _default_driver() -> str:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "psycopg"
    return "asyncpg"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.deliver",
        description="Host-instance delivery throughput and latency versus PgQueuer and a raw "
        "SKIP LOCKED loop.",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 messages, 1 s caps")
    parser.add_argument("--messages", type=int, help="backlog per throughput run (default 20,000)")
    parser.add_argument("--cap", type=float, help="seconds per throughput run at most (default 10)")
    parser.add_argument(
        "--backends",
        type=_names(BACKENDS),
        default=list(BACKENDS),
        help="comma-separated backends (default duckdb,postgresql)",
    )
    parser.add_argument(
        "--systems",
        type=_names(SYSTEMS),
        default=list(SYSTEMS),
        help="comma-separated systems (default raw,pgqueuer,messagebox)",
    )
    parser.add_argument("--threads", type=_ints, default=[1, 2, 4], help="thread counts (1,2,4)")
    parser.add_argument(
        "--processes",
        type=lambda t: [] if t.strip() in ("", "0", "none") else _ints(t),
        default=[2, 4],
        help="process counts on PostgreSQL (2,4; 'none' to skip)",
    )
    parser.add_argument(
        "--batches", type=_ints, default=[1, 10, 100], help="claim batches (1,10,100)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="latency: messages/s (200)")
    parser.add_argument(
        "--latency-seconds", type=float, help="latency: seconds of publishing (default 5; 0 skips)"
    )
    parser.add_argument(
        "--pgq-driver",
        choices=("asyncpg", "psycopg"),
        default=_default_driver(),
        help="PgQueuer's driver (default asyncpg when installed)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("MESSAGEBOX_BENCH_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL server URL (a throw-away schema is created in it and dropped)",
    )
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 2_000 if args.quick else 20_000
    if args.cap is None:
        args.cap = 1.0 if args.quick else 10.0
    if args.latency_seconds is None:
        args.latency_seconds = 1.0 if args.quick else 5.0
    if args.messages < 1 or args.cap <= 0 or args.rate <= 0 or args.latency_seconds < 0:
        parser.error("--messages, --cap and --rate must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    backends = list(args.backends)
    systems = list(args.systems)
    notes: list[str] = []
    if "pgqueuer" in systems and pgqueuer_version() is None:
        systems.remove("pgqueuer")
        notes.append("PgQueuer skipped: not installed (pip install 'pgqueuer[asyncpg]')")
    args.systems = systems
    if "postgresql" in backends:
        why = pg_check(args.pg_url)
        if why is not None:
            backends.remove("postgresql")
            notes.append(f"PostgreSQL skipped: cannot connect to {args.pg_url}: {why}")
    for note in notes:
        log(note)

    env = Env(args)
    results: dict[Case, Measured] = {}
    latencies: list[Latency] = []
    started = time.perf_counter()
    try:
        if "postgresql" in backends:
            env.pg = PgStore(args.pg_url)
            if args.processes:
                env.pool = WorkerPool(max(args.processes))
        if "duckdb" in backends:
            env.duck = DuckStore()
        todo = cases(env, backends, systems)
        for i, case in enumerate(todo, 1):
            result = run_case(env, case)
            results[case] = result
            log(
                f"[{i}/{len(todo)}] {case}: {result.completed:,} in {result.seconds:.2f} s = "
                f"{result.msgs_per_s:,.0f} msgs/s" + (" (capped)" if result.capped else "")
            )
        if args.latency_seconds > 0:
            latencies = run_latencies(env, backends, systems)
        print(report(env, backends, results, latencies))
    finally:
        if env.pool is not None:
            env.pool.close()
        if env.pg is not None:
            env.pg.close()
        if env.duck is not None:
            env.duck.close()
    for note in notes + env.warnings:
        print(f"\nNote: {note}")
    log(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
