"""The printed report of ``bench.route``: workload, naive baseline, publish and scaling
tables, with the targets.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.route_runs import NaiveResult, RunResult
from bench.route_workload import BATCH, SEED, Workload

TARGET_OF_MINIMAL = {"duckdb": 0.6, "postgresql": 0.5}
"""publish+route as a fraction of the minimal write limit (the same rows into tables with
only their primary keys) measured in the same run, at N=10,000."""
TARGET_VS_NAIVE_AT_10K = 100.0
TARGET_SCALING = 0.8
TARGET_SINGLE_VS_RAW = 3.0


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
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
    goal = TARGET_OF_MINIMAL.get(r.backend)
    if goal is not None and r.limit is not None:
        share = r.msgs_per_s / r.limit.minimal_msgs_per_s
        notes.append(f">= {goal:.1f} of minimal {_ok(share >= goal)}")
    if naive is not None:
        ratio = r.msgs_per_s / naive.msgs_per_s
        notes.append(
            f">= {TARGET_VS_NAIVE_AT_10K:.0f}x naive {_ok(ratio >= TARGET_VS_NAIVE_AT_10K)}"
        )
    return "; ".join(notes)


def _publish_table(results: list[RunResult], naives: dict[tuple[str, int], NaiveResult]) -> str:
    """The ``MessageBox.publish`` table: a row per workload, backend and N."""
    rows = []
    for r in results:
        naive = naives.get((r.workload, r.n))
        limit = r.limit
        rows.append(
            [
                r.workload,
                r.backend,
                f"{r.n:,}",
                f"{r.subscribe_s:.2f}",
                f"{r.msgs_per_s:,.0f}",
                f"{limit.msgs_per_s:,.0f}" if limit else "-",
                f"{r.msgs_per_s / limit.msgs_per_s:.2f}" if limit else "-",
                f"{limit.minimal_msgs_per_s:,.0f}" if limit else "-",
                f"{r.msgs_per_s / limit.minimal_msgs_per_s:.2f}" if limit else "-",
                f"{statistics.median(r.batch_ms):.1f}",
                f"{max(r.batch_ms):.1f}",
                f"{r.avg_matches:.2f}",
                _times(r.msgs_per_s / naive.msgs_per_s) if naive else "-",
                f"{r.agree[0]}/{r.agree[1]}" if r.agree else "-",
                _targets(r, naive),
            ]
        )
    return table(
        [
            "workload",
            "backend",
            "N",
            "subscribe s",
            "msgs/s",
            "limit msgs/s",
            "of limit",
            "minimal msgs/s",
            "of minimal",
            "ms/batch p50",
            "ms/batch max",
            "matches/msg",
            "vs naive",
            "= naive",
            "targets (N=10,000)",
        ],
        rows,
        left=2,
    )


def _single_table(results: list[RunResult]) -> str:
    """Single-message publish beside a raw insert of the same rows."""
    rows = []
    for r in results:
        if r.limit is None or r.workload != "orders" or r.n != 10_000:
            continue
        lim = r.limit
        ratio = lim.publish_p50 / lim.raw_p50
        rows.append(
            [
                r.backend,
                f"{lim.publish_p50:.2f}",
                f"{lim.publish_p99:.2f}",
                f"{lim.raw_p50:.2f}",
                f"{ratio:.1f}x",
                f"<= {TARGET_SINGLE_VS_RAW:.0f}x raw {_ok(ratio <= TARGET_SINGLE_VS_RAW)}",
            ]
        )
    if not rows:
        return "(needs the orders workload at N=10,000)"
    return table(["backend", "publish p50 ms", "p99 ms", "raw p50 ms", "ratio", "target"], rows)


def report(
    n_messages: int,
    works: dict[tuple[str, int], Workload],
    naives: dict[tuple[str, int], NaiveResult],
    results: list[RunResult],
    backends: Sequence[str],
) -> str:
    out = [
        "",
        f"Routing benchmark: {n_messages:,} messages per run, batches of {BATCH:,} "
        f"(one transaction each) after 1 warm-up batch; seed {SEED}",
        "",
        "Workloads",
        table(
            ["workload", "N", "customers", "expected matches/msg"],
            [
                [w.name, f"{w.n:,}", f"{w.customers:,}", f"{w.expected_matches:.2f}"]
                for w in works.values()
            ],
        ),
        "",
        "Naive baseline: per message, normalise once, then the reference evaluator over "
        "every subscription's Filter",
        table(
            ["workload", "N", "sampled msgs", "seconds", "msgs/s", "matches/msg"],
            [
                [
                    name,
                    f"{n:,}",
                    f"{r.sampled:,}",
                    f"{r.seconds:.2f}",
                    f"{r.msgs_per_s:,.1f}" + (" (extrapolated)" if r.sampled < n_messages else ""),
                    f"{sum(map(len, r.matches)) / r.sampled:.2f}",
                ]
                for (name, n), r in naives.items()
            ],
        ),
        "",
        "MessageBox.publish beside the write limit (the same rows written with no routing, "
        "same run, fresh database)",
        _publish_table(results, naives),
        "",
        "Single-message publish (one message a transaction, 200 of them) beside a raw insert "
        "of the same rows",
        _single_table(results),
        "",
        f"Scaling (orders): throughput(N=100,000) / throughput(N=100), target >= {TARGET_SCALING}",
        "alternating: batches of the two sizes alternate in one process (the target); "
        "separate: the two sizes' own runs, minutes apart",
    ]
    out.append(_scaling_table(results, backends))
    return "\n".join(out)


def _scaling_table(results: list[RunResult], backends: Sequence[str]) -> str:
    rows = []
    for backend in backends:
        by_n = {r.n: r for r in results if r.backend == backend and r.workload == "orders"}
        large, small = by_n.get(100_000), by_n.get(100)
        paired = large.paired if large is not None else None
        if large is None or paired is None:
            rows.append([backend, "-", "-", "n/a", "-", "(needs N=100 and N=100,000 in --sizes)"])
            continue
        ratio = large.msgs_per_s / paired.msgs_per_s
        rows.append(
            [
                backend,
                f"{paired.msgs_per_s:,.0f}",
                f"{large.msgs_per_s:,.0f}",
                f"{ratio:.2f}",
                f"{large.msgs_per_s / small.msgs_per_s:.2f}" if small is not None else "-",
                _ok(ratio >= TARGET_SCALING),
            ]
        )
    return table(
        [
            "backend",
            "N=100 msgs/s",
            "N=100,000 msgs/s",
            "alternating ratio",
            "separate ratio",
            "target",
        ],
        rows,
    )
