"""Memory over a long run on PostgreSQL: a host instance's resident set while it delivers
N messages, and a publisher's while it publishes them, sampled as they go.

What it measures
    A fresh schema with one host and one catch-all subscription. A publisher process
    publishes N messages in batches of 1,000 (throttled by the host's queue depth, so
    the backlog stays bounded); this process runs one host instance (2 dequeue threads,
    claim batch 100, a do-nothing handler, cleanup every 10 s) until it has completed
    all N. Each samples its own resident set size (``/proc/self/statm``) every
    ``N / 10`` messages. Flat means the last sample is within 10% of the first sample
    taken after warm-up (the first tenth): the baseline is the process's own size once
    its caches are warm, in the same run. ``end/first`` is printed beside it: against
    the very first sample, it also counts a one-time step such as the first cleanup's
    working set (a host instance runs cleanup every 10 s).

    A server with autovacuum off (as a test server may be) never removes the dead rows
    of the queue, and claims slow to a crawl scanning past them: the bench then runs
    ``VACUUM`` on the churning tables every 5 s in its place, and says so.

Run it from the project root::

    python -m bench.memory               # 1,000,000 messages (about 3-5 minutes)
    python -m bench.memory --quick       # 100,000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema

PG_URL = os.environ.get(
    "MESSAGEBOX_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BATCH = 1_000
BACKLOG = 50_000
"""The host's throttle_queue_depth: the publisher waits while this many are queued."""


def rss_mb() -> float:
    """This process's resident set size, MB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def publisher(url: str, n: int, every: int, out: mp.Queue) -> None:
    """Publish n messages in batches, reporting (published, RSS MB) every ``every``."""
    samples: list[tuple[int, float]] = []
    with MessageBox(url, publisher="bench.memory") as box:
        for start in range(0, n, BATCH):
            box.publish(
                [Message(b"x" * 200, promoted={"b.N": i}) for i in range(start, start + BATCH)],
                block=True,
                timeout=600.0,
            )
            done = start + BATCH
            if done % every == 0:
                samples.append((done, rss_mb()))
    out.put(samples)


def host(url: str, n: int, every: int, progress: Callable[[str], None]) -> list[tuple[int, float]]:
    """Run a host instance until n messages are completed; (completed, RSS MB) samples."""
    box = MessageBox(url)
    handled = 0

    def service(_d: Delivery) -> None:
        nonlocal handled
        handled += 1  # the GIL makes this exact enough for progress; stats count exactly

    settings = {
        "dequeue_threads": 2,
        "claim_batch": 100,
        "max_in_flight": 1_000,
        "cleanup_interval_seconds": 10.0,
        "poll_min_seconds": 0.005,
        "poll_max_seconds": 0.1,
    }
    samples: list[tuple[int, float]] = []
    inst = HostInstance(box, "h", {"s": service}, settings=settings, close_box=True).start()
    try:
        mark = every
        while True:
            completed = inst.stats.snapshot()["completed"]
            while completed >= mark and mark <= n:
                samples.append((mark, rss_mb()))
                progress(f"  host: {mark:,} completed, RSS {samples[-1][1]:.0f} MB")
                mark += every
            if completed >= n:
                return samples
            time.sleep(0.05)
    finally:
        inst.stop()


def vacuum_stand_in(schema: str, stop: threading.Event) -> None:
    """Vacuum the churning tables every 5 s (for a server with autovacuum off)."""
    engine = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            while not stop.wait(5.0):
                for table in (*mb_schema.CHURN_TABLES, "mb_spool"):
                    conn.exec_driver_sql(f"VACUUM {schema}.{table}")
    finally:
        engine.dispose()


def flat(samples: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(baseline after warm-up, last, last / baseline)."""
    base = samples[0][1] if len(samples) == 1 else samples[1][1]
    last = samples[-1][1]
    return base, last, last / base


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="100,000 messages")
    args = ap.parse_args(argv)
    n = 100_000 if args.quick else args.messages
    n -= n % BATCH
    every = max(BATCH, (n // 10) // BATCH * BATCH)
    engine = sa.create_engine(PG_URL)
    schema = f"bench_memory_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = f"{PG_URL}?options=-csearch_path%3D{schema}"
    try:
        with MessageBox(url) as box:
            box.create_host("h", throttle_queue_depth=BACKLOG)
            box.subscribe("s", host="h", filter=P("b.N") >= 0, name="s")
        with engine.connect() as conn:
            autovacuum = conn.exec_driver_sql("SHOW autovacuum").scalar() == "on"
        stop = threading.Event()
        if not autovacuum:
            print("autovacuum is off on this server: VACUUM every 5 s stands in for it")
            threading.Thread(target=vacuum_stand_in, args=(schema, stop), daemon=True).start()
        out: mp.Queue = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=publisher, args=(url, n, every, out))
        started = time.perf_counter()
        proc.start()
        host_samples = host(url, n, every, print)
        pub_samples = out.get(timeout=600)
        proc.join(60)
        seconds = time.perf_counter() - started
        stop.set()
    finally:
        for attempt in range(5):  # a cleanup of the stopped host may still hold a lock
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                break
            except sa.exc.OperationalError:
                time.sleep(1.0 + attempt)
        engine.dispose()
    print(f"\n{n:,} messages published and delivered on PostgreSQL in {seconds:.0f} s")
    print(
        f"{'process':<10}{'after warm-up MB':>18}{'at the end MB':>15}{'end/warm':>10}"
        f"{'end/first':>11}  samples"
    )
    for name, samples in (("host", host_samples), ("publisher", pub_samples)):
        base, last, ratio = flat(samples)
        trail = " ".join(f"{mb:.0f}" for _, mb in samples)
        first = last / samples[0][1]
        print(f"{name:<10}{base:>18.0f}{last:>15.0f}{ratio:>10.2f}{first:>11.2f}  {trail}")
    print(
        "end/warm is the target (flat within 10%); end/first also counts what the first "
        "tenth grew, such as the first cleanup's working set when it ran after the first sample"
    )


if __name__ == "__main__":
    main()
