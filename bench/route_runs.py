"""The runs of ``bench.route``: the naive loop (the baseline) and ``MessageBox.publish``
on a fresh DuckDB file or PostgreSQL schema, its routes checked against the loop's.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from bench.route_limit import Kept, Limit, LimitRun, timed_singles
from bench.route_workload import BATCH, HOSTS, Workload
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.predicates import filter_matches, normalize_properties

NAIVE_MIN_MESSAGES = 3

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
    schema = f"bench_route_{os.getpid()}_{n}_{uuid.uuid4().hex[:6]}"
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
class Paired:
    """Another store (another N) published to in the same process, a batch of it after
    each batch of the run's own, so that the machine's drift falls on both alike."""

    n: int
    messages: int
    publish_s: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.publish_s


@dataclass(frozen=True)
class RunResult:
    backend: str
    workload: str
    n: int
    subscribe_s: float
    messages: int
    publish_s: float
    batch_ms: list[float]
    avg_matches: float
    agree: tuple[int, int] | None  # (messages where SQL routing == naive, messages compared)
    limit: Limit | None  # the write limit and single-message figures, same run
    paired: Paired | None = None  # a smaller store's batches, alternating with these

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.publish_s


def _batches(messages: Sequence[Message]) -> Iterator[Sequence[Message]]:
    for start in range(0, len(messages), BATCH):
        yield messages[start : start + BATCH]


THROTTLE_DEPTH = 100_000_000


def prepare(url: str, work: Workload) -> tuple[MessageBox, float, dict[int, int]]:
    """Open the box, create hosts and subscriptions, publish the warm-up batch.

    Returns the box, how long ``subscribe_many`` took, and subscription id -> spec index.
    """
    box = MessageBox(url, publisher="bench.route")
    for host in HOSTS:
        # nothing consumes here: a high fan-out would otherwise be throttled (a host's
        # default limit is 100,000 waiting entries; fanout30 queues ~5 a message on one)
        box.create_host(host, throttle_queue_depth=THROTTLE_DEPTH)
    start = time.perf_counter()
    made = box.subscribe_many(work.specs)
    subscribe_s = time.perf_counter() - start
    checkpoint(box)
    box.publish(work.warmup)
    # the set-up's objects (N subscriptions, the warm-up) promoted since the last full
    # collection made the next one fall inside the timed run: a pass over the whole heap,
    # most of it the bench's own workload (~190 ms at N=10,000); paid here, as the
    # database's checkpoint is
    gc.collect()
    return box, subscribe_s, {s.id: i for i, s in enumerate(made)}


def checkpoint(box: MessageBox) -> None:
    """Flush the set-up's writes (N subscriptions) before the clock starts, so that the
    publish run pays for its own writes only: at N=100,000 a checkpoint of the set-up
    fell inside PostgreSQL's run (a 1.6 s batch). Skipped where not permitted."""
    try:
        with box.store.engine.connect() as conn:
            conn.exec_driver_sql("CHECKPOINT")
            conn.commit()
    except sa.exc.DBAPIError as exc:
        log(f"CHECKPOINT before the run skipped: {exc.orig}")


def timed_publish(
    box: MessageBox,
    messages: Sequence[Message],
    partner: tuple[MessageBox, Sequence[Message]] | None = None,
    limit: LimitRun | None = None,
) -> tuple[list[Kept], list[float], list[float]]:
    """Publish ``messages`` in batches, timing each; with a ``partner`` (another box and
    its messages), publish one of its batches after each of ours, timed apart; with a
    ``limit``, write each batch's rows there too, right after it (timed by the limit).
    The results are kept as :data:`Kept`, turned so outside the clock."""
    routed: list[Kept] = []
    batch_s: list[float] = []
    partner_s: list[float] = []
    theirs = iter(_batches(partner[1])) if partner is not None else iter(())
    for batch in _batches(messages):
        start = time.perf_counter()
        results = box.publish(batch)
        batch_s.append(time.perf_counter() - start)
        kept = [(r.outcome.value, r.subscriptions) for r in results]
        del results
        routed.extend(kept)
        if limit is not None:
            limit.write(batch, kept)
        other = next(theirs, None)
        if partner is not None and other is not None:
            start = time.perf_counter()
            partner[0].publish(other)
            partner_s.append(time.perf_counter() - start)
    return routed, batch_s, partner_s


def log_disagreement(work: Workload, i: int, got: list[int], expected: list[int]) -> None:
    log(f"N={work.n:,}: message {i} routed differently from the naive loop")
    log(f"  properties: {work.properties[i]!r}")
    for label, extra in (
        ("routed only", set(got) - set(expected)),
        ("naive only", set(expected) - set(got)),
    ):
        for j in sorted(extra):
            log(f"  {label}: subscription #{j}: {work.filters[j]}")


def run_backend(
    backend: str,
    work: Workload,
    naive: NaiveResult | None,
    pg_url: str,
    *,
    limit: bool = True,
    partner: Workload | None = None,
) -> RunResult:
    """Publish ``work`` on a fresh store; with a ``partner`` workload, alternate its
    batches (on a second fresh store) with ours."""
    partner_s: list[float] = []
    with ExitStack() as stack:
        url = stack.enter_context(backend_url(backend, work.n, pg_url))
        box, subscribe_s, index_of = prepare(url, work)
        stack.callback(box.close)
        other = None
        if partner is not None:
            other_url = stack.enter_context(backend_url(backend, partner.n, pg_url))
            other = prepare(other_url, partner)[0]
            stack.callback(other.close)
        beside = None
        if limit:
            beside = LimitRun(stack.enter_context(backend_url(backend, work.n, pg_url)), work)
            stack.callback(beside.close)
        routed, batch_s, partner_s = timed_publish(
            box, work.messages, (other, partner.messages) if other and partner else None, beside
        )
        measured = None
        if beside is not None:
            measured = beside.result(routed, timed_singles(box, work.messages))
    agree = None
    if naive is not None:
        same = 0
        for i, ((_, subs), expected) in enumerate(zip(routed, naive.matches, strict=False)):
            got = sorted(index_of[s] for s in subs)
            if got == expected:
                same += 1
            elif i - same < 3:  # describe the first few disagreements
                log_disagreement(work, i, got, expected)
        agree = (same, naive.sampled)
    return RunResult(
        backend=backend,
        workload=work.name,
        n=work.n,
        subscribe_s=subscribe_s,
        messages=len(routed),
        publish_s=sum(batch_s),
        batch_ms=[s * 1000 for s in batch_s],
        avg_matches=sum(len(subs) for _, subs in routed) / max(1, len(routed)),
        agree=agree,
        limit=measured,
        paired=(
            Paired(partner.n, len(partner_s) * BATCH, sum(partner_s))
            if partner is not None and partner_s
            else None
        ),
    )


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
