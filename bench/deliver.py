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
    - ``messagebox``: a :class:`~messagebox.hosts.instance.HostInstance` with ``dequeue_threads=k``
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

This module reads the options and runs the cases; the parts live beside it:
``deliver_common`` (settings, the consumer protocol), ``deliver_raw``, ``deliver_pgqueuer``
and ``deliver_mb`` (each system's consumers), ``deliver_crews`` (consumer threads and
worker processes), ``deliver_stores`` (the schema and the DuckDB files),
``deliver_throughput``, ``deliver_latency`` and ``deliver_report`` (the printed tables).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

from bench.deliver_common import BACKENDS, DEFAULT_PG_URL, SYSTEMS, log
from bench.deliver_crews import WorkerPool
from bench.deliver_latency import Latency, run_latencies
from bench.deliver_pgqueuer import pgqueuer_version
from bench.deliver_report import report
from bench.deliver_stores import DuckStore, Env, PgStore, pg_check
from bench.deliver_throughput import Case, Measured, cases, run_case


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
