"""``bench.deliver`` judges issue 60's delivery targets from the run's own figures: each
against its baseline in the same run, ok at the bound and MISS past it."""

from __future__ import annotations

from bench.deliver_latency import Latency, Sample
from bench.deliver_report import targets
from bench.deliver_throughput import Case, Measured


def _latency(system: str, consumer: str, call_ms: float, ms: list[float]) -> Latency:
    sample = Sample(1.0, [call_ms / 1000] * len(ms), [m / 1000 for m in ms])
    return Latency("duckdb", system, consumer, len(ms), sample)


def test_each_target_is_judged_against_its_baseline_in_the_same_run() -> None:
    results = {
        Case("postgresql", "raw", "threads", 2, 100): Measured(1000, 1.0, False),
        Case("postgresql", "messagebox", "threads", 2, 100): Measured(500, 1.0, False),
        Case("postgresql", "raw", "threads", 4, 100): Measured(1000, 1.0, False),
        Case("postgresql", "messagebox", "threads", 4, 100): Measured(450, 1.0, False),
        Case("postgresql", "messagebox", "threads", 4, 1): Measured(1, 1.0, False),  # not judged
    }
    latencies = [
        _latency("raw", "1 thread, 1 ms poll", 1.0, [2.0] * 99 + [10.0]),
        _latency("messagebox", "1 thread", 3.5, [6.0] * 98 + [25.0, 26.0]),
    ]
    assert targets(results, latencies) == [
        "postgresql delivery, 2 threads, batch 100: 0.50 of raw SKIP LOCKED (>= 0.5) ok",
        "postgresql delivery, 4 threads, batch 100: 0.45 of raw SKIP LOCKED (>= 0.5) MISS",
        "duckdb publish -> handler p50: 3.0x the raw loop's (<= 3x) ok",
        "duckdb publish -> handler p99: 25.0 ms (<= 25 ms) ok",
        "duckdb publish call with a host running, p50: 3.5x a raw insert's (<= 3x) MISS",
    ]


def test_nothing_is_judged_without_its_baseline() -> None:
    only_mb = {Case("postgresql", "messagebox", "threads", 2, 100): Measured(5, 1.0, False)}
    assert targets(only_mb, [_latency("messagebox", "1 thread", 1.0, [1.0])]) == []
