"""Orchestrations: steps per second of correlated, stateful instances, beside stateless
services doing the same publishing, in the same run.

What it measures
    N conversations of two messages each (an ``order`` that starts an instance, then a
    ``payment`` that makes it publish a confirmation and complete) are published before
    the clock starts. One host instance (4 dequeue threads, claim batch 50, the default
    ``max_in_flight``: a batch for every thread; sixteen, claimed ahead at the
    handlers' pace, on DuckDB and for orchestrations on PostgreSQL) then handles them;
    the clock stops when the N-th confirmation reaches a counting service in the same
    host. The figure is conversation messages handled per second (2N / time).

    - ``orchestration``: :class:`~messagebox.hosts.orchestration.Orchestration` with
      persisted state, one message at a time per instance, each step committed atomically with its
      publication.
    - ``stateless``: plain services with the same filters, no state, no correlation;
      the payment handler publishes the confirmation written the obvious way,
      ``d.publish(confirm)``: it is stored and routed in the transaction that completes
      the payment's entry (with the rest of its batch), as an orchestration step's
      publications are. It runs as many conversations as ``plain`` (a short run
      measured mostly the host instance's start: 11.8k msgs/s over 300 conversations
      on DuckDB, 23.2k over 10,000).
    - ``at once``: the same stateless services, the payment handler publishing with
      ``d.publish(confirm, at_once=True)``: a transaction of its own per confirmation,
      the entry completing after (what ``Delivery.publish`` did before it joined the
      completion).
    - ``plain`` (the baseline the issue names): the same kind of messages delivered to
      do-nothing services on the same host settings; no state, no publishing. The clock
      stops when all are handled. It runs at least ``PLAIN_MIN_CONVERSATIONS``
      conversations (2,000 with ``--quick``): plain delivery of 2,000 took about 0.1 s
      on PostgreSQL, mostly the host instance's start (37k msgs/s, against 61k over
      20,000), which made the ratio look better than it is.

    - ``plain reading``: the same, by services that read each message's body (as
      real services do, and as every orchestration step does), the batch's messages
      read together. Beside the issue's baseline, for what reading the messages costs;
      the targets are checked against ``plain``. The backlog is published before a host
      instance runs, so on DuckDB it is read from the store.
    - ``reading held``: the same, the backlog published while a host instance (of
      another host, idle) runs in the process, as a backlog grows while a host's
      instances run behind: on DuckDB each message is then held in memory
      (``messagebox.storage.recent``) and read from there; on PostgreSQL it is ``plain
      reading`` again.

    - ``with timers``: the same orchestration whose order step also starts a timer
      (``wait_for``), which the payment's step stops: a timer row written and deleted
      per conversation.
    - ``step limit``: what a step writes, done with the raw driver and no engine
      (:mod:`bench.orchestrate_limit`), in batches as large as the host instance's
      batches of steps can be (800): the rate steps could reach on this machine if the
      engine cost nothing. Its ratio to plain delivery is the most the ``orch/plain``
      figure can be here.

    Every rate but ``at once`` is taken over as many conversations as ``plain`` (at
    least ``PLAIN_MIN_CONVERSATIONS``), so that it is the steady rate, not the host
    instance's start: at 2,000 conversations orchestration steps ran at 7.5k/s
    (DuckDB) and 10k/s (PostgreSQL) against 11.6k and 15.1k over 10,000, the step limit
    at 26.4k and 27.4k against 18.0k and 31.1k (it reads DuckDB's growing tables).
    ``at once`` (a transaction per confirmation) runs ``--conversations``.

    A second table gives each system's CPU per message handled (:mod:`bench.spent`):
    this process's (Python; on DuckDB the engine's threads too) and the rest of the
    machine's (PostgreSQL's server, the kernel), over the timed stretch. It says where
    a rate's limit lies: N cores give at most N CPU-seconds a second, so a rate of R
    steps/s needs a step to cost at most N / R seconds in all (on two cores, 0.3 of
    40k msgs/s of plain delivery: at most 167 us, less whatever the machine leaves
    idle).

    An orchestration step is one message handled, so its msgs/s are steps/s. The ratios
    are the price of persisted state, per-instance ordering and atomic steps: against
    plain delivery of the same messages, against stateless services that publish the
    same confirmations, and against the step limit. The last column checks the targets:
    orchestration steps >= 0.5 of the step limit, and stateless services that publish
    (``d.publish``) >= 0.3 of plain delivery.

Run it from the project root::

    python -m bench.orchestrate              # 2,000 conversations per backend, 3 rounds
    python -m bench.orchestrate --quick      # 300 (plain delivery: 2,000)
    python -m bench.orchestrate --runs 1     # one round
    python -m bench.orchestrate --conversations 5000 --backends duckdb
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from pydantic import BaseModel

from bench.backlog import analyze
from bench.orchestrate_limit import duckdb_limit, pg_limit
from bench.spent import Meter, Spent
from messagebox import Message, MessageBox
from messagebox.hosts import (
    Delivery,
    HostApp,
    HostInstance,
    Orchestration,
    activate,
    receive,
    timeout,
)
from messagebox.predicates import P

PG_URL = os.environ.get(
    "MESSAGEBOX_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


class Conversation(BaseModel):
    amount: float = 0.0


class Fulfil(Orchestration[Conversation]):
    name = "bench-fulfil"
    correlation = ("b.Id",)

    @activate(P("b.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.amount = float(d.properties["b.Total"])  # type: ignore[arg-type]

    @receive(P("b.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.publish(Message(b"confirmed", promoted={"b.Kind": "confirm"}))
        self.complete()


class FulfilTimed(Fulfil):
    """The same conversation with a timeout: the order starts a timer (a row written
    with its step), which the payment's step stops (the row deleted)."""

    name = "bench-fulfil-timed"

    def order(self, d: Delivery) -> None:
        super().order(d)
        self.wait_for("payment", timeout=3600)

    @timeout("payment")
    def unpaid(self) -> None:
        self.complete()


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, _d: Delivery) -> None:
        with self.lock:
            self.n += 1


