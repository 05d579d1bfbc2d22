"""Routing throughput: ``MessageBox.publish`` against N subscriptions, beside a naive loop.

What it measures
    For each backend (DuckDB, PostgreSQL) and each subscription count N (default 100,
    10,000 and 100,000) it creates a fresh database (a temporary DuckDB file, or a fresh
    PostgreSQL schema that is dropped afterwards), subscribes N generated subscriptions
    with one ``subscribe_many`` call (timed and printed separately), publishes one
    warm-up batch, then times ``publish`` alone over M messages in batches of 1,000 (one
    transaction per batch). Messages are built before the clock starts.

    The baseline is the naive approach in the same run: for each message, normalise its
    properties once, then loop over every subscription's :class:`~messagebox.predicates.Filter`
    with the reference evaluator (``filter_matches``, what ``filt.matches`` runs). For
    large N only a sample of messages is evaluated (about three seconds' worth) and
    msgs/s is extrapolated. The sampled messages' naive matches are also compared with
    what each backend routed them to.

Workload (deterministic, ``random.Random(seed)``)
    Each message has about 10 promoted ``orders.*`` properties (Region, Customer, Total,
    Qty, Priority, Rush (present half the time), Placed, Channel, Flags, Sku). Most
    subscriptions anchor on ``orders.Customer == c`` combined with a range on a round
    threshold, an ``exists``, a second equality, or nothing, some as two OR-ed groups; a
    dozen broad ones are pure ranges, prefixes, bit masks and mixes. The customer space
    is sized from the subscriptions' exact pass probabilities so that a message matches
    about 10 subscriptions on average whatever N is; the measured average is printed.

Other workloads (``--workloads``; see ``route_workload``): ``mixed`` (in-lists as
    anchors, prefixes, masks, datetime and int upper bounds, not_exists, !=, OR-ed
    groups; fan-out 13), ``fanout1`` and ``fanout30``; they run at N=10,000.

The limits beside every figure, measured in the same run (``route_limit``)
    the write limit: the same rows written with no routing, batches of 1,000, through
    the store's bulk path into a fresh database, each batch right after publish wrote
    it (the disk's moments shared); publish+route is printed as a fraction of it. The
    minimal write limit: the spool rows, parts and queue entries alone, the same way,
    into tables with only their primary keys (what the schema's own indexes cost). And
    a single-message publish beside a raw insert of the same rows. Before the clock
    starts, the set-up's debts are paid (a database checkpoint, a full garbage
    collection), and the results publish returns are kept as plain tuples, so that the
    bench's own heap costs the publish nothing.

Scaling, measured in one process
    The N=100,000 run publishes to a second store, of N=100, a batch of it after each
    of its own, so a slow minute on the machine falls on both sizes alike; the ratio of
    the two is the scaling figure. The ratio of the two sizes' separate runs is printed
    beside it.

Targets (shown beside the figures)
    at N=10,000: publish+route >= 0.6 of the minimal write limit on DuckDB and >= 0.5
    on PostgreSQL, on every workload (issue 60; the schema's write limit is printed
    too); >= 100x the naive loop; a single-message publish
    <= 3x the raw insert; per backend, throughput(N=100,000) / throughput(N=100) >= 0.8
    (the alternating pair).

Run it from the project root::

    python -m bench.route                       # 20,000 messages, N = 100, 10k, 100k
    python -m bench.route --quick               # smoke run: 3,000 messages, N = 100, 10k
    python -m bench.route --workloads mixed --sizes 10000
    python -m bench.route --backends duckdb --sizes 100,10000 --messages 5000
    python -m bench.route --profile             # cProfile of DuckDB publish at N=10,000

PostgreSQL is reached at ``--pg-url`` (default ``$MESSAGEBOX_BENCH_PG_URL`` or
``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and skipped, with a note, when it
cannot be reached.

This module reads the options and runs the sizes; the parts live beside it:
``route_workload`` (messages and subscriptions), ``route_runs`` (the naive loop and the
backends), ``route_report`` (the printed tables) and ``route_profile`` (``--profile``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
from collections.abc import Sequence

from bench.route_profile import run_profile
from bench.route_report import report
from bench.route_runs import NaiveResult, RunResult, log, pg_check, run_backend, run_naive
from bench.route_workload import SEED, WORKLOADS, Workload, make_workload, quiet_lint

NAIVE_BUDGET_S = 3.0
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--sizes: {exc}") from exc
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--sizes takes positive subscription counts")
    return sizes


def _backends(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [b for b in names if b not in ("duckdb", "postgresql")]
    if bad or not names:
        raise argparse.ArgumentTypeError("--backends takes duckdb and/or postgresql")
    return names


def _workloads(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--workloads takes {', '.join(WORKLOADS)}")
    return names


def _plan(workloads: Sequence[str], sizes: Sequence[int]) -> list[tuple[str, int]]:
    """(workload, N) runs: ``orders`` at every size, the others at N=10,000 (or at the
    sizes given when 10,000 is not among them)."""
    other = [10_000] if 10_000 in sizes else list(sizes)
    return [(w, n) for w in workloads for n in (sizes if w == "orders" else other)]


def _emptied(work: Workload) -> Workload:
    """The workload with only what the report prints."""
    return dataclasses.replace(work, specs=[], filters=[], warmup=[], messages=[], properties=[])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.route",
        description="Routing throughput of MessageBox.publish versus a naive filter loop.",
    )
    parser.add_argument("--messages", type=int, help="messages per run (default 20,000)")
    parser.add_argument(
        "--sizes", type=_sizes, help="subscription counts N (default 100,10000,100000)"
    )
    parser.add_argument(
        "--backends",
        type=_backends,
        default=["duckdb", "postgresql"],
        help="comma-separated backends (default duckdb,postgresql)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 3,000 messages, N = 100,10000"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only profile DuckDB publish at N=10,000 with cProfile (top 25 cumulative)",
    )
    parser.add_argument(
        "--workloads",
        type=_workloads,
        default=list(WORKLOADS),
        help="comma-separated workloads (default: all; those but orders run at N=10,000)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("MESSAGEBOX_BENCH_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL server URL (a schema per N is created in it and dropped)",
    )
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 3_000 if args.quick else 20_000
    if args.sizes is None:
        args.sizes = [100, 10_000] if args.quick else [100, 10_000, 100_000]
    if args.messages < 1:
        parser.error("--messages must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_lint()
    if args.profile:
        run_profile(args.messages, args.seed)
        return 0

    backends: list[str] = list(args.backends)
    notes: list[str] = []
    if "postgresql" in backends:
        why = pg_check(args.pg_url)
        if why is not None:
            backends.remove("postgresql")
            notes.append(f"PostgreSQL skipped: cannot connect to {args.pg_url}: {why}")
            log(notes[-1])

    works: dict[tuple[str, int], Workload] = {}
    naives: dict[tuple[str, int], NaiveResult] = {}
    results: list[RunResult] = []
    # scaling is measured in one process: N=100,000's batches alternate with N=100's
    pairs = {("orders", 100_000): ("orders", 100)}
    for name, n in _plan(args.workloads, args.sizes):
        partner = works.get(pairs.get((name, n), ("", 0)))
        start = time.perf_counter()
        work = make_workload(n, args.messages, args.seed, name)
        works[(name, n)] = work
        log(
            f"{name} N={n:,}: workload built in {time.perf_counter() - start:.1f}s "
            f"({work.customers:,} customers, ~{work.expected_matches:.2f} matches/msg expected)"
        )
        naive = run_naive(work, NAIVE_BUDGET_S)
        naives[(name, n)] = naive
        log(f"{name} N={n:,}: naive {naive.msgs_per_s:,.1f} msgs/s over {naive.sampled:,} msgs")
        # the workload (at N=100,000 some two million objects of specs, filters and
        # messages) is the bench's, not the publisher's: out of the collector's sight
        # during the runs, else a full collection of it (1.3 s) lands in a timed batch
        gc.collect()
        gc.freeze()
        for backend in backends:
            gc.collect()
            result = run_backend(backend, work, naive, args.pg_url, partner=partner)
            results.append(result)
            limit = result.limit
            log(
                f"{name} N={n:,}: {backend}: subscribe {result.subscribe_s:.2f}s, "
                f"{result.msgs_per_s:,.0f} msgs/s, {result.avg_matches:.2f} matches/msg"
                + (
                    f"; write limit {limit.msgs_per_s:,.0f} msgs/s (minimal "
                    f"{limit.minimal_msgs_per_s:,.0f}); single publish "
                    f"{limit.publish_p50:.2f} ms vs raw {limit.raw_p50:.2f} ms"
                    if limit
                    else ""
                )
                + (
                    f"; N={result.paired.n:,} alternating: {result.paired.msgs_per_s:,.0f} msgs/s"
                    if result.paired
                    else ""
                )
            )
        # keep only what the report prints: a later run must not pay the garbage
        # collector for this workload's objects (a pair's smaller one waits for its run)
        gc.unfreeze()
        if (name, n) not in pairs.values():
            works[(name, n)] = _emptied(work)
        if partner is not None:
            works[partner.name, partner.n] = _emptied(partner)
        del work, partner

    print(report(args.messages, works, naives, results, backends))
    for note in notes:
        print(f"\nNote: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
