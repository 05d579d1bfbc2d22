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
    (``Claimer.longest_run``).

    Per-key order (``ordered_by``), two tables more. First, one subscription taking
    every message, ordered by a property with ``--keys`` values (1,000; each message's
    key drawn at random, the same draw every run), against the same subscription
    unordered (the baseline, same run, same messages): each key's entries strictly in
    publish order, one at a time, keys in parallel; the target is half the plain rate
    (:data:`KEYED_TARGET`). Then the cost to plain subscriptions of a keyed one beside
    them: table one's host with a subscription ordered by that property taking the
    first ``--ordered`` messages, against the host without it; the target is at most
    a tenth less (:data:`BESIDE_TARGET`).

    On a shared two-core machine, per-key order ran at 0.59-0.81 of plain on DuckDB and
    0.77-0.94 on PostgreSQL (medians of three rounds, several runs); beside plain ones,
    0.90-0.98 and 0.92-1.00. Before a claim of keyed runs updated its rows in place and
    planned its statements once a session, PostgreSQL ran per-key order at 0.44-0.66 of
    plain; beside plain ones, before the keyed claim walked an index of its own, 0.63 on
    PostgreSQL, and before a thread rested from keyed claims that found none, 0.80-0.86
    on both.

Run it from the project root::

    python -m bench.ordered              # 10,000 messages, 300 ordered, 3 rounds
    python -m bench.ordered --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable

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
KEYED_TARGET = 0.5
"""Per-key ordered delivery against plain delivery of the same subscription: at least
half its rate (issue 57)."""
BESIDE_TARGET = 0.9
"""A host with a subscription ordered by a property beside its plain ones against the
host without it: at most a tenth slower (issue 57)."""


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


