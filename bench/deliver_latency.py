"""Latency runs of ``bench.deliver``: one message per publish at a steady rate into an
idle consumer, publish-to-handler time per message, for each system.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from bench.deliver_common import (
    DRAIN_TIMEOUT_S,
    HOST,
    LATENCY_BATCH,
    RAW_IDLE_S,
    RAW_TABLE,
    SERVICE,
    SETTLE_S,
    WATCH_S,
    Body,
    log,
)
from bench.deliver_crews import Threads, WorkerPool, WorkerTask
from bench.deliver_mb import mb_open, mb_settings
from bench.deliver_pgqueuer import pgq_connect, pgq_install, pgq_manager, pgq_queries
from bench.deliver_raw import raw_duckdb_body, raw_fill_duckdb, raw_fill_pg, raw_pg_body
from bench.deliver_stores import Env, PgStore
from messagebox.engine import MessageBox
from messagebox.hosts.instance import HostInstance
from messagebox.hosts.service import Delivery
from messagebox.message import Message


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
    box = mb_open(url, m)
    sent: dict[str, float] = {}
    received: dict[str, float] = {}

    def handler(delivery: Delivery) -> None:
        received[str(delivery.message_id)] = time.time()

    try:
        inst = HostInstance(box, HOST, {SERVICE: handler}, settings=mb_settings(1, LATENCY_BATCH))
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
    box = mb_open(pg.mb_url, m)
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
    pgq_install(pg.admin, pg.schema)
    seconds: list[float] = []
    calls: list[float] = []

    async def handler(job: Any) -> None:
        seconds.append(time.time() - float(job.payload.decode()))

    async def main() -> float:
        qm, consumer_conn = await pgq_manager(driver, pg.dsn, pg.schema, None, handler)
        producer_conn, producer_driver = await pgq_connect(driver, pg.dsn)
        producer = pgq_queries(producer_driver, pg.schema, None)
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
    raw_fill_pg(pg, 0)
    body = raw_pg_body(pg.dsn, pg.schema, LATENCY_BATCH, idle_s=RAW_IDLE_S, record=True)
    sql = f"INSERT INTO {pg.schema}.{RAW_TABLE} VALUES (%s, %s, 'x')"

    def insert(i: int, t: float) -> None:
        pg.admin.execute(sql, (i, t), prepare=True)

    return _latency_raw_run(body, insert, m, rate)


def latency_raw_duckdb(path: str, m: int, rate: float) -> Sample:
    """The DuckDB raw loop (under the lock, as are the inserts from here)."""
    db = duckdb.connect(path)
    cur = db.cursor()
    try:
        raw_fill_duckdb(db, 0)
        lock = threading.Lock()
        body = raw_duckdb_body(db, lock, LATENCY_BATCH, idle_s=RAW_IDLE_S, record=True)

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
