"""``python -m bench.route --profile``: cProfile of DuckDB publish at N=10,000, summed
by phase, then the top functions.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any

from bench.route_report import table
from bench.route_runs import duckdb_url, log, prepare, timed_publish
from bench.route_workload import BATCH, make_workload

PHASES = (
    ("MessageBox.publish (total)", "engine.py", "publish"),
    ("router.publish", "router.py", "publish"),
    ("router.route (match + convoys)", "router.py", "route"),
    ("  RoutingIndex.route (catch up + match)", "routing_index.py", "route"),
    ("  FilterIndex.match (per message)", "index.py", "match"),
    ("ids.allocate", "ids.py", "allocate"),
    ("Writes.enqueue (Python)", "writes.py", "enqueue"),
    ("spool.write_messages (Python + inserts)", "spool.py", "write_messages"),
    ("Writes.flush (queue/ref inserts)", "writes.py", "flush"),
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
            routed, _, _ = timed_publish(box, work.messages)
            elapsed = time.perf_counter() - start
            profiler.disable()
        finally:
            box.close()
    matches = sum(len(subs) for _, subs in routed) / len(routed)
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
    print(table(["phase", "calls", "cum s", "share"], rows))
    for title, key, count in (("cumulative", "cumulative", 25), ("tottime", "tottime", 15)):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(key).print_stats(count)
        body = buf.getvalue()
        body = body[body.find("   ncalls") :] if "   ncalls" in body else body
        print(f"\nTop {count} by {title}\n{body.rstrip()}")
