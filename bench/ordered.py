"""What an ordered subscription costs the rest of its host: delivery throughput of one
host instance with and without an ordered subscription beside its plain ones, in the
same run (the host without it is the baseline).

What it measures
    For each backend (DuckDB, PostgreSQL) and each round, two fresh stores with one
    host and three plain subscriptions (``t.N >= 0``, ``t.N < M/2``, ``t.N >= M/2``:
    two deliveries a message); one of them also has an ordered subscription taking
    the first ``--ordered`` messages (one delivery more each, strictly in publish order,
    one at a time). M messages are published before the clock starts; one host
    instance (4 dequeue threads, claim batch 50, ``max_in_flight`` 400) then handles
    them with a do-nothing service, and the clock stops when every delivery has been
    handled. The figure is deliveries per second; the ratio is the host with the
    ordered subscription against the host without it.

    Until a claim could take an ordered run and still take batches for the other
    threads, one ordered subscription made a DuckDB host claim one thread's batch at a
    time, alone in its transaction: 20,300 deliveries ran at 2.5-3.0k/s against 19.7k/s
    without it (a ratio of 0.13-0.15). On PostgreSQL its claims were a transaction of
    several statements (the completions, the run, the rest) instead of the one that
    completes and claims: 16.0k/s against 33.7k (0.47), where the run is now claimed
    alone first.

    A second table is an ordered subscription alone: one subscription takes every
    message, ordered or not (the baseline). A run is one thread's, in order, so its
    claim's cost is shared by the run alone; with runs of one batch (50), ordered
    delivery on DuckDB ran at 4.8k/s against 83k plain. Runs now grow with their pace
    (``Supervision._run_most``).

Run it from the project root::

    python -m bench.ordered              # 10,000 messages, 300 ordered, 3 rounds
    python -m bench.ordered --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.orchestrate import positive
from bench.tracking import PG_URL, pg_reachable, store
from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P

SETTINGS = {
    "dequeue_threads": 4,
    "claim_batch": 50,
    "max_in_flight": 400,
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.1,
    "cleanup_interval_seconds": 0,
}
TARGET = 0.5
"""The least ratio to call the cost acceptable: an ordered subscription may slow its
own entries (one at a time), not halve the rest of its host."""


BACKENDS = ("duckdb", "postgresql")


def _backends(text: str) -> list[str]:
    """``--backends``: a comma-separated list of :data:`BACKENDS`."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"not a backend: {unknown[0]!r} (choose from {', '.join(BACKENDS)})"
            if unknown
            else "no backend given"
        )
    return names


def run_one(url: str, messages: int, ordered: int) -> float:
    """Deliveries per second of one host instance on a fresh store at ``url``."""
    with MessageBox(url, publisher="bench.ordered") as box:
        box.create_host("h", throttle_queue_depth=10 * messages)
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all")
        box.subscribe("svc", host="h", filter=P("t.N") < messages // 2, name="low")
        box.subscribe("svc", host="h", filter=P("t.N") >= messages // 2, name="high")
        if ordered:
            box.subscribe("svc", host="h", filter=P("t.N") < ordered, name="ord", ordered=True)
        return _delivered(box, url, messages, 2 * messages + min(ordered, messages))


def run_alone(url: str, messages: int, ordered: bool) -> float:
    """Deliveries per second of one host instance whose one subscription takes every
    message, ordered or not, on a fresh store at ``url``."""
    with MessageBox(url, publisher="bench.ordered") as box:
        box.create_host("h", throttle_queue_depth=10 * messages)
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all", ordered=ordered)
        return _delivered(box, url, messages, messages)


def _delivered(box: MessageBox, url: str, messages: int, expected: int) -> float:
    """Publish ``messages`` to the box's host ``h``, then the rate at which one host
    instance handles the ``expected`` deliveries."""
    for start in range(0, messages, 1000):
        stop = min(messages, start + 1000)
        box.publish([Message(b"x", promoted={"t.N": i}) for i in range(start, stop)])
    done = threading.Semaphore(0)

    def handler(_d: Delivery) -> None:
        done.release()

    inst = HostInstance(box, "h", {"svc": handler}, settings=SETTINGS)
    start_s = time.perf_counter()
    inst.start()
    try:
        for _ in range(expected):
            if not done.acquire(timeout=120):
                raise RuntimeError(f"deliveries stalled at {url}")
        seconds = time.perf_counter() - start_s
    finally:
        inst.stop(10)
    return expected / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ordered", description=__doc__)
    parser.add_argument("--messages", type=positive, default=10_000, help="messages (10,000)")
    parser.add_argument("--ordered", type=positive, default=300, help="of them ordered (300)")
    parser.add_argument("--rounds", type=positive, default=3, help="rounds (3; medians shown)")
    parser.add_argument(
        "--backends", type=_backends, default=list(BACKENDS), help="comma-separated"
    )
    parser.add_argument("--quick", action="store_true", help="2,000 messages, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 2_000, 1
    print(
        f"Ordered subscription beside plain ones: {args.messages:,} messages, "
        f"{min(args.ordered, args.messages):,} of them ordered; {args.rounds} round(s), medians"
    )
    print(f"{'backend':<12}{'without /s':>12}{'with /s':>12}{'ratio':>8}  rounds (ratio)  target")
    for backend in args.backends:
        if backend == "postgresql" and not pg_reachable():
            print(f"{backend:<12}(unreachable at {PG_URL}: skipped)")
            continue
        plain: list[float] = []
        mixed: list[float] = []
        for i in range(args.rounds):  # each on a fresh store, which goes first alternating
            for ordered in (0, args.ordered) if i % 2 == 0 else (args.ordered, 0):
                with store(backend) as url:
                    rate = run_one(url, args.messages, ordered)
                (mixed if ordered else plain).append(rate)
        ratios = sorted(m / p for m, p in zip(mixed, plain, strict=True))
        ratio = statistics.median(ratios)
        verdict = f">= {TARGET} {'ok' if ratio >= TARGET else 'MISS'}"
        print(
            f"{backend:<12}{statistics.median(plain):>12,.0f}{statistics.median(mixed):>12,.0f}"
            f"{ratio:>8.2f}  {' / '.join(f'{r:.2f}' for r in ratios):<14}  {verdict}"
        )
    print(
        f"\nOne subscription taking all {args.messages:,} messages, ordered (strictly in "
        "publish order, one at a time) or not (the baseline), same settings"
    )
    print(f"{'backend':<12}{'plain /s':>12}{'ordered /s':>12}{'ratio':>8}  rounds (ratio)")
    for backend in args.backends:
        if backend == "postgresql" and not pg_reachable():
            continue
        rates: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.rounds):
            for ordered in (False, True) if i % 2 == 0 else (True, False):
                with store(backend) as url:
                    rates[ordered].append(run_alone(url, args.messages, ordered))
        ratios = sorted(o / p for o, p in zip(rates[True], rates[False], strict=True))
        print(
            f"{backend:<12}{statistics.median(rates[False]):>12,.0f}"
            f"{statistics.median(rates[True]):>12,.0f}{statistics.median(ratios):>8.2f}  "
            + " / ".join(f"{r:.2f}" for r in ratios)
        )


if __name__ == "__main__":
    main()
