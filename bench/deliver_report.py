"""The printed report of ``bench.deliver``: the header, throughput and latency tables."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from importlib import metadata

import duckdb

from bench.deliver_common import LATENCY_BATCH, PUBLISH_BATCH, SYSTEMS
from bench.deliver_latency import Latency, pct
from bench.deliver_pgqueuer import pgqueuer_version
from bench.deliver_stores import Env
from bench.deliver_throughput import Case, Measured


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A plain-text table; the first ``left`` columns are left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _rate(r: Measured | None) -> str:
    if r is None:
        return "-"
    return f"{r.msgs_per_s:,.0f}" + ("*" if r.capped else "")


def _ratio(a: Measured | None, b: Measured | None) -> str:
    if a is None or b is None or b.msgs_per_s == 0:
        return "-"
    return f"{a.msgs_per_s / b.msgs_per_s:.2f}x"


def throughput_table(backend: str, results: dict[Case, Measured]) -> str:
    """One row per consumer shape; a column per system that ran, then the ratios."""
    mine = {c: r for c, r in results.items() if c.backend == backend}
    shapes = sorted(
        {(c.mode, c.workers, c.batch) for c in mine},
        key=lambda s: (s[0] != "threads", s[1], s[2]),
    )
    ran = [s for s in SYSTEMS if any(c.system == s for c in mine)]
    short = {"raw": "raw", "pgqueuer": "PgQ", "messagebox": "mb"}
    ratios = (("pgqueuer", "raw"), ("messagebox", "raw"), ("messagebox", "pgqueuer"))
    pairs = [(a, b) for a, b in ratios if a in ran and b in ran]
    headers = ["mode", "workers", "batch", *(system_name(backend, s) for s in ran)]
    headers += [f"{short[a]}/{short[b]}" for a, b in pairs]
    rows = []
    for mode, k, batch in shapes:
        got = {s: mine.get(Case(backend, s, mode, k, batch)) for s in ran}
        row = [mode, str(k), str(batch), *(_rate(got[s]) for s in ran)]
        row += [_ratio(got[a], got[b]) for a, b in pairs]
        rows.append(row)
    return _table(headers, rows, left=1)


def system_name(backend: str, system: str) -> str:
    """The column/row label of a system on a backend."""
    if system == "raw":
        return "raw SKIP LOCKED" if backend == "postgresql" else "raw DELETE loop"
    return "PgQueuer" if system == "pgqueuer" else system


def latency_table(results: Sequence[Latency]) -> str:
    """One row per latency run, in milliseconds."""
    rows = []
    for r in results:
        ms = [1000 * s for s in r.sample.seconds]
        call_ms = [1000 * s for s in r.sample.calls]
        produce_s = r.sample.produce_s
        rows.append(
            [
                r.backend,
                system_name(r.backend, r.system),
                r.consumer,
                f"{len(ms)}/{r.sent}",
                f"{r.sent / produce_s:,.0f}" if produce_s > 0 else "-",
                f"{pct(call_ms, 0.5):.1f}" if call_ms else "-",
                f"{pct(ms, 0.5):.1f}" if ms else "-",
                f"{pct(ms, 0.99):.1f}" if ms else "-",
                f"{max(ms):.1f}" if ms else "-",
                f"{statistics.fmean(ms):.1f}" if ms else "-",
            ]
        )
    headers = ["backend", "system", "consumer", "delivered", "sent/s", "publish ms p50"]
    headers += ["p50 ms", "p99 ms", "max ms", "mean ms"]
    return _table(headers, rows, left=3)


DEQUEUE_VS_RAW = 0.5
"""Target: PostgreSQL delivery at batch 100 (threads) >= this of raw SKIP LOCKED."""
LATENCY_P50_VS_RAW = 3.0
"""Target: DuckDB publish -> handler p50 <= this times the raw loop's..."""
LATENCY_P99_MS = 25.0
"""...p99 at most this..."""
PUBLISH_VS_INSERT = 3.0
"""...and the publish call's p50 <= this times the raw insert's (issue 60)."""


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def targets(results: dict[Case, Measured], latencies: Sequence[Latency]) -> list[str]:
    """Each target this run can judge, with its figure and its baseline's."""
    out: list[str] = []
    for case, mb in sorted(results.items(), key=lambda kv: str(kv[0])):
        if (case.backend, case.system, case.mode, case.batch) != (
            "postgresql",
            "messagebox",
            "threads",
            100,
        ):
            continue
        raw = results.get(Case(case.backend, "raw", case.mode, case.workers, case.batch))
        if raw is None or raw.msgs_per_s == 0:
            continue
        ratio = mb.msgs_per_s / raw.msgs_per_s
        out.append(
            f"postgresql delivery, {case.workers} threads, batch 100: {ratio:.2f} of raw SKIP "
            f"LOCKED (>= {DEQUEUE_VS_RAW:g}) {_verdict(ratio >= DEQUEUE_VS_RAW)}"
        )
    by = {(r.backend, r.system, r.consumer): r for r in latencies}
    raw_l = next((r for r in latencies if r.backend == "duckdb" and r.system == "raw"), None)
    mb_l = by.get(("duckdb", "messagebox", "1 thread"))
    if raw_l is not None and mb_l is not None and raw_l.sample.seconds and mb_l.sample.seconds:
        p50 = pct(mb_l.sample.seconds, 0.5) / pct(raw_l.sample.seconds, 0.5)
        p99 = 1000 * pct(mb_l.sample.seconds, 0.99)
        call = pct(mb_l.sample.calls, 0.5) / pct(raw_l.sample.calls, 0.5)
        out += [
            f"duckdb publish -> handler p50: {p50:.1f}x the raw loop's (<= "
            f"{LATENCY_P50_VS_RAW:g}x) {_verdict(p50 <= LATENCY_P50_VS_RAW)}",
            f"duckdb publish -> handler p99: {p99:.1f} ms (<= {LATENCY_P99_MS:g} ms) "
            f"{_verdict(p99 <= LATENCY_P99_MS)}",
            f"duckdb publish call with a host running, p50: {call:.1f}x a raw insert's (<= "
            f"{PUBLISH_VS_INSERT:g}x) {_verdict(call <= PUBLISH_VS_INSERT)}",
        ]
    return out


