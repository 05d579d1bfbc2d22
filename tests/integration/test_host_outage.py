"""Host instances in their own processes ride out PostgreSQL failing under them
(issue 18): a restart (``-m immediate``) and a 30 s outage while they deliver. Every
pair is delivered within ``lease_seconds`` and a small bound after the database is
back, and no host is restarted. The database is a throw-away cluster on a port of its
own, never the shared server."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from messagebox import Message, MessageBox
from messagebox.predicates import P
from tests.conftest import IN_CI, free_port
from tests.integration.test_processes import errors, records, start_workers, stop

pytestmark = pytest.mark.postgres

LEASE_SECONDS = 5.0
BOUND_SECONDS = 15.0
"""Beyond the lease: reconnecting, the interrupted entries delivered one at a time, and
the rest of the backlog."""

SETTINGS = {
    "dequeue_threads": 2,
    "claim_batch": 20,
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.5,
    "heartbeat_seconds": 0.5,
    "dead_after_seconds": 3.0,
    "lease_seconds": LEASE_SECONDS,
    "retry_backoff_seconds": 0.1,
    "cleanup_interval_seconds": 0.0,
}


def cluster_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        reason = f"{name} not found (Debian's postgresql-common makes throw-away clusters)"
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return found


def server_version() -> str:
    """The newest PostgreSQL server installed (Debian keeps each in its own folder)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: p.parts)
    if not versions:
        if IN_CI:
            pytest.fail("CI=true but no PostgreSQL server in /usr/lib/postgresql")
        pytest.skip("no PostgreSQL server in /usr/lib/postgresql")
    return versions[-1].parts[-3]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of its own, dropped afterwards."""
    create = cluster_tool("pg_createcluster")
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI=true but making a cluster needs root")
        pytest.skip("making a cluster needs root")
    version = server_version()
    name = f"mbfault{uuid.uuid4().hex[:8]}"
    port = free_port()
    trust = ("--auth-local=trust", "--auth-host=trust")
    subprocess.run(
        [create, version, name, "--port", str(port), "--start", "--", *trust],
        check=True,
        capture_output=True,
    )
    try:
        yield Cluster(version, name, f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres")
    finally:
        subprocess.run(
            ["pg_dropcluster", version, name, "--stop"], check=False, capture_output=True
        )


@dataclass(frozen=True)
class Cluster:
    version: str
    name: str
    url: str

    def ctl(self, *action: str) -> None:
        """``pg_ctlcluster`` on this cluster: ``ctl("stop", "-m", "immediate")``."""
        subprocess.run(
            ["pg_ctlcluster", self.version, self.name, *action], check=True, capture_output=True
        )


def waiting(url: str) -> int | None:
    """Entries on the queue (leased or not); None while the database does not answer."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM mb_queue").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:
        return None


def publish(url: str, start: int, n: int) -> int:
    """Publish ``n`` messages; returns the pairs they make (three subscriptions)."""
    with MessageBox(url) as box:
        routed = box.publish(
            Message(b"x", promoted={"t.N": i, "t.Even": i % 2 == 0})
            for i in range(start, start + n)
        )
        return sum(len(r.subscriptions) for r in routed)


def wait_recorded(out: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(records(out)) < n:
        assert time.monotonic() < deadline, f"only {len(records(out))} of {n} recorded"
        time.sleep(0.05)


def wait_drained(url: str, out: Path, pairs: int, since: float, what: str) -> float:
    """Seconds from ``since`` until the queue is empty and every pair recorded."""
    bound = LEASE_SECONDS + BOUND_SECONDS
    while True:
        left = waiting(url)
        done = len({(m, s) for m, s, _, _ in records(out)})
        if left == 0 and done >= pairs:
            return time.monotonic() - since
        elapsed = time.monotonic() - since
        assert elapsed < bound, (
            f"{what}: {left} entries still queued and {done} of {pairs} pairs recorded "
            f"{elapsed:.0f} s after the database came back (bound {bound:.0f} s)\n"
            f"{errors(out)[-4000:]}"
        )
        time.sleep(0.1)


def test_hosts_deliver_every_pair_after_a_restart_and_an_outage_without_restarting(
    cluster: Cluster, tmp_path: Path
) -> None:
    url = cluster.url
    with MessageBox(url) as box:
        box.create_host("workers", **SETTINGS)  # type: ignore[arg-type]
        box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
        box.subscribe("record", host="workers", filter=P("t.N") < 5000, name="record-low")
        box.subscribe("record", host="workers", filter=P("t.Even") == True, name="record-even")  # noqa: E712
    procs = start_workers(url, tmp_path, 2, slow=0.02)
    try:
        # a restart that drops every connection mid-delivery
        pairs = publish(url, 0, 400)  # 1,000 pairs, 5 s of work
        wait_recorded(tmp_path, 300, timeout=60)
        cluster.ctl("restart", "-m", "immediate")
        back = time.monotonic()
        took_restart = wait_drained(url, tmp_path, pairs, back, "after the restart")
        # a 30 s outage mid-delivery
        pairs += publish(url, 400, 400)
        wait_recorded(tmp_path, 1000 + 300, timeout=60)
        cluster.ctl("stop", "-m", "immediate")
        time.sleep(30)  # the fault itself: the database is away this long
        cluster.ctl("start")
        back = time.monotonic()
        took_outage = wait_drained(url, tmp_path, pairs, back, "after the outage")
        assert all(p.poll() is None for p in procs), "a host ended"
    finally:
        stop(procs)
    attempts: dict[tuple[str, int], list[int]] = defaultdict(list)
    for msg, sub, attempt, _ in records(tmp_path):
        attempts[(msg, sub)].append(attempt)
    assert len(attempts) == pairs
    # a pair delivered twice (its outcome was lost with the connection) says so
    assert all(max(a) > 1 for a in attempts.values() if len(a) > 1)
    print(f"drained {took_restart:.1f} s after the restart, {took_outage:.1f} s after the outage")
