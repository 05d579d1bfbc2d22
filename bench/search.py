"""What a search costs over a big store: ``box.search()`` over N stored messages (a
million by default), against a naive full scan of the spool in the same run.

What it measures
    For each backend (DuckDB, PostgreSQL) it creates a fresh store (a temporary DuckDB
    file, or a fresh PostgreSQL schema dropped afterwards) and writes N messages straight
    into the spool, 50,000 rows a statement (Arrow on DuckDB, ``COPY`` on PostgreSQL),
    their contexts as a publish writes them: an order id of its own, a region (EU 40%,
    US 30%, UK 20%, APAC 9%, LATAM 1%), a total from 0 to 10,000 (an int or a float), a
    kind, and a written note. Their publish times are spread evenly over the last 7
    days, newest last, as a publishing store fills. One message in ten has a queue
    entry, one in a hundred a suspended entry; a tenth as many again are deleted ones
    that tracking kept (``mb_tracked_message``). PostgreSQL then gets ``VACUUM
    ANALYZE`` (autovacuum's work on a store that has been running).

    Then, for each search below, ``--rounds`` times (median shown):

    - the **baseline**: a naive full scan, as a search without window, index or cap
      would be: every spool row read, each context decoded and tested by the same
      Python evaluator, the newest 50 matches kept;
    - **search 24h**: ``box.search(filter)``: the default window (the last day: about
      a seventh of the store), 50 found at most, 100,000 messages gone through at most;
    - **search 7d**: ``box.search(filter, since=timedelta(days=8), scan=1_000_000)``:
      the whole store, its scan cap raised to a million;

    and prints a table: seconds, ratio to the baseline, found, messages gone through,
    whether the cap stopped it (``capped``), and whether a test went to SQL (``pushed``).

Run it from the project root::

    python -m bench.search                        # 1,000,000 messages, both backends
    python -m bench.search --messages 100000 --quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from bench.orchestrate import positive
from bench.tracking import PG_URL, pg_reachable, store
from messagebox import MessageBox
from messagebox.predicates import Filter, filter_matches, parse_filter
from messagebox.properties import decode_values, encode_context
from messagebox.storage import schema

CHUNK = 50_000
REGIONS = ["EU"] * 40 + ["US"] * 30 + ["UK"] * 20 + ["APAC"] * 9 + ["LATAM"]
SEARCHES: list[tuple[str, str]] = [
    ("equality, common", 'orders.Region == "EU"'),
    ("equality, one message", 'orders.OrderId == "A0424242"'),
    ("range, common", "orders.Total > 5000"),
    ("range, rare", "orders.Total > 9990"),
    ("range and equality", 'orders.Total > 9000 and orders.Region == "LATAM"'),
    ("no match, equality", 'orders.Region == "MARS"'),
    ("no match, range", "orders.Total > 20000"),
]


def contexts(start: int, n: int, rng: random.Random) -> list[str]:
    """The contexts of messages ``start`` to ``start + n``, as a publish writes them."""
    out = []
    for i in range(start, start + n):
        total: int | float = rng.randrange(10_001) if i % 2 else round(rng.uniform(0, 10_000), 2)
        promoted = {
            "orders.OrderId": f"A{i:07d}",
            "orders.Region": REGIONS[rng.randrange(len(REGIONS))],
            "orders.Total": total,
            "orders.Kind": "order",
        }
        out.append(encode_context(promoted, {"orders.Note": f"note {i}"}))
    return out


def fill(box: MessageBox, n: int) -> None:
    """``n`` stored messages (and a tenth as many kept by tracking), published over the
    last 7 days, with queue and suspended entries for some."""
    rng = random.Random(58)
    now = datetime.now(UTC)
    step = timedelta(days=7) / n
    sub = box.subscription("ship").id
    for start in range(0, n, CHUNK):
        size = min(CHUNK, n - start)
        ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(size)]
        at = [now - step * (n - start - k) for k in range(size)]
        rows: dict[str, list[Any]] = {
            "id": ids,
            "context": contexts(start, size, rng),
            "n_parts": [1] * size,
            "body_part": ["body"] * size,
            "published_at": at,
            "publisher": ["bench"] * size,
        }
        with box.store.transaction() as conn:
            box.store.dialect.insert(conn, schema.spool, rows)
            queued = range(0, size, 10)
            box.store.dialect.insert(conn, schema.queue, _queue(queued, ids, at, sub, start))
            gone = range(5, size, 100)
            box.store.dialect.insert(
                conn,
                schema.tracked_message,
                {
                    "id": [uuid.UUID(int=rng.getrandbits(128)) for _ in gone],
                    "context": contexts(n + start, len(gone), rng),
                    "published_at": [at[k] for k in gone],
                    "publisher": ["bench"] * len(gone),
                    "deleted_at": [now] * len(gone),
                },
            )
            box.store.dialect.insert(conn, schema.suspended, _suspended(ids, at, sub, start))


def _queue(
    picked: range, ids: list[uuid.UUID], at: list[datetime], sub: int, start: int
) -> dict[str, list[Any]]:
    n = len(picked)
    return {
        "id": [start + k + 1 for k in picked],
        "msg": [ids[k] for k in picked],
        "sub": [sub] * n,
        "host": ["shop"] * n,
        "priority": [0] * n,
        "state": ["ready"] * n,
        "attempts": [0] * n,
        "available_at": [at[k] for k in picked],
        "lease_owner": [None] * n,
        "lease_expires": [None] * n,
        "enqueued_at": [at[k] for k in picked],
        "instance_id": [None] * n,
        "ordered": [False] * n,
    }


def _suspended(
    ids: list[uuid.UUID], at: list[datetime], sub: int, start: int
) -> dict[str, list[Any]]:
    picked = range(3, len(ids), 100)
    n = len(picked)
    return {
        "id": [start + k + 1 for k in picked],
        "msg": [ids[k] for k in picked],
        "sub": [sub] * n,
        "host": ["shop"] * n,
        "resumable": [True] * n,
        "reason": ["delivery-failure"] * n,
        "error": ["RuntimeError: needs an approval"] * n,
        "report": [None] * n,
        "attempts": [1] * n,
        "suspended_at": [at[k] for k in picked],
        "priority": [0] * n,
        "ordered": [False] * n,
        "instance_id": [None] * n,
        "enqueued_at": [at[k] for k in picked],
    }


def naive(box: MessageBox, filt: Filter, limit: int = 50) -> int:
    """The baseline: every spool row read and tested in Python; the newest ``limit``
    matches kept. How many it found."""
    s = schema.spool
    with box.store.transaction() as conn:
        rows = conn.execute(sa.select(s.c.id, s.c.published_at, s.c.context))
        found = [
            (r.published_at, r.id)
            for r in rows
            if filter_matches(filt, decode_values(orjson.loads(r.context)["promoted"]))
        ]
    found.sort(reverse=True)
    return len(found[:limit])


def seconds(work: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    """The median time of ``rounds`` runs of ``work``, and its last answer."""
    times, answer = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        answer = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def run(backend: str, n: int, rounds: int) -> list[list[str]]:
    rows: list[list[str]] = []
    with store(backend) as url, MessageBox(url) as box:
        box.create_host("shop")
        box.subscribe("ship", host="shop", filter=parse_filter("orders.Kind exists"))
        started = time.perf_counter()
        fill(box, n)
        if backend == "postgresql":
            with box.store.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    "VACUUM ANALYZE"
                )
        print(f"{backend}: {n:,} messages stored in {time.perf_counter() - started:.0f} s")
        for name, text in SEARCHES:
            filt = parse_filter(text)
            base, _ = seconds(lambda f=filt: naive(box, f), rounds)  # type: ignore[misc]
            day, r1 = seconds(lambda t=text: box.search(t), rounds)  # type: ignore[misc]
            week, r7 = seconds(
                lambda t=text: box.search(t, since=timedelta(days=8), scan=1_000_000),  # type: ignore[misc]
                rounds,
            )
            for label, took, r in (("search 24h", day, r1), ("search 7d", week, r7)):
                row = [
                    backend,
                    name,
                    label,
                    f"{base:.2f}",
                    f"{took:.3f}",
                    f"{base / took:.0f}x",
                    str(len(r.found)),
                    f"{r.scanned:,}",
                    "yes" if r.capped else "no",
                    "yes" if r.pushed_down else "no",
                ]
                rows.append(row)
                print("  ".join(row), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__)
    parser.add_argument("--messages", type=positive, default=1_000_000, help="default 1M")
    parser.add_argument("--rounds", type=positive, default=3, help="timed runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--backend", choices=("duckdb", "postgresql"), help="only this one")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    backends = [args.backend] if args.backend else ["duckdb", "postgresql"]
    if "postgresql" in backends and not pg_reachable():
        print(f"(PostgreSQL unreachable at {PG_URL}: skipped)")
        backends.remove("postgresql")
    head = [
        "backend",
        "search",
        "how",
        "baseline s",
        "s",
        "vs baseline",
        "found",
        "gone through",
        "capped",
        "pushed",
    ]
    table = [row for backend in backends for row in run(backend, args.messages, rounds)]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    print()
    for row in [head, *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
