"""Spark on a real cluster: a standalone master and two workers on this machine, and a
driver (tests/integration/spark_cluster_driver.py, a process of its own) that routes,
publishes and runs what-if there. The results equal local[2]'s on the same data.

Nothing of the driver's reaches the executors but what Spark sends them: they run in the
workers' folders, and their Python (a wrapper of this virtualenv's interpreter that skips
its site hooks: the dependencies import, messagebox does not) has messagebox only when
it is shipped. Routing, what-if and a DuckDB publish run with no Python on the executors
at all. The inputs are on this machine's disk, which the workers share, as a cluster
shares HDFS or a mount; what-if's export goes to a ``staging`` URL the executors write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.pipelines.spark import route_dataframe
from messagebox.pipelines.spark_publish import publish_dataframe
from messagebox.pipelines.spark_standalone import StandaloneCluster
from messagebox.pipelines.whatif import what_if
from messagebox.predicates import Filter, P
from messagebox.storage import schema
from tests.conftest import require_pg, scratch_url

pytestmark = pytest.mark.deployment  # .ci/run runs them after the suite (make test-deployment)

DRIVER = Path(__file__).with_name("spark_cluster_driver.py")
JOB = "cluster"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ORDERS = (
    "key BIGINT, `o.Region` STRING, `o.Total` DOUBLE, `o.Qty` BIGINT, `o.Rush` BOOLEAN, "
    "`o.At` TIMESTAMP"
)
SUBS: dict[str, Any] = {
    "eu": P("o.Region") == "EU",
    "us-uk": P("o.Region").in_(["US", "UK"]),
    "big": P("o.Total") >= 500,
    "rush-late": (P("o.Rush") == True) & (P("o.At") > T0 + timedelta(days=10)),  # noqa: E712
}
PROPOSED: dict[str, Any] = {
    "eu": P("o.Region").in_(["EU", "UK"]),
    "bulk": P("o.Qty") >= 5,
}


def order(i: int) -> tuple[Any, ...]:
    """A varied order; every 7th has no Region."""
    regions = ["EU", "US", "UK", "APAC"]
    return (
        i,
        None if i % 7 == 0 else regions[i % 4],
        float(i * 37 % 1000) + 0.25,
        i % 9,
        [True, False, None][i % 3],
        T0 + timedelta(hours=i, microseconds=i),
    )


def stock(url: str) -> None:
    """A host and the subscriptions of SUBS, in that order (the same ids everywhere)."""
    with MessageBox(url) as box:
        box.create_host("h")
        for name, f in SUBS.items():
            box.subscribe(name, host="h", filter=f, name=name)


def executor_python(folder: Path) -> Path:
    """This virtualenv's interpreter, without site (so without the editable install's
    import hook), its packages on PYTHONPATH: every dependency imports, messagebox not."""
    wrapper = folder / "executor-python"
    packages = sysconfig.get_paths()["purelib"]
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{packages}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -S "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def queued(url: str) -> set[tuple[uuid.UUID, str]]:
    """(message, subscription name) of every queue entry."""
    q, s = schema.queue, schema.subscription
    with MessageBox(url) as box, box.store.transaction() as conn:
        rows = conn.execute(sa.select(q.c.msg, s.c.name).join(s, s.c.id == q.c.sub))
        return {(m, n) for m, n in rows}


def spool(url: str) -> dict[uuid.UUID, dict[str, Any]]:
    with MessageBox(url) as box:
        return {m: p for page in box.iter_promoted() for m, p in page}


def changes(frame: Any) -> set[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return {(r["message_id"], tuple(r["before"]), tuple(r["after"])) for r in frame.collect()}


def routes(frame: Any) -> set[tuple[Any, ...]]:
    return {tuple(r) for r in frame.collect()}


def counts(report: Any) -> dict[str, Any]:
    """A publish report without its timings and partitions."""
    return {k: v for k, v in asdict(report).items() if k not in ("partitions", "seconds")}


def write_inputs(spark: Any, work: Path) -> None:
    """The orders (Parquet, 4 files) and the proposal (JSON) both drivers read."""
    rows = [order(i) for i in range(1200)]
    spark.createDataFrame(rows, ORDERS).repartition(4).write.parquet(str(work / "orders"))
    proposal = [
        {"service": s, "filter": json.loads(Filter.of(f).to_json())} for s, f in PROPOSED.items()
    ]
    (work / "proposed.json").write_text(json.dumps(proposal))


@contextmanager
def driver(master: str, work: Path, remote: str, duckdb_url: str) -> Iterator[Callable[[], Any]]:
    """Start spark_cluster_driver.py against ``master``; yields a function that waits for
    it and returns what it found (result.json). Killed if still running at the end."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = str(executor_python(work))
    log_path = work / "driver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(DRIVER), master, str(work), remote, duckdb_url],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def result() -> Any:
        process.wait(240)
        text = log_path.read_text(errors="replace")
        assert process.returncode == 0, f"the driver failed:\n{text[-6000:]}"
        print("".join(line for line in text.splitlines(True) if line.startswith("[driver")))
        return json.loads((work / "result.json").read_text())

    try:
        yield result
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@dataclass
class Run:
    """What the cluster's driver did, and local[2]'s results on the same data."""

    work: Path
    result: dict[str, Any]
    duckdb_url: str
    remote: dict[str, Any]
    """The cluster's PostgreSQL store: ``queued``, ``spool``."""
    local: dict[str, Any]
    """local[2]: ``routes``, ``publish``, ``queued``, ``spool``, ``changes``, ``summary``."""