def header(env: Env) -> list[str]:
    """What ran where: sizes, versions, the PostgreSQL durability settings."""
    a = env.args
    versions = [
        f"messagebox {metadata.version('messagebox-router')}",
        f"DuckDB {duckdb.__version__}",
    ]
    if "pgqueuer" in a.systems and pgqueuer_version():
        driver = a.pgq_driver
        versions.append(
            f"PgQueuer {pgqueuer_version()} ({driver} {metadata.version(driver)} driver)"
        )
    lines = [
        "",
        f"Delivery benchmark: {a.messages:,} messages per throughput run (published in batches "
        f"of {PUBLISH_BATCH:,} before the clock starts), each run stopped after {a.cap:g} s; "
        "do-nothing handlers",
        f"{'; '.join(versions)}; {os.cpu_count()} CPUs",
    ]
    if env.pg is not None:
        pg = env.pg
        lines.append(
            f"PostgreSQL {pg.setting('server_version').split()[0]} (fsync {pg.setting('fsync')}, "
            f"synchronous_commit {pg.setting('synchronous_commit')}), schema {pg.schema}"
        )
    return lines


def report(
    env: Env,
    backends: Sequence[str],
    results: dict[Case, Measured],
    latencies: Sequence[Latency],
) -> str:
    """The whole printed report."""
    a = env.args
    out = header(env)
    titles = {
        "postgresql": "PostgreSQL throughput, msgs/s (PgQueuer threads = queue managers on one "
        "asyncio loop; processes = 1 thread / 1 queue manager each)",
        "duckdb": "DuckDB throughput, msgs/s (raw = the same DELETE ... RETURNING loop under "
        "an in-process lock)",
    }
    for backend in backends:
        if any(c.backend == backend for c in results):
            out += ["", titles[backend], throughput_table(backend, results)]
    if results:
        out.append(f"* stopped at the {a.cap:g} s cap before the backlog was drained")
    if latencies:
        out += [
            "",
            f"Latency publish -> handler start, one message per publish at {a.rate:g}/s for "
            f"{a.latency_seconds:g} s, idle consumer, claim batch {LATENCY_BATCH} (publish ms: "
            "the publish/enqueue/insert call alone, which the latency includes)",
            latency_table(latencies),
        ]
    judged = targets(results, latencies)
    if judged:
        out += ["", "Targets (issue 60)", *judged]
    return "\n".join(out)
