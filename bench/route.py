"""Routing throughput: ``MessageBox.publish`` against N subscriptions, beside a naive loop.

What it measures
    For each backend (DuckDB, PostgreSQL) and each subscription count N (default 100,
    10,000 and 100,000) it creates a fresh database (a temporary DuckDB file, or a fresh
    PostgreSQL schema that is dropped afterwards), subscribes N generated subscriptions
    with one ``subscribe_many`` call (timed and printed separately), publishes one
    warm-up batch, then times ``publish`` alone over M messages in batches of 1,000 (one
    transaction per batch). Messages are built before the clock starts.

    The baseline is the naive approach in the same run: for each message, normalise its
    properties once, then loop over every subscription's :class:`~predicates.Filter`
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

Targets (shown beside the figures)
    at N=10,000: >= 20,000 msgs/s on DuckDB, >= 10,000 msgs/s on PostgreSQL, >= 100x the
    naive loop; per backend, throughput(N=100,000) / throughput(N=100) >= 0.5.

Run it from the project root::

    python -m bench.route                       # 20,000 messages, N = 100, 10k, 100k
    python -m bench.route --quick               # smoke run: 3,000 messages, N = 100, 10k
    python -m bench.route --backends duckdb --sizes 100,10000 --messages 5000
    python -m bench.route --profile             # cProfile of DuckDB publish at N=10,000

PostgreSQL is reached at ``--pg-url`` (default ``$MESSAGEBOX_BENCH_PG_URL`` or
``postgresql+psycopg://postgres@127.0.0.1:5432/test``) and skipped, with a note, when it
cannot be reached.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.models import Routed
from predicates import Filter, P, Predicate, filter_matches, normalize_properties, to_filter

BATCH = 1_000
SEED = 20_240_601
TARGET_MATCHES = 10.0
NAIVE_BUDGET_S = 3.0
NAIVE_MIN_MESSAGES = 3
HOSTS = ("orders-eu", "orders-us", "orders-apac", "audit")
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

TARGET_MSGS_AT_10K = {"duckdb": 20_000.0, "postgresql": 10_000.0}
TARGET_VS_NAIVE_AT_10K = 100.0
TARGET_SCALING = 0.5

# --- the message distribution (the pass probabilities below are exact for it) ---

REGIONS = (
    "EU-WEST", "EU-NORTH", "EU-SOUTH", "EU-EAST", "UK", "US-EAST", "US-WEST", "US-CENTRAL",
    "CA", "MX", "BR", "AR", "APAC-JP", "APAC-KR", "APAC-CN", "APAC-IN", "APAC-SG", "AU",
    "ZA", "ME",
)  # fmt: skip
CHANNELS = ("web", "mobile", "edi", "phone", "store")
TOTAL_MAX = 10_000.0  # orders.Total ~ uniform(0, TOTAL_MAX), two decimals
QTY_MAX = 100  # orders.Qty ~ uniform int 1..QTY_MAX
PRIORITIES = 10  # orders.Priority ~ uniform int 0..9
RUSH_PRESENT = 0.5  # orders.Rush is promoted on half the messages ...
RUSH_TRUE = 0.2  # ... and is True on a fifth of those
PLACED_START = datetime(2024, 1, 1, tzinfo=UTC)
PLACED_SPAN_S = 366 * 86_400  # orders.Placed ~ uniform second within 2024
SKUS = 100_000  # orders.Sku = "SKU-00000" .. "SKU-99999"


def rush_is_true() -> Predicate:
    """``orders.Rush == True`` (an equality on a bool, not a truth test)."""
    return P("orders.Rush") == True  # noqa: E712


def customer_id(i: int) -> str:
    return f"C{i:07d}"


def make_properties(rng: random.Random, customers: int) -> dict[str, object]:
    """One message's promoted properties."""
    props: dict[str, object] = {
        "orders.Region": rng.choice(REGIONS),
        "orders.Customer": customer_id(rng.randrange(customers)),
        "orders.Total": round(rng.uniform(0.0, TOTAL_MAX), 2),
        "orders.Qty": rng.randint(1, QTY_MAX),
        "orders.Priority": rng.randrange(PRIORITIES),
        "orders.Placed": PLACED_START + timedelta(seconds=rng.randrange(PLACED_SPAN_S)),
        "orders.Channel": rng.choice(CHANNELS),
        "orders.Flags": rng.getrandbits(8),
        "orders.Sku": f"SKU-{rng.randrange(SKUS):05d}",
    }
    if rng.random() < RUSH_PRESENT:
        props["orders.Rush"] = rng.random() < RUSH_TRUE
    return props


