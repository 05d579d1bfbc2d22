"""Batch routing on Spark: the DataFrame router beside a Python UDF and DuckDB's SQL router.

What it measures
    For each message count M (default 1M and 10M) and 10,000 subscriptions, on
    ``local[2]``: the messages are generated in Spark (seeded hashes of the row number,
    the distributions of ``bench/route_workload.py``, about 10 matches per message) and
    written to Parquet once; every router then reads the same rows.

    - **Spark**: ``route_dataframe`` (wide layout, ``validate=False``: the duplicate-key
      pass is timed on its own) over all M rows, forced with a ``noop`` write, after an
      untimed warm-up on the first 200,000.
    - **Python UDF** (the baseline): a row-at-a-time ``@udf`` that runs the reference
      evaluator for every subscription on the row's properties; timed on a sample (the
      first ``--udf-sample`` keys) and reported as msgs/s (extrapolated).
    - **DuckDB**: the SQL router (``messagebox.routing.router.route``, the statement ``publish``
      runs) on a DuckDB store holding the same subscriptions, in batches of 1,000 staged
      messages, on the first ``--duckdb-sample`` keys (routing only, nothing stored).

    - **Cluster** (``--cluster``): after the rows above, the same messages (the same
      Parquet files) routed the same way on a Spark standalone cluster started here, a
      master and two workers of one core each
      (:class:`~messagebox.pipelines.spark_standalone.StandaloneCluster`), against
      ``local[2]``'s two cores in one JVM: what the network between executors costs.

    The pairs of the sampled keys are compared across the routers (and the cluster's
    pair counts with ``local[2]``'s); any difference is printed and the run exits 1.

Target: Spark >= 20x the Python UDF.

Run it from the project root::

    python -m bench.spark_route                      # 1M and 10M messages
    python -m bench.spark_route --quick              # 200k messages, 2,000 subscriptions
    python -m bench.spark_route --messages 1000000 --udf-sample 1000
    python -m bench.spark_route --messages 1000000 --cluster   # and on a cluster
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.route_workload import (
    CHANNELS,
    PLACED_SPAN_S,
    PLACED_START,
    QTY_MAX,
    REGIONS,
    SKUS,
    TOTAL_MAX,
    make_workload,
    quiet_lint,
)
from messagebox import MessageBox
from messagebox.pipelines.spark import Target, route_dataframe, session
from messagebox.pipelines.spark_standalone import StandaloneCluster
from messagebox.predicates import filter_matches, normalize_properties
from messagebox.routing import router

SEED = 20_240_601
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WARMUP = 200_000  # messages routed, untimed, before the timed run (JIT)
TARGET_VS_UDF = 20.0


def log(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def generate(spark: Any, n: int, customers: int, seed: int, path: Path) -> float:
    """Write ``n`` messages (wide: key + ``orders.*``) as Parquet; returns the seconds."""
    from pyspark.sql import functions as F

    def u(salt: int, mod: int) -> Any:  # a seeded uniform int in [0, mod)
        return F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit(salt)), F.lit(mod))

    def pick(salt: int, values: Sequence[str]) -> Any:
        return F.element_at(
            F.array(*[F.lit(v) for v in values]), (u(salt, len(values)) + 1).cast("int")
        )

    start = time.perf_counter()
    df = spark.range(n).select(
        F.col("id").alias("key"),
        pick(1, REGIONS).alias("orders.Region"),
        F.concat(F.lit("C"), F.lpad(u(2, customers).cast("string"), 7, "0")).alias(
            "orders.Customer"
        ),
        (u(3, int(TOTAL_MAX * 100)) / 100.0).alias("orders.Total"),
        (u(4, QTY_MAX) + 1).alias("orders.Qty"),
        u(5, 10).alias("orders.Priority"),
        F.timestamp_seconds(F.lit(int(PLACED_START.timestamp())) + u(6, PLACED_SPAN_S)).alias(
            "orders.Placed"
        ),
        pick(7, CHANNELS).alias("orders.Channel"),
        u(8, 256).alias("orders.Flags"),
        F.concat(F.lit("SKU-"), F.lpad(u(9, SKUS).cast("string"), 5, "0")).alias("orders.Sku"),
        F.when(u(10, 10) < 5, u(11, 5) == 0).alias("orders.Rush"),
    )
    df.write.mode("overwrite").parquet(str(path))
    return time.perf_counter() - start


def spark_pairs(spark: Any, routes: Any, below: int) -> set[tuple[int, int]]:
    from pyspark.sql import functions as F

    rows = routes.where(F.col("key") < below).select("key", "subscription").collect()
    return {(r[0], r[1]) for r in rows}


PLACED = "orders.Placed"  # the timestamp column: leaves the JVM as micros (PySpark
# would hand over a naive local datetime)


def as_python(df: Any) -> Any:
    """``df`` with the timestamp column as epoch microseconds."""
    from pyspark.sql import functions as F

    from messagebox.pipelines.spark import column

    return df.withColumn(PLACED, F.unix_micros(column(PLACED)))


def properties(values: dict[str, Any]) -> dict[str, object]:
    """A row's promoted properties (the micros turned back into an aware datetime)."""
    out = {k: v for k, v in values.items() if k != "key" and v is not None}
    if PLACED in out:
        out[PLACED] = EPOCH + timedelta(microseconds=out[PLACED])
    return out