class ReadingCounter(Counter):
    """A plain service that reads each message's body, as real services do (and as an
    orchestration step does): the batch's messages are read once, together."""

    def __call__(self, d: Delivery) -> None:
        _ = d.body
        super().__call__(d)


ORCHESTRATIONS: dict[str, type[Orchestration[Conversation]]] = {
    "orchestration": Fulfil,
    "with timers": FulfilTimed,
}
"""The orchestration workloads, each measured beside the same plain delivery."""


def _app(system: str, counter: Counter) -> HostApp:
    app = HostApp(
        "bench",
        dequeue_threads=4,
        claim_batch=50,
        poll_min_seconds=0.005,
        poll_max_seconds=0.1,
        cleanup_interval_seconds=0,
    )
    if system in ORCHESTRATIONS:
        app.orchestration(ORCHESTRATIONS[system])
    elif system in PLAIN:
        app.add_service("order", counter)
        app.add_service("payment", counter)
        app.subscribe("order", filter=P("b.Kind") == "order", name="order")
        app.subscribe("payment", filter=P("b.Kind") == "payment", name="payment")
        return app
    else:

        def order(_d: Delivery) -> None:
            pass

        def payment(d: Delivery) -> None:
            confirm = Message(b"confirmed", promoted={"b.Kind": "confirm"})
            if system == "at once":
                d.publish(confirm, at_once=True)
            else:
                d.publish(confirm)

        app.add_service("order", order)
        app.add_service("payment", payment)
        app.subscribe("order", filter=P("b.Kind") == "order", name="order")
        app.subscribe("payment", filter=P("b.Kind") == "payment", name="payment")
    app.add_service("count", counter)
    app.subscribe("count", filter=P("b.Kind") == "confirm", name="count")
    return app


PLAIN_MIN_CONVERSATIONS = 20_000
"""The least plain delivery runs, so that its rate is the steady one (see above)."""


PLAIN = ("plain", "plain reading", "reading held")
"""Plain delivery, by do-nothing services (the issue's baseline) and by services that
read each message's body (from the store, and held in memory)."""

READING = ("plain reading", "reading held")