# --- subscriptions ---

Expr = Any  # a DSL expression: Predicate | And | Or
Template = Callable[[str], Expr]  # customer id -> filter expression


def _p_total_gt(t: float) -> float:
    return 1.0 - t / TOTAL_MAX


def _p_placed_ge(when: datetime) -> float:
    return 1.0 - (when - PLACED_START).total_seconds() / PLACED_SPAN_S


P_RUSH_TRUE = RUSH_PRESENT * RUSH_TRUE


def broad_subscriptions() -> list[tuple[Expr, float]]:
    """A dozen subscriptions not anchored on a customer, with their pass probabilities."""
    december = datetime(2024, 12, 24, tzinfo=UTC)
    return [
        (P("orders.Total") > 9_900.0, _p_total_gt(9_900.0)),
        (P("orders.Total") < 25.0, 25.0 / TOTAL_MAX),
        ((P("orders.Qty") >= QTY_MAX) & (P("orders.Priority") == 9), 1 / QTY_MAX / PRIORITIES),
        (P("orders.Placed") >= december, _p_placed_ge(december)),
        (P("orders.Sku").prefix("SKU-000"), 0.01),
        (P("orders.Sku").prefix("SKU-1234"), 0.001),
        (P("orders.Flags").bitwise_and(0x80) & (P("orders.Total") > 9_000.0), 0.5 * 0.1),
        (
            (P("orders.Region") == "EU-WEST")
            & (P("orders.Channel") == "edi")
            & (P("orders.Total") >= 5_000.0),
            1 / len(REGIONS) / len(CHANNELS) * 0.5,
        ),
        (
            P("orders.Rush").exists() & (P("orders.Priority") >= 9) & (P("orders.Total") > 9_500.0),
            RUSH_PRESENT * 0.1 * 0.05,
        ),
        ((P("orders.Channel") == "phone") & (P("orders.Qty") > 90), 1 / len(CHANNELS) * 0.1),
        (rush_is_true() & P("orders.Sku").prefix("SKU-9"), P_RUSH_TRUE * 0.1),
        (
            P("orders.Region").in_(["APAC-JP", "APAC-KR"]) & (P("orders.Total") > 9_990.0),
            2 / len(REGIONS) * 0.001,
        ),
    ]


def customer_template(rng: random.Random) -> tuple[Template, float]:
    """A customer-anchored filter (as a function of the customer) and its pass
    probability given that the customer matches."""
    c = P("orders.Customer")
    kind = rng.random()
    if kind < 0.35:  # equality + range on a round threshold
        t = float(rng.choice((0, 1_000, 2_500, 5_000, 7_500, 9_000)))
        return (lambda cid: (c == cid) & (P("orders.Total") > t)), _p_total_gt(t)
    if kind < 0.50:  # equality + exists
        return (lambda cid: (c == cid) & P("orders.Rush").exists()), RUSH_PRESENT
    if kind < 0.65:  # equality + int range
        k = rng.choice((0, 3, 5, 8))
        return (
            (lambda cid: (c == cid) & (P("orders.Priority") >= k)),
            (PRIORITIES - k) / PRIORITIES,
        )
    if kind < 0.75:  # equality + datetime range (from a month's start)
        when = datetime(2024, rng.randint(1, 12), 1, tzinfo=UTC)
        return (lambda cid: (c == cid) & (P("orders.Placed") >= when)), _p_placed_ge(when)
    if kind < 0.85:  # two equalities
        ch = rng.choice(CHANNELS)
        return (lambda cid: (c == cid) & (P("orders.Channel") == ch)), 1 / len(CHANNELS)
    if kind < 0.95:  # equality only
        return (lambda cid: c == cid), 1.0
    t = float(rng.choice((5_000, 9_000)))  # two groups
    p_either = 1.0 - (1.0 - _p_total_gt(t)) * (1.0 - P_RUSH_TRUE)
    return (
        lambda cid: ((c == cid) & (P("orders.Total") > t)) | ((c == cid) & rush_is_true())
    ), p_either


@dataclass(frozen=True)
class Workload:
    n: int
    customers: int
    expected_matches: float
    specs: list[dict[str, Any]]  # subscribe_many's input
    filters: list[Filter]  # the same filters, normalised, for the naive loop
    warmup: list[Message]
    messages: list[Message]
    properties: list[dict[str, object]]  # the raw properties of ``messages``