def timed_udf(spark: Any, df: Any, targets: list[Target], sample: int) -> tuple[float, set[Any]]:
    """The row-at-a-time Python UDF over the first ``sample`` keys: msgs/s and pairs."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    filters = [(t.id, t.filter) for t in targets]
    names = [c for c in df.columns if c != "key"]

    @F.udf(T.ArrayType(T.LongType()))
    def route_row(*values: Any) -> list[int]:
        props = normalize_properties(properties(dict(zip(names, values, strict=True))))
        return [sid for sid, f in filters if filter_matches(f, props)]

    from messagebox.pipelines.spark import column

    part = as_python(df).where(F.col("key") < sample)
    out = part.select("key", F.explode(route_row(*[column(n) for n in names])).alias("sub"))
    start = time.perf_counter()
    rows = out.collect()
    seconds = time.perf_counter() - start
    return sample / seconds, {(r[0], r[1]) for r in rows}


def timed_duckdb(
    spark: Any, df: Any, work: Any, sample: int, store: Path
) -> tuple[float, set[tuple[int, int]], list[Target]]:
    """The SQL router on a fresh DuckDB store (the file ``store``) with the same
    subscriptions: msgs/s and pairs."""
    from pyspark.sql import functions as F

    box = MessageBox(f"duckdb:///{store}")
    try:
        for host in sorted({s["host"] for s in work.specs}):
            box.create_host(host)
        made = box.subscribe_many(work.specs)
        targets = [Target.of(s) for s in made]
        rows = as_python(df).where(F.col("key") < sample).orderBy("key").collect()
        keys = [r["key"] for r in rows]
        promoted = [normalize_properties(properties(r.asDict())) for r in rows]
        pairs: set[tuple[int, int]] = set()
        start = time.perf_counter()
        for i in range(0, len(promoted), 1000):
            with box.store.transaction() as conn:
                found = router.route(conn, box.store.dialect, promoted[i : i + 1000])
            for k, matches in zip(keys[i : i + 1000], found, strict=True):
                pairs.update((k, m.sub) for m in matches)
        seconds = time.perf_counter() - start
        return len(promoted) / seconds, pairs, targets
    finally:
        box.close()


@dataclass
class Row:
    messages: int
    spark: float
    validate_s: float
    matches: float
    udf: float
    duckdb: float
    agree: bool
    cluster: float | None = None
    """msgs/s on the standalone cluster (``--cluster``)."""


@dataclass
class Routed:
    """What the cluster run reuses of a message count's local run."""

    messages: int
    path: Path
    targets: list[Target]
    pairs: int
    below: int
    sample: set[tuple[int, int]]
    """local[2]'s pairs of the keys under ``below``."""


def timed_route(df: Any, targets: list[Target]) -> float:
    """Seconds to route every row (forced with a ``noop`` write), after an untimed
    warm-up on the first :data:`WARMUP` keys (JIT)."""
    from pyspark.sql import functions as F

    warm = route_dataframe(df.where(F.col("key") < WARMUP), targets, validate=False)
    warm.write.format("noop").mode("overwrite").save()
    routes = route_dataframe(df, targets, validate=False)
    start = time.perf_counter()
    routes.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def route_locally(spark: Any, args: argparse.Namespace, n: int, tmp: Path) -> tuple[Row, Routed]:
    """One message count on the session's master: every router, timed and compared."""
    print(f"M = {n:,} messages, N = {args.subscriptions:,} subscriptions", file=sys.stderr)
    work = make_workload(args.subscriptions, 0, args.seed)
    path = tmp / f"messages-{n}"
    made = generate(spark, n, work.customers, args.seed, path)
    log(f"generating the messages in Spark: {made:.1f} s")
    df = spark.read.parquet(str(path))
    ddb, ddb_pairs, targets = timed_duckdb(
        spark, df, work, args.duckdb_sample, tmp / f"bench-{n}.duckdb"
    )
    log(f"DuckDB SQL router on {args.duckdb_sample:,}: {ddb:,.0f} msgs/s")
    spark_s = timed_route(df, targets)
    log(f"Spark router: {spark_s:.1f} s, {n / spark_s:,.0f} msgs/s")
    start = time.perf_counter()
    route_dataframe(df, targets, validate=True)  # the duplicate-key pass runs eagerly
    validate_s = time.perf_counter() - start
    routes = route_dataframe(df, targets, validate=False)
    pairs = routes.count()
    udf, udf_pairs = timed_udf(spark, df, targets, args.udf_sample)
    log(f"Python UDF on {args.udf_sample:,}: {udf:,.1f} msgs/s")
    below = max(args.udf_sample, args.duckdb_sample)
    got = spark_pairs(spark, routes, below)
    want_udf = {p for p in got if p[0] < args.udf_sample}
    want_ddb = {p for p in got if p[0] < args.duckdb_sample}
    agree = want_udf == udf_pairs and want_ddb == ddb_pairs
    if not agree:
        print(
            f"DISAGREEMENT: spark-udf {sorted(want_udf ^ udf_pairs)[:10]}, "
            f"spark-duckdb {sorted(want_ddb ^ ddb_pairs)[:10]}",
            file=sys.stderr,
        )
    row = Row(n, n / spark_s, validate_s, pairs / n, udf, ddb, agree)
    return row, Routed(n, path, targets, pairs, below, got)