def run_one(url: str, system: str, n: int) -> tuple[Spent, float]:
    """What handling the 2N messages took, for one system on one fresh store, and the
    rate (msgs/s) at which they were published before."""
    counter = ReadingCounter() if system in READING else Counter()
    app = _app(system, counter)
    bystander = _idle_instance(url) if system == "reading held" else None
    try:
        with MessageBox(url) as box:
            app.setup(box)
            began = time.perf_counter()
            for start in range(0, n, 500):
                ids = range(start, min(start + 500, n))
                box.publish(
                    [
                        Message(b"order", promoted={"b.Kind": "order", "b.Id": i, "b.Total": 10.0})
                        for i in ids
                    ]
                )
            for start in range(0, n, 500):
                ids = range(start, min(start + 500, n))
                box.publish(
                    [Message(b"pay", promoted={"b.Kind": "payment", "b.Id": i}) for i in ids]
                )
            published = 2 * n / (time.perf_counter() - began)
            analyze(box)  # as autovacuum would have (bench.backlog)
        return _timed(app.instance(url), counter, 2 * n if system in PLAIN else n), published
    finally:
        if bystander is not None:
            bystander.stop(10.0)


def _idle_instance(url: str) -> HostInstance:
    """A running host instance of another host, with nothing to do."""
    idle = HostApp("idle", cleanup_interval_seconds=0)
    idle.add_service("idle", lambda _d: None)
    idle.subscribe("idle", filter=P("b.Kind") == "none", name="idle")
    with MessageBox(url) as box:
        idle.setup(box)
    instance = idle.instance(url)
    instance.start()
    return instance


def _timed(instance: HostInstance, counter: Counter, target: int) -> Spent:
    """Run the host instance until ``counter`` reaches ``target``: what it took."""
    meter = Meter()
    instance.start()
    try:
        while counter.n < target:
            time.sleep(0.005)
        spent = meter.stop()
    finally:
        instance.stop(10.0)
    return spent


Backend = tuple[str, Callable[[], str], Callable[[], None], Callable[[int], Spent]]
"""A backend's name, a fresh store's URL, what drops them all, and its step limit."""


def _backends(names: list[str]) -> list[Backend]:
    out: list[Backend] = []
    tmp = tempfile.mkdtemp(prefix="bench-orchestrate-")
    if "duckdb" in names:
        out.append(
            (
                "duckdb",
                lambda: f"duckdb:///{tmp}/{uuid.uuid4().hex}.duckdb",
                lambda: None,
                lambda n: duckdb_limit(f"{tmp}/{uuid.uuid4().hex}.duckdb", n),
            )
        )
    if "postgresql" in names:
        try:
            engine = sa.create_engine(PG_URL)
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except Exception as exc:
            print(f"(PostgreSQL skipped: {exc})")
            return out
        schemas: list[str] = []

        def new_schema() -> str:
            name = f"bench_orch_{uuid.uuid4().hex[:8]}"
            with engine.begin() as conn:
                conn.exec_driver_sql(f"CREATE SCHEMA {name}")
            schemas.append(name)
            return name

        def make() -> str:
            return f"{PG_URL}?options=-csearch_path%3D{new_schema()}"

        def drop() -> None:
            with engine.begin() as conn:
                for name in schemas:
                    conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            engine.dispose()

        def limit(n: int) -> Spent:
            dsn = sa.make_url(PG_URL).set(drivername="postgresql")
            return pg_limit(dsn.render_as_string(hide_password=False), new_schema(), n)

        out.append(("postgresql", make, drop, limit))
    return out


Row = tuple[str, str, dict[str, tuple[Spent, int, float]]]
"""A backend, an orchestration workload, and per system what handling its messages
took, how many there were, and the rate they were published at (msgs/s; NaN for the
step limit, which publishes none)."""

