"""What message tracking costs publishing: ``publish`` throughput with tracking off (the
baseline, in the same run) and on, per backend and batch size.

What it measures
    For each backend (DuckDB, PostgreSQL) it creates a fresh store (a temporary DuckDB
    file, or a fresh PostgreSQL schema dropped afterwards) with one host and 50
    subscriptions ``t.K == k`` for k in 0..9 (5 per value), so each message routes to 5
    subscriptions: 6 tracked events per message (published + 5 routed). Then, for each
    batch size, it times ``publish`` over M messages with tracking off and on, in
    alternating rounds (``--rounds``, default 3; the median is shown), messages built
    before the clock starts. The ratio on/off is what tracking costs; the counters of
    :mod:`messagebox.metrics` run in both (they cannot be turned off).

Run it from the project root::

    python -m bench.tracking            # batches of 1 and 1,000; 3 rounds
    python -m bench.tracking --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.predicates import P

PG_URL = os.environ.get(
    "MESSAGEBOX_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@contextmanager
def store(backend: str) -> Iterator[str]:
    if backend == "duckdb":
        with tempfile.TemporaryDirectory() as d:
            yield f"duckdb:///{d}/bench.duckdb"
        return
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        yield (
            sa.make_url(PG_URL)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        engine.dispose()


def pg_reachable() -> bool:
    try:
        engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception:  # any failure means "not reachable"
        return False
    return True


def rate(box: MessageBox, batch: int, n: int) -> float:
    """Messages per second publishing ``n`` messages in batches of ``batch``."""
    batches = [
        [Message(b"<m/>", promoted={"t.K": (s + j) % 10}) for j in range(batch)]
        for s in range(0, n, batch)
    ]
    started = time.perf_counter()
    for b in batches:
        box.publish(b)
    return n / (time.perf_counter() - started)


def run(backend: str, batches: Sequence[tuple[int, int]], rounds: int) -> list[list[str]]:
    rows = []
    with store(backend) as url, MessageBox(url) as box:
        box.create_host("h", throttle_queue_depth=10**9)  # nothing drains the queue here
        box.subscribe_many(
            {"service": f"s{i}", "host": "h", "filter": P("t.K") == i % 10} for i in range(50)
        )
        rate(box, 10, 100)  # warm up
        for batch, n in batches:
            found: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(rounds):
                for on in (False, True):
                    box.configure_tracking(on)
                    found[on].append(rate(box, batch, n))
            off, with_it = statistics.median(found[False]), statistics.median(found[True])
            events = box.tracked(limit=1, event="published")
            assert events, "tracking recorded nothing"
            rows.append(
                [
                    backend,
                    f"{batch:,}",
                    f"{n:,}",
                    f"{off:,.0f}",
                    f"{with_it:,.0f}",
                    f"{with_it / off:.2f}",
                ]
            )
            print("  ".join(rows[-1]), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracking", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    args = parser.parse_args(argv)
    batches = [(1, 100), (1000, 5000)] if args.quick else [(1, 500), (1000, 30000)]
    rounds = 1 if args.quick else args.rounds
    backends = ["duckdb"] + (["postgresql"] if pg_reachable() else [])
    if "postgresql" not in backends:
        print(f"(PostgreSQL unreachable at {PG_URL}: skipped)")
    print("backend  batch  messages  off msgs/s  on msgs/s  on/off")
    table = [row for backend in backends for row in run(backend, batches, rounds)]
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    print()
    head = ["backend", "batch", "messages", "off msgs/s", "on msgs/s", "on/off"]
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    for row in [head, *table]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