def run_locally(spark: Any, work: Path, url: str) -> dict[str, Any]:
    """Route, publish (into ``url``) and run what-if on local[2], as the driver did."""
    orders = spark.read.parquet(str(work / "orders"))
    found: dict[str, Any] = {"routes": routes(route_dataframe(orders, url, key="key"))}
    found["publish"] = counts(publish_dataframe(orders, url, job=JOB, key="key"))
    found["queued"], found["spool"] = queued(url), spool(url)
    with MessageBox(url) as box:
        report = what_if(box, str(work / "proposed.json"), spark=spark)
        found["changes"], found["summary"] = changes(report.changes), report.summary
    return found


@pytest.fixture(scope="module")
def cluster_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Start the cluster, run the driver against it, and do the same on local[2]."""
    require_pg()
    work = tmp_path_factory.mktemp("cluster")
    write_inputs(spark, work)
    duckdb_url = f"duckdb:///{work / 'cluster.duckdb'}"
    with (
        scratch_url("postgresql", work) as remote,
        scratch_url("postgresql", work) as local,
    ):
        for url in (remote, local, duckdb_url):
            stock(url)
        start = time.monotonic()
        with (
            StandaloneCluster(workers=2, memory="768m", folder=work / "cluster") as cluster,
            driver(cluster.master, work, remote, duckdb_url) as result,
        ):
            up = time.monotonic()
            here = run_locally(spark, work, local)  # meanwhile, local[2]
            found = result()
        print(
            f"cluster up in {up - start:.1f} s, then driver and local {time.monotonic() - up:.1f} s"
        )
        on_cluster = {"queued": queued(remote), "spool": spool(remote)}
        yield Run(work, found, duckdb_url, on_cluster, here)


def test_the_executors_python_cannot_import_messagebox_on_its_own(cluster_run: Run) -> None:
    done = subprocess.run(
        [
            cluster_run.result["executor_python"],
            "-c",
            "import sqlalchemy, psycopg; import messagebox",
        ],
        cwd=cluster_run.work / "cluster",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "No module named 'messagebox'" in done.stderr


def test_routing_on_the_cluster_equals_local_with_no_python_on_the_executors(
    spark: Any, cluster_run: Run
) -> None:
    found = routes(spark.read.parquet(str(cluster_run.work / "routes")))
    assert found == cluster_run.local["routes"]
    assert len(found) > 1000


def test_publishing_without_the_package_shipped_fails_saying_so_and_stores_nothing(
    cluster_run: Run,
) -> None:
    error = cluster_run.result["unshipped_error"]
    assert "spark job 'cluster'" in error
    assert "No module named 'messagebox'" in error
    assert "ship_package(spark)" in error
    assert cluster_run.result["stored_unshipped"] == 0


def test_publishing_with_a_python_the_executors_lack_fails_naming_it(cluster_run: Run) -> None:
    error = cluster_run.result["no_python_error"]
    assert f'cannot run Python "{cluster_run.result["no_python"]}" (PYSPARK_PYTHON)' in error
    assert "Set PYSPARK_PYTHON to a Python every executor has" in error


def test_publishing_from_the_cluster_equals_local(cluster_run: Run) -> None:
    # executors, with the package shipped
    assert cluster_run.result["shipped"].startswith("messagebox-")
    assert cluster_run.result["postgresql"] == cluster_run.local["publish"]
    assert cluster_run.remote["queued"] == cluster_run.local["queued"]
    assert cluster_run.remote["spool"] == cluster_run.local["spool"]
    assert len(cluster_run.local["spool"]) == 1200


def test_publishing_from_the_driver_of_a_cluster_runs_no_python_on_the_executors(
    cluster_run: Run,
) -> None:
    duck = cluster_run.result["duckdb"]
    assert duck["parallel"] is False
    assert {k: v for k, v in duck.items() if k != "parallel"} == {
        k: v for k, v in cluster_run.local["publish"].items() if k != "parallel"
    }
    assert queued(cluster_run.duckdb_url) == cluster_run.local["queued"]


def test_what_if_on_the_cluster_equals_local_its_export_under_staging(
    spark: Any, cluster_run: Run
) -> None:
    found = changes(spark.read.parquet(str(cluster_run.work / "changes")))
    assert found == cluster_run.local["changes"]
    assert cluster_run.result["summary"] == asdict(cluster_run.local["summary"])
    assert cluster_run.local["summary"].changed > 100
    # the export went to a new folder under staging, written by Spark (the executors),
    # and was removed when the driver exited
    staged = cluster_run.result["staged"]
    [folder] = [name for name in staged if "/" not in name]
    assert folder.startswith("messagebox-export-")
    assert f"{folder}/_SUCCESS" in staged
    assert any(name.endswith(".parquet") for name in staged)
    assert list((cluster_run.work / "staging").iterdir()) == []