SYSTEMS = (
    "plain",
    "plain reading",
    "reading held",
    "stateless",
    "at once",
    "orchestration",
    "step limit",
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="300 conversations")
    ap.add_argument("--backends", default="duckdb,postgresql")
    ap.add_argument(
        "--runs",
        type=positive,
        default=3,
        help="rounds of every measurement (default 3): each cell is the median, the "
        "targets are checked on the medians, and a table of the ranges follows",
    )
    args = ap.parse_args(argv)
    n = 300 if args.quick else args.conversations
    plain_n = max(n, 2_000 if args.quick else PLAIN_MIN_CONVERSATIONS)
    runs: list[list[Row]] = []
    for round_ in range(1, args.runs + 1):
        print(f"round {round_} of {args.runs}", flush=True)
        runs.append(_round(args.backends.split(","), n, plain_n))
    print(
        f"\n{plain_n:,} conversations (2 messages each; 'at once' {n:,}), "
        "4 dequeue threads, claim batch 50, "
        "max_in_flight the default (a batch for every thread, 200, for plain and stateless "
        "services on PostgreSQL; otherwise sixteen, 3,200, claimed ahead at the handlers' "
        "pace); per backend, one "
        "plain (do-nothing and reading), stateless, at once and step limit run beside each "
        f"orchestration workload; the median of {len(runs)} round(s)"
    )
    _print_rates(runs)
    if len(runs) > 1:
        _print_ranges(runs)
    _print_cpu(runs)
    _print_publishing(runs)


def positive(text: str) -> int:
    """A count of at least 1 (an argparse type: ``--runs`` here, and bench.ordered's)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, not {value}")
    return value


def _round(backends: list[str], n: int, plain_n: int) -> list[Row]:
    """One round of every measurement on every backend, each on a fresh store."""
    rows: list[Row] = []
    for backend, make_url, drop, step_limit in _backends(backends):
        try:
            shared = {
                "plain": _measured(make_url, "plain", plain_n),
                "plain reading": _measured(make_url, "plain reading", plain_n),
                "reading held": _measured(make_url, "reading held", plain_n),
                "stateless": _measured(make_url, "stateless", plain_n),
                "at once": _measured(make_url, "at once", n),
            }
            orchs = {w: _measured(make_url, w, plain_n) for w in ORCHESTRATIONS}
            shared["step limit"] = (step_limit(plain_n), 2 * plain_n, math.nan)
        finally:
            drop()
        rows.extend((backend, w, {**shared, "orchestration": o}) for w, o in orchs.items())
    return rows


def _measured(
    make_url: Callable[[], str], system: str, conversations: int
) -> tuple[Spent, int, float]:
    """One system's run on a fresh store: what handling took, the messages handled, and
    the rate they were published at."""
    spent, published = run_one(make_url(), system, conversations)
    return spent, 2 * conversations, published


def _rate(row: Row, system: str) -> float:
    spent, count, _ = row[2][system]
    return count / spent.seconds


def _rates(runs: list[list[Row]], i: int) -> dict[str, list[float]]:
    """Row ``i``'s rate of each system, and its ratios, in every round."""
    out: dict[str, list[float]] = {s: [_rate(rows[i], s) for rows in runs] for s in SYSTEMS}
    orch, limit = out["orchestration"], out["step limit"]
    for name, base in (
        ("plain", "plain"),
        ("reading", "plain reading"),
        ("stateless", "stateless"),
        ("limit", "step limit"),
    ):
        out[f"orch/{name}"] = [o / b for o, b in zip(orch, out[base], strict=True)]
    out["limit/plain"] = [li / p for li, p in zip(limit, out["plain"], strict=True)]
    out["stateless/plain"] = [s / p for s, p in zip(out["stateless"], out["plain"], strict=True)]
    return out


def _print_rates(runs: list[list[Row]]) -> None:
    print(
        f"{'backend':<12}{'workload':<15}{'plain msgs/s':>14}{'reading msgs/s':>16}"
        f"{'held msgs/s':>13}{'stateless msgs/s':>18}{'at once msgs/s':>16}"
        f"{'orchestration steps/s':>23}"
        f"{'step limit/s':>14}"
        f"{'orch/plain':>12}{'orch/reading':>14}{'orch/stateless':>16}{'orch/limit':>12}"
        f"{'limit/plain':>13}  targets"
    )
    for i, row in enumerate(runs[0]):
        m = {k: statistics.median(v) for k, v in _rates(runs, i).items()}
        print(
            f"{row[0]:<12}{row[1]:<15}{m['plain']:>14,.0f}{m['plain reading']:>16,.0f}"
            f"{m['reading held']:>13,.0f}{m['stateless']:>18,.0f}{m['at once']:>16,.0f}"
            f"{m['orchestration']:>23,.0f}{m['step limit']:>14,.0f}{m['orch/plain']:>12.2f}"
            f"{m['orch/reading']:>14.2f}{m['orch/stateless']:>16.2f}{m['orch/limit']:>12.2f}"
            f"{m['limit/plain']:>13.2f}  {_verdict(m['orch/limit'], m['stateless/plain'])}"
        )