def route_on_cluster(args: argparse.Namespace, rows: list[Row], routed: list[Routed]) -> None:
    """Route each count's messages again on a standalone cluster of two one-core
    workers started here: sets ``Row.cluster``, and ``Row.agree`` to False when the
    pairs differ from the local run's."""
    workers = StandaloneCluster(workers=2, cores=1, memory=args.executor_memory)
    print(f"cluster: a master and 2 workers of 1 core, {args.executor_memory}", file=sys.stderr)
    with workers as cluster:
        conf = {
            "spark.executor.memory": args.executor_memory,
            "spark.driver.host": "127.0.0.1",
            # what session() sets on local masters, for the same plans
            "spark.sql.shuffle.partitions": str(4 * (os.cpu_count() or 2)),
        }
        spark = session(cluster.master, "bench-spark-route-cluster", **conf)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            for row, done in zip(rows, routed, strict=True):
                df = spark.read.parquet(str(done.path))
                seconds = timed_route(df, done.targets)
                row.cluster = done.messages / seconds
                log(f"M = {done.messages:,} on the cluster: {seconds:.1f} s")
                routes = route_dataframe(df, done.targets, validate=False)
                same = routes.count() == done.pairs
                same = same and spark_pairs(spark, routes, done.below) == done.sample
                if not same:
                    print(f"DISAGREEMENT: cluster vs {args.master}", file=sys.stderr)
                row.agree = row.agree and same
        finally:
            spark.stop()


def run(args: argparse.Namespace) -> int:
    quiet_lint()
    spark = session(args.master, "bench-spark-route", **{"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    results: list[Row] = []
    routed: list[Routed] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        for n in args.messages:
            row, done = route_locally(spark, args, n, tmp)
            results.append(row)
            routed.append(done)
        if args.cluster:
            spark.stop()  # one SparkContext a process: the cluster's driver is this one
            route_on_cluster(args, results, routed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, args)
    return 0 if all(r.agree for r in results) else 1


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nSpark batch routing, {args.subscriptions:,} subscriptions, {args.master} "
        f"(UDF on {args.udf_sample:,} messages, DuckDB on {args.duckdb_sample:,})\n"
    )
    head = ["messages", "matches/msg", "Spark msgs/s", "UDF msgs/s", "DuckDB msgs/s",
            "Spark/UDF", "DuckDB/Spark", "key check s", "agree"]  # fmt: skip
    if args.cluster:
        head[-1:-1] = ["cluster msgs/s", "cluster/Spark"]
    table = [head]
    for r in rows:
        ratio = r.spark / r.udf
        line = [
            f"{r.messages:,}",
            f"{r.matches:.1f}",
            f"{r.spark:,.0f}",
            f"{r.udf:,.1f}",
            f"{r.duckdb:,.0f}",
            f"{ratio:,.0f}x {'ok' if ratio >= TARGET_VS_UDF else 'MISS'}",
            f"{r.duckdb / r.spark:.2f}",
            f"{r.validate_s:.1f}",
        ]
        if args.cluster:
            line += [f"{r.cluster or 0:,.0f}", f"{(r.cluster or 0) / r.spark:.2f}"]
        table.append([*line, "yes" if r.agree else "NO"])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print(f"\ntarget: Spark >= {TARGET_VS_UDF:.0f}x the Python UDF")
    if args.cluster:
        print(
            f"cluster: a standalone master and 2 workers of 1 core ({args.executor_memory} "
            f"each) on this machine, the same files, against {args.master} in one JVM"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", default="1000000,10000000", help="message counts")
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--udf-sample", type=int, default=2_000)
    parser.add_argument("--duckdb-sample", type=int, default=20_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--quick", action="store_true", help="200k messages, 2,000 subscriptions")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="route the same messages again on a standalone master and 2 one-core workers "
        "started here",
    )
    parser.add_argument("--executor-memory", default="2g", help="each cluster executor's memory")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.subscriptions = "200000", 2_000
        args.udf_sample, args.duckdb_sample = 500, 5_000
    args.messages = [int(x) for x in str(args.messages).split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