def run_one(url: str, messages: int, ordered: int, keys: int = 0) -> float:
    """Deliveries per second of one host instance on a fresh store at ``url``; with
    ``keys``, the extra subscription is ordered by ``t.K`` instead of in whole."""
    with MessageBox(url, publisher="bench.ordered") as box:
        box.create_host("h", throttle_queue_depth=10 * messages)
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all")
        box.subscribe("svc", host="h", filter=P("t.N") < messages // 2, name="low")
        box.subscribe("svc", host="h", filter=P("t.N") >= messages // 2, name="high")
        if ordered:
            box.subscribe(
                "svc",
                host="h",
                filter=P("t.N") < ordered,
                name="ord",
                ordered=not keys,
                ordered_by="t.K" if keys else None,
            )
        return _delivered(box, url, messages, 2 * messages + min(ordered, messages), keys or KEYS)


def run_keyed(url: str, messages: int, keys: int) -> float:
    """Deliveries per second of one host instance whose one subscription takes every
    message, ordered by ``t.K`` (``keys`` values) or not (``keys`` 0), at ``url``."""
    with MessageBox(url, publisher="bench.ordered") as box:
        box.create_host("h", throttle_queue_depth=10 * messages)
        by = "t.K" if keys else None
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all", ordered_by=by)
        return _delivered(box, url, messages, messages, keys or KEYS)


def run_alone(url: str, messages: int, ordered: bool) -> float:
    """Deliveries per second of one host instance whose one subscription takes every
    message, ordered or not, on a fresh store at ``url``."""
    with MessageBox(url, publisher="bench.ordered") as box:
        box.create_host("h", throttle_queue_depth=10 * messages)
        box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all", ordered=ordered)
        return _delivered(box, url, messages, messages)


KEYS = 1000
"""The keys of the per-key tables (``--keys``)."""


def _delivered(box: MessageBox, url: str, messages: int, expected: int, keys: int = KEYS) -> float:
    """Publish ``messages`` to the box's host ``h`` (each with a key ``t.K`` of ``keys``,
    drawn the same way every time), then the rate at which one host instance handles
    the ``expected`` deliveries."""
    draw = random.Random(57)
    for start in range(0, messages, 1000):
        stop = min(messages, start + 1000)
        box.publish(
            [
                Message(b"x", promoted={"t.N": i, "t.K": draw.randrange(keys)})
                for i in range(start, stop)
            ]
        )
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


def _compare(
    backend: str, rounds: int, base: Callable[[str], float], subject: Callable[[str], float]
) -> tuple[list[float], list[float]]:
    """The rates of ``base`` and ``subject``, each round on fresh stores of ``backend``,
    which goes first alternating."""
    rates: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            with store(backend) as url:
                rates[which].append((base, subject)[which](url))
    return rates


def _row(backend: str, base: list[float], subject: list[float], target: float | None) -> str:
    """A table's row: the medians, the ratio's median and its rounds (min / max too)."""
    ratios = sorted(s / b for s, b in zip(subject, base, strict=True))
    ratio = statistics.median(ratios)
    spread = f"{' / '.join(f'{r:.2f}' for r in ratios)} (min {ratios[0]:.2f}, max {ratios[-1]:.2f})"
    verdict = "" if target is None else f"  >= {target} {'ok' if ratio >= target else 'MISS'}"
    return (
        f"{backend:<12}{statistics.median(base):>12,.0f}{statistics.median(subject):>12,.0f}"
        f"{ratio:>8.2f}  {spread}{verdict}"
    )


def _table(
    args: argparse.Namespace,
    title: str,
    columns: tuple[str, str],
    runs: tuple[Callable[[str], float], Callable[[str], float]],
    target: float | None,
) -> None:
    print(f"\n{title}")
    print(f"{'backend':<12}{columns[0]:>12}{columns[1]:>12}{'ratio':>8}  rounds (ratio)")
    for backend in args.backends:
        if backend == "postgresql" and not pg_reachable():
            print(f"{backend:<12}(unreachable at {PG_URL}: skipped)")
            continue
        print(_row(backend, *_compare(backend, args.rounds, *runs), target), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ordered", description=__doc__)
    parser.add_argument("--messages", type=positive, default=10_000, help="messages (10,000)")
    parser.add_argument("--ordered", type=positive, default=300, help="of them ordered (300)")
    parser.add_argument("--keys", type=positive, default=KEYS, help="keys (1,000)")
    parser.add_argument("--rounds", type=positive, default=3, help="rounds (3; medians shown)")
    parser.add_argument(
        "--backends", type=_backends, default=list(BACKENDS), help="comma-separated"
    )
    parser.add_argument("--quick", action="store_true", help="2,000 messages, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 2_000, 1
    n, ordered, keys = args.messages, min(args.ordered, args.messages), args.keys
    print(f"{n:,} messages, {args.rounds} round(s), medians")
    _table(
        args,
        f"Ordered subscription beside plain ones: {ordered:,} of the messages ordered",
        ("without /s", "with /s"),
        (lambda url: run_one(url, n, 0), lambda url: run_one(url, n, ordered)),
        TARGET,
    )
    _table(
        args,
        "One subscription taking every message, ordered (strictly in publish order, one "
        "at a time) or not (the baseline), same settings",
        ("plain /s", "ordered /s"),
        (lambda url: run_alone(url, n, False), lambda url: run_alone(url, n, True)),
        None,
    )
    _table(
        args,
        f"One subscription taking every message, ordered by a property of {keys:,} values "
        "(each key in publish order, one at a time, keys in parallel) or not (the baseline)",
        ("plain /s", "per key /s"),
        (lambda url: run_keyed(url, n, 0), lambda url: run_keyed(url, n, keys)),
        KEYED_TARGET,
    )
    _table(
        args,
        f"A subscription ordered by a property ({keys:,} values) beside plain ones: "
        f"{ordered:,} of the messages",
        ("without /s", "with /s"),
        (lambda url: run_one(url, n, 0), lambda url: run_one(url, n, ordered, keys)),
        BESIDE_TARGET,
    )


if __name__ == "__main__":
    main()