def make_workload(n: int, n_messages: int, seed: int) -> Workload:
    """N subscriptions and the messages to publish, the same for every backend."""
    rng = random.Random(f"{seed}:subscriptions:{n}")
    broad = broad_subscriptions()[: max(0, n // 8)]  # tiny N stay mostly customer-anchored
    templates = [customer_template(rng) for _ in range(n - len(broad))]
    broad_p = sum(p for _, p in broad)
    customer_p = sum(p for _, p in templates)
    customers = max(1, round(customer_p / max(TARGET_MATCHES - broad_p, 0.1)))
    exprs = [e for e, _ in broad] + [t(customer_id(rng.randrange(customers))) for t, _ in templates]
    specs = [
        {"service": f"svc-{i % 997:03d}", "host": HOSTS[i % len(HOSTS)], "filter": e}
        for i, e in enumerate(exprs)
    ]
    filters = [to_filter(e) for e in exprs]

    mrng = random.Random(f"{seed}:messages:{n}")
    props = [make_properties(mrng, customers) for _ in range(BATCH + n_messages)]
    built = [
        Message(f'<order n="{i}" customer="{p["orders.Customer"]}"/>'.encode(), promoted=p)
        for i, p in enumerate(props)
    ]
    return Workload(
        n=n,
        customers=customers,
        expected_matches=broad_p + customer_p / customers,
        specs=specs,
        filters=filters,
        warmup=built[:BATCH],
        messages=built[BATCH:],
        properties=props[BATCH:],
    )


# --- the naive baseline ---


@dataclass(frozen=True)
class NaiveResult:
    sampled: int
    seconds: float
    matches: list[list[int]]  # per sampled message, the indexes of the matching filters

    @property
    def msgs_per_s(self) -> float:
        return self.sampled / self.seconds


def run_naive(work: Workload, budget_s: float) -> NaiveResult:
    """Every filter against every message, until ``budget_s`` is spent (or all are done)."""
    filters = work.filters
    matches: list[list[int]] = []
    start = time.perf_counter()
    elapsed = 0.0
    for props in work.properties:
        normal = normalize_properties(props)  # once per message, as a fair loop would
        matches.append([j for j, filt in enumerate(filters) if filter_matches(filt, normal)])
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s and len(matches) >= NAIVE_MIN_MESSAGES:
            break
    return NaiveResult(sampled=len(matches), seconds=elapsed, matches=matches)


# --- the backends ---


@contextmanager
def duckdb_url(n: int) -> Iterator[str]:
    """A fresh DuckDB file, removed afterwards."""
    folder = tempfile.mkdtemp(prefix=f"bench-route-{n}-")
    try:
        yield f"duckdb:///{os.path.join(folder, 'route.duckdb')}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def pg_check(base_url: str) -> str | None:
    """None when PostgreSQL answers, else why not."""
    engine = sa.create_engine(base_url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return None
    except Exception as exc:
        return str(exc).strip().splitlines()[0]
    finally:
        engine.dispose()


@contextmanager
def postgresql_url(base_url: str, n: int) -> Iterator[str]:
    """A fresh schema (``search_path`` set through the URL), dropped afterwards."""
    schema = f"bench_route_{os.getpid()}_{n}"
    admin = sa.create_engine(base_url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        url = sa.make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.dispose()


@contextmanager
def backend_url(backend: str, n: int, pg_url: str) -> Iterator[str]:
    if backend == "duckdb":
        with duckdb_url(n) as url:
            yield url
    else:
        with postgresql_url(pg_url, n) as url:
            yield url


@dataclass(frozen=True)
class RunResult:
    backend: str
    n: int
    subscribe_s: float
    messages: int
    publish_s: float
    batch_ms: list[float]
    avg_matches: float
    agree: tuple[int, int] | None  # (messages where SQL routing == naive, messages compared)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.publish_s


def _batches(messages: Sequence[Message]) -> Iterator[Sequence[Message]]:
    for start in range(0, len(messages), BATCH):
        yield messages[start : start + BATCH]


def prepare(url: str, work: Workload) -> tuple[MessageBox, float, dict[int, int]]:
    """Open the box, create hosts and subscriptions, publish the warm-up batch.

    Returns the box, how long ``subscribe_many`` took, and subscription id -> spec index.
    """
    box = MessageBox(url, publisher="bench.route")
    for host in HOSTS:
        box.create_host(host)
    start = time.perf_counter()
    made = box.subscribe_many(work.specs)
    subscribe_s = time.perf_counter() - start
    box.publish(work.warmup)
    return box, subscribe_s, {s.id: i for i, s in enumerate(made)}


def timed_publish(box: MessageBox, messages: Sequence[Message]) -> tuple[list[Routed], list[float]]:
    routed: list[Routed] = []
    batch_s: list[float] = []
    for batch in _batches(messages):
        start = time.perf_counter()
        routed.extend(box.publish(batch))
        batch_s.append(time.perf_counter() - start)
    return routed, batch_s


def log_disagreement(work: Workload, i: int, got: list[int], expected: list[int]) -> None:
    log(f"N={work.n:,}: message {i} routed differently from the naive loop")
    log(f"  properties: {work.properties[i]!r}")
    for label, extra in (
        ("routed only", set(got) - set(expected)),
        ("naive only", set(expected) - set(got)),
    ):
        for j in sorted(extra):
            log(f"  {label}: subscription #{j}: {work.filters[j]}")


def run_backend(backend: str, work: Workload, naive: NaiveResult | None, pg_url: str) -> RunResult:
    with backend_url(backend, work.n, pg_url) as url:
        box, subscribe_s, index_of = prepare(url, work)
        try:
            routed, batch_s = timed_publish(box, work.messages)
        finally:
            box.close()
    agree = None
    if naive is not None:
        same = 0
        for i, (r, expected) in enumerate(zip(routed, naive.matches, strict=False)):
            got = sorted(index_of[s] for s in r.subscriptions)
            if got == expected:
                same += 1
            elif i - same < 3:  # describe the first few disagreements
                log_disagreement(work, i, got, expected)
        agree = (same, naive.sampled)
    return RunResult(
        backend=backend,
        n=work.n,
        subscribe_s=subscribe_s,
        messages=len(routed),
        publish_s=sum(batch_s),
        batch_ms=[s * 1000 for s in batch_s],
        avg_matches=sum(len(r.subscriptions) for r in routed) / max(1, len(routed)),
        agree=agree,
    )


# --- output ---


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A plain-text table; the first ``left`` columns are left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if i < left or i == len(cells) - 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _ok(good: bool) -> str:
    return "ok" if good else "MISS"


def _targets(r: RunResult, naive: NaiveResult | None) -> str:
    if r.n != 10_000:
        return ""
    notes = []
    goal = TARGET_MSGS_AT_10K.get(r.backend)
    if goal is not None:
        notes.append(f">= {goal:,.0f} msgs/s {_ok(r.msgs_per_s >= goal)}")
    if naive is not None:
        ratio = r.msgs_per_s / naive.msgs_per_s
        notes.append(
            f">= {TARGET_VS_NAIVE_AT_10K:.0f}x naive {_ok(ratio >= TARGET_VS_NAIVE_AT_10K)}"
        )
    return "; ".join(notes)


def report(
    n_messages: int,
    works: dict[int, Workload],
    naives: dict[int, NaiveResult],
    results: list[RunResult],
    backends: Sequence[str],
) -> str:
    out = [
        "",
        f"Routing benchmark: {n_messages:,} messages per run, batches of {BATCH:,} "
        f"(one transaction each) after 1 warm-up batch; seed {SEED}",
        "",
        "Workload",
        _table(
            ["N", "customers", "expected matches/msg"],
            [[f"{w.n:,}", f"{w.customers:,}", f"{w.expected_matches:.2f}"] for w in works.values()],
            left=0,
        ),
        "",
        "Naive baseline: per message, normalise once, then the reference evaluator over "
        "every subscription's Filter",
        _table(
            ["N", "sampled msgs", "seconds", "msgs/s", "matches/msg"],
            [
                [
                    f"{n:,}",
                    f"{r.sampled:,}",
                    f"{r.seconds:.2f}",
                    f"{r.msgs_per_s:,.1f}" + (" (extrapolated)" if r.sampled < n_messages else ""),
                    f"{sum(map(len, r.matches)) / r.sampled:.2f}",
                ]
                for n, r in naives.items()
            ],
            left=0,
        ),
        "",
        "MessageBox.publish",
        _table(
            [
                "backend",
                "N",
                "subscribe s",
                "publish s",
                "msgs/s",
                "ms/batch p50",
                "ms/batch max",
                "matches/msg",
                "vs naive",
                "= naive",
                "targets (N=10,000)",
            ],
            [
                [
                    r.backend,
                    f"{r.n:,}",
                    f"{r.subscribe_s:.2f}",
                    f"{r.publish_s:.2f}",
                    f"{r.msgs_per_s:,.0f}",
                    f"{statistics.median(r.batch_ms):.1f}",
                    f"{max(r.batch_ms):.1f}",
                    f"{r.avg_matches:.2f}",
                    _times(r.msgs_per_s / naives[r.n].msgs_per_s) if r.n in naives else "-",
                    f"{r.agree[0]}/{r.agree[1]}" if r.agree else "-",
                    _targets(r, naives.get(r.n)),
                ]
                for r in results
            ],
        ),
        "",
        f"Scaling: throughput(N=100,000) / throughput(N=100), target >= {TARGET_SCALING}",
    ]
    rows = []
    for backend in backends:
        by_n = {r.n: r for r in results if r.backend == backend}
        if 100 in by_n and 100_000 in by_n:
            ratio = by_n[100_000].msgs_per_s / by_n[100].msgs_per_s
            rows.append([backend, f"{ratio:.2f}", _ok(ratio >= TARGET_SCALING)])
        else:
            rows.append([backend, "n/a", "(needs N=100 and N=100,000 in --sizes)"])
    out.append(_table(["backend", "ratio", ""], rows))
    return "\n".join(out)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- profile mode ---

PHASES = (
    ("MessageBox.publish (total)", "engine.py", "publish"),
    ("router.publish", "router.py", "publish"),
    ("router.route (stage + SQL)", "router.py", "route"),
    ("  router.stage (Python staging)", "router.py", "stage"),
    ("  dialect.route (Arrow + routing SQL)", "duckdb.py", "route"),
    ("ids.allocate", "ids.py", "allocate"),
    ("_Writes.enqueue (Python)", "router.py", "enqueue"),
    ("spool.write_messages (Python + inserts)", "spool.py", "write_messages"),
    ("_Writes.flush (queue/ref inserts)", "router.py", "flush"),
    ("dialect.insert (all bulk inserts)", "duckdb.py", "insert"),
)


def run_profile(n_messages: int, seed: int) -> None:
    n = 10_000
    log(f"profile: building the workload (N={n:,}, {n_messages:,} messages) ...")
    work = make_workload(n, n_messages, seed)
    with duckdb_url(n) as url:
        box, subscribe_s, _ = prepare(url, work)
        try:
            profiler = cProfile.Profile()
            profiler.enable()
            start = time.perf_counter()
            routed, _ = timed_publish(box, work.messages)
            elapsed = time.perf_counter() - start
            profiler.disable()
        finally:
            box.close()
    matches = sum(len(r.subscriptions) for r in routed) / len(routed)
    print(
        f"\nProfile: DuckDB, N={n:,}, {len(routed):,} messages in batches of {BATCH:,} "
        f"(subscribe {subscribe_s:.2f}s); {elapsed:.2f}s under cProfile = "
        f"{len(routed) / elapsed:,.0f} msgs/s, {matches:.2f} matches/msg\n"
    )
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    rows = []
    for label, file, func in PHASES:
        cum = sum(v[3] for (f, _, fn), v in raw.items() if f.endswith(file) and fn == func)
        calls = sum(v[1] for (f, _, fn), v in raw.items() if f.endswith(file) and fn == func)
        rows.append([label, f"{calls:,}", f"{cum:.2f}", f"{100 * cum / elapsed:.0f}%"])
    print("Phases (cumulative seconds, share of the profiled publish time)")
    print(_table(["phase", "calls", "cum s", "share"], rows))
    for title, key, count in (("cumulative", "cumulative", 25), ("tottime", "tottime", 15)):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(key).print_stats(count)
        body = buf.getvalue()
        body = body[body.find("   ncalls") :] if "   ncalls" in body else body
        print(f"\nTop {count} by {title}\n{body.rstrip()}")


# --- main ---


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

    works: dict[int, Workload] = {}
    naives: dict[int, NaiveResult] = {}
    results: list[RunResult] = []
    for n in args.sizes:
        start = time.perf_counter()
        work = make_workload(n, args.messages, args.seed)
        works[n] = work
        log(
            f"N={n:,}: workload built in {time.perf_counter() - start:.1f}s "
            f"({work.customers:,} customers, ~{work.expected_matches:.2f} matches/msg expected)"
        )
        naive = run_naive(work, NAIVE_BUDGET_S)
        naives[n] = naive
        log(f"N={n:,}: naive {naive.msgs_per_s:,.1f} msgs/s over {naive.sampled:,} messages")
        for backend in backends:
            result = run_backend(backend, work, naive, args.pg_url)
            results.append(result)
            log(
                f"N={n:,}: {backend}: subscribe {result.subscribe_s:.2f}s, "
                f"{result.msgs_per_s:,.0f} msgs/s, {result.avg_matches:.2f} matches/msg"
            )

    print(report(args.messages, works, naives, results, backends))
    for note in notes:
        print(f"\nNote: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
