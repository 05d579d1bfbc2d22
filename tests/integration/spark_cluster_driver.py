"""The driver side of tests/integration/test_spark_cluster.py, run as a process of its
own (the test's process holds its local[2] session, and a process has one SparkContext):

    python spark_cluster_driver.py MASTER WORK PG_URL DUCKDB_URL

The executors' Python (``PYSPARK_PYTHON``, set by the test) cannot import messagebox
unless it is shipped. Routing, what-if and the DuckDB publish (by the driver) run with
``pythonExec`` pointed at a file that does not exist, so any Python worker would fail
to start; the PostgreSQL publish (by the executors) is tried with that missing Python,
then with the executors' Python before the package is shipped (both errors are kept),
and runs once it is. Results go to files under WORK: ``routes`` and ``changes``
(Parquet), ``result.json``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from messagebox import MessageBox
from messagebox.errors import MessageBoxError
from messagebox.pipelines.spark import route_dataframe, session
from messagebox.pipelines.spark_publish import PublishReport, publish_dataframe
from messagebox.pipelines.spark_session import SHIP_CONF, ship_package
from messagebox.pipelines.whatif import what_if

JOB = "cluster"


def counts(report: PublishReport) -> dict[str, Any]:
    found = asdict(report)
    del found["partitions"], found["seconds"]
    return found


def refusal(orders: Any, pg_url: str) -> str | None:
    """The error of publishing ``orders`` from the executors, None if it worked."""
    try:
        publish_dataframe(orders, pg_url, job=JOB, key="key")
    except MessageBoxError as exc:
        return str(exc)
    return None


def step(start: float, text: str) -> None:
    print(f"[driver {time.monotonic() - start:6.1f} s] {text}", file=sys.stderr, flush=True)


def main(master: str, work: Path, pg_url: str, duckdb_url: str) -> None:
    start = time.monotonic()
    conf = {
        SHIP_CONF: "false",  # shipped below, after publishing without it
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": "4",
        "spark.task.maxFailures": "1",  # a task that cannot import fails the job at once
        "spark.ui.showConsoleProgress": "false",
    }
    spark = session(master, "messagebox-cluster-test", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    executor_python, no_python = sc.pythonExec, str(work / "no-such-python")
    step(start, f"session on {sc.master}")
    result: dict[str, Any] = {"executor_python": executor_python, "no_python": no_python}

    sc.pythonExec = no_python  # from here, a Python worker would fail to start
    orders = spark.read.parquet(str(work / "orders"))
    route_dataframe(orders, pg_url, key="key").write.parquet(str(work / "routes"))
    step(start, "routed")
    result["duckdb"] = counts(publish_dataframe(orders, duckdb_url, job=JOB, key="key"))
    step(start, "published from the driver")

    result["no_python_error"] = refusal(orders, pg_url)
    sc.pythonExec = executor_python
    result["unshipped_error"] = refusal(orders, pg_url)
    with MessageBox(pg_url) as box:
        result["stored_unshipped"] = sum(len(page) for page in box.iter_promoted())
    step(start, "publishing without the package failed")
    result["shipped"] = ship_package(spark).name
    result["postgresql"] = counts(publish_dataframe(orders, pg_url, job=JOB, key="key"))
    step(start, "published from the executors")

    sc.pythonExec = no_python
    with MessageBox(pg_url) as box:
        staging = (work / "staging").as_uri()
        report = what_if(box, str(work / "proposed.json"), spark=spark, staging=staging)
        report.changes.write.parquet(str(work / "changes"))
    result["summary"] = asdict(report.summary)
    # the export, as the executors wrote it (removed when this process exits)
    result["staged"] = sorted(
        p.relative_to(work / "staging").as_posix() for p in (work / "staging").rglob("*")
    )
    step(start, "what-if done")
    (work / "result.json").write_text(json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4])
