"""The printed report of ``bench.route``: workload, naive baseline, publish and scaling
tables, with the targets.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.route_runs import NaiveResult, RunResult
from bench.route_workload import BATCH, SEED, Workload

TARGET_MSGS_AT_10K = {"duckdb": 20_000.0, "postgresql": 10_000.0}
TARGET_VS_NAIVE_AT_10K = 100.0
TARGET_SCALING = 0.5


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
    goal = TARGET_MSGS_AT_10K.get(r.backend)
    if goal is not None:
        notes.append(f">= {goal:,.0f} msgs/s {_ok(r.msgs_per_s >= goal)}")
    if naive is not None:
        ratio = r.msgs_per_s / naive.msgs_per_s
        notes.append(
            f">= {TARGET_VS_NAIVE_AT_10K:.0f}x naive {_ok(ratio >= TARGET_VS_NAIVE_AT_10K)}"
        )
    return "; ".join(notes)


def _publish_table(results: list[RunResult], naives: dict[int, NaiveResult]) -> str:
    """The ``MessageBox.publish`` table: a row per backend and N."""
    return table(
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
    )


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
        table(
            ["N", "customers", "expected matches/msg"],
            [[f"{w.n:,}", f"{w.customers:,}", f"{w.expected_matches:.2f}"] for w in works.values()],
            left=0,
        ),
        "",
        "Naive baseline: per message, normalise once, then the reference evaluator over "
        "every subscription's Filter",
        table(
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
        _publish_table(results, naives),
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
    out.append(table(["backend", "ratio", ""], rows))
    return "\n".join(out)
