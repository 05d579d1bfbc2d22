"""Throughput cases of ``bench.deliver``: a fresh store with a backlog, consumers
released together, timed until the backlog is drained or the cap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import duckdb

from bench.backlog import analyze
from bench.deliver_common import HOST, RAW_TABLE, WATCH_S
from bench.deliver_crews import Crew, Threads, WorkerTask
from bench.deliver_mb import mb_body, mb_open, mb_publish
from bench.deliver_pgqueuer import pgq_body, pgq_enqueue, pgq_install
from bench.deliver_raw import raw_duckdb_body, raw_fill_duckdb, raw_fill_pg, raw_pg_body
from bench.deliver_stores import Env
from messagebox.storage import schema as mb_schema


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
            raw_fill_pg(pg, n)
            body = raw_pg_body(pg.dsn, pg.schema, case.batch)
            yield crew(Threads([body] * case.workers)), lambda: pg.count(RAW_TABLE)
        elif case.system == "pgqueuer":
            pgq_install(pg.admin, pg.schema)
            pgq_enqueue(pg.admin, pg.schema, n)
            pg.admin.execute(f"ANALYZE {pg.schema}.pgqueuer")
            body = pgq_body(a.pgq_driver, pg.dsn, pg.schema, case.batch, case.workers)
            yield crew(Threads([body])), lambda: pg.count("pgqueuer")
        else:
            box = mb_open(pg.mb_url, n)
            try:
                mb_publish(box, n)
                analyze(box)  # as autovacuum would have (bench.backlog), and as raw's is
                body = mb_body(box, case.workers, case.batch)
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
                raw_fill_duckdb(db, n)
                body = raw_duckdb_body(db, threading.Lock(), case.batch)

                def left() -> int:
                    row = db.execute(f"SELECT count(*) FROM {RAW_TABLE}").fetchone()
                    return int(row[0]) if row else 0

                yield Threads([body] * case.workers), left
            finally:
                db.close()
        else:
            box = mb_open(f"duckdb:///{path}", n)
            try:
                mb_publish(box, n)
                yield (
                    Threads([mb_body(box, case.workers, case.batch)]),
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