RANGES = ("plain", "stateless", "orchestration", "step limit", "stateless/plain", "orch/limit")
"""The cells whose range over the rounds is printed."""


def _print_ranges(runs: list[list[Row]]) -> None:
    """Each round's values of the cells the targets read, lowest to highest."""
    print(f"\nthe {len(runs)} rounds, lowest to highest")
    print(f"{'backend':<12}{'workload':<15}" + "".join(f"{c:>26}" for c in RANGES))
    for i, row in enumerate(runs[0]):
        rates = _rates(runs, i)
        cells = [
            " / ".join(f"{v:.2f}" if "/" in c else f"{v:,.0f}" for v in sorted(rates[c]))
            for c in RANGES
        ]
        print(f"{row[0]:<12}{row[1]:<15}" + "".join(f"{c:>26}" for c in cells))


def _print_cpu(runs: list[list[Row]]) -> None:
    """CPU per message handled, by this process and by the rest of the machine: where
    each rate's limit lies (two cores give at most 2 s of CPU a second). The median of
    the rounds."""
    print(
        "\nCPU per message handled, us: this process (Python; on DuckDB the engine's "
        "threads too) + the rest of the machine (PostgreSQL's server, the kernel; "
        "/proc/stat, '?' where unknown)"
    )
    print(f"{'backend':<12}{'workload':<15}" + "".join(f"{s:>22}" for s in SYSTEMS))
    for i, row in enumerate(runs[0]):
        cells = []
        for system in SYSTEMS:
            per = [rows[i][2][system][0].per(rows[i][2][system][1]) for rows in runs]
            process = statistics.median(p for p, _ in per)
            rests = [r for _, r in per if r is not None]
            rest = f"{statistics.median(rests):.0f}" if len(rests) == len(per) else "?"
            cells.append(f"{process:.0f} + {rest}")
        print(f"{row[0]:<12}{row[1]:<15}" + "".join(f"{c:>22}" for c in cells))


def _print_publishing(runs: list[list[Row]]) -> None:
    """How fast each workload's backlog was published (batches of 500, before the clock
    of its handling starts): an orchestration's orders find or make a convoy each
    (their instance) and its payments find theirs, in the publish's transaction; the
    stateless services' subscriptions take the same messages with no correlation. The
    median of the rounds."""
    print(
        "\npublishing the backlog (batches of 500): orders that start an orchestration's "
        "instances and payments that follow them, against the same messages to stateless "
        "services"
    )
    print(
        f"{'backend':<12}{'workload':<15}{'stateless msgs/s':>18}{'orchestration msgs/s':>22}"
        f"{'orch/stateless':>16}{'range':>22}"
    )
    for i, row in enumerate(runs[0]):
        orch = [rows[i][2]["orchestration"][2] for rows in runs]
        base = [rows[i][2]["stateless"][2] for rows in runs]
        ratios = sorted(o / b for o, b in zip(orch, base, strict=True))
        span = " / ".join(f"{r:.2f}" for r in ratios)
        print(
            f"{row[0]:<12}{row[1]:<15}{statistics.median(base):>18,.0f}"
            f"{statistics.median(orch):>22,.0f}{statistics.median(ratios):>16.2f}{span:>22}"
        )


TARGET_OF_LIMIT = 0.5
"""Orchestration steps against the step limit (what a step writes, on the raw driver)."""
TARGET_PUBLISHING = 0.3
"""A service that publishes a message per message (``d.publish``) against plain delivery."""


def _verdict(orch_limit: float, stateless_plain: float) -> str:
    """The issue's two targets, met or missed, on the medians."""
    steps = "ok" if orch_limit >= TARGET_OF_LIMIT else "MISS"
    publishing = "ok" if stateless_plain >= TARGET_PUBLISHING else "MISS"
    return (
        f"steps >= {TARGET_OF_LIMIT} of limit {steps}; "
        f"publishing >= {TARGET_PUBLISHING} of plain {publishing} ({stateless_plain:.2f})"
    )


if __name__ == "__main__":
    main()
