"""Shared fixtures: one backend-parametrised ``box`` for the conformance suite.

PostgreSQL tests skip when no server answers at 127.0.0.1:5432, except when ``CI=true``:
there a missing server is a failure. Each test gets its own schema (PostgreSQL) or file
(DuckDB); nothing leaks between tests.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from messagebox import MessageBox
from messagebox.claims import Claim, Failure
from messagebox.delivery import leases as mb_leases
from messagebox.models import HostSettings
from messagebox.storage import schema as mb_schema

PG_DSN = os.environ.get("MESSAGEBOX_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"

# No per-example deadline or "too slow" check: on a loaded two-core machine one slow
# example would fail a property that holds. Locally each run draws new examples (and
# replays saved failures); CI draws the same ones every run, so a red CI is a change's
# doing, not the dice's.
settings.register_profile("messagebox", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("messagebox"), derandomize=True)
settings.load_profile("ci" if IN_CI else "messagebox")


@cache
def pg_reason() -> str | None:
    """Why PostgreSQL cannot be used, or None when it can."""
    try:
        engine = sa.create_engine(PG_DSN, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception as exc:  # any failure to connect means "no server"
        return f"PostgreSQL unavailable at {PG_DSN}: {exc}"
    return None


def require_pg() -> None:
    reason = pg_reason()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


@contextmanager
def scratch_url(backend: str, tmp_dir: Path) -> Iterator[str]:
    """A store URL of its own: a DuckDB file in ``tmp_dir``, or a fresh PostgreSQL schema
    (dropped afterwards). For fixtures of any scope."""
    if backend == "duckdb":
        yield f"duckdb:///{tmp_dir / 'box.duckdb'}"
        return
    require_pg()
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(PG_DSN)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {name}")
    try:
        yield f"{PG_DSN}?options=-csearch_path%3D{name}"
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        engine.dispose()


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    with scratch_url("postgresql", tmp_path) as url:
        yield url


@pytest.fixture
def duckdb_url(tmp_path: Path) -> str:
    return f"duckdb:///{tmp_path / 'box.duckdb'}"


@pytest.fixture(params=["duckdb", "postgresql"])
def backend_url(request: pytest.FixtureRequest) -> str:
    return str(
        request.getfixturevalue(f"{'pg' if request.param == 'postgresql' else 'duckdb'}_url")
    )


@pytest.fixture
def box(backend_url: str) -> Iterator[MessageBox]:
    b = MessageBox(backend_url, publisher="tests")
    try:
        yield b
    finally:
        b.close()


def claim(
    box: MessageBox,
    host: str,
    *,
    n: int = 1,
    owner: str = "t",
    lease_seconds: float = 30.0,
    instances: bool = False,
) -> list[Claim]:
    """Claim up to ``n`` entries of ``host`` as a host instance ``owner`` would."""
    with box.store.transaction(serial=True) as conn:
        return mb_leases.claim(
            conn,
            box.store.dialect,
            host=host,
            owner=owner,
            n=n,
            lease_seconds=lease_seconds,
            ordered=False,
            instances=instances,
        )


def complete(box: MessageBox, claimed: Claim, owner: str = "t") -> None:
    """Complete a claimed entry, as a host instance would: its reference is released."""
    with box.store.transaction(serial=True) as conn:
        mb_leases.finish(conn, box.store.dialect, owner, [claimed], [], HostSettings(), set())


def fail_for_good(box: MessageBox, claimed: Claim, error: str, owner: str = "t") -> None:
    """Fail a claimed entry permanently, as a host instance would: it is suspended."""
    with box.store.transaction(serial=True) as conn:
        failure = Failure(claimed, error, permanent=True)
        mb_leases.finish(conn, box.store.dialect, owner, [], [failure], HostSettings(), set())


def table_counts(box: MessageBox) -> dict[str, int]:
    """Row counts of every messagebox table but the per-minute rates (a process writes
    them every few seconds, whatever it did) and the audit log (a refused command is
    recorded too): equal before and after means unchanged."""
    with box.store.transaction() as conn:
        return {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in mb_schema.metadata.sorted_tables
            if t is not mb_schema.rollup and t is not mb_schema.audit
        }


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (``make test`` runs ``-n``), every test that uses the Spark
    session goes to one worker (``--dist loadgroup``): one JVM for the run, not one each
    (three JVMs of ``local[2]`` on two cores made each Spark test several times slower).
    Marked as each test is collected, before xdist reads the groups."""
    if "spark" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] Spark session for the whole run, or for the one xdist worker that
    runs the Spark tests (starting one costs about 5 s)."""
    from messagebox.pipelines.spark import session

    s = session("local[2]", "messagebox-tests", **{"spark.sql.shuffle.partitions": "4"})
    s.sparkContext.setLogLevel("OFF")
    try:
        yield s
    finally:
        s.stop()


# host settings that poll quickly and give up on a failing message after two attempts
FAST_FAILING: dict[str, Any] = {
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.05,
    "retry_backoff_seconds": 0.0,
    "max_attempts": 2,
    "cleanup_interval_seconds": 0.0,
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 just now (a child process binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], object], what: str = "condition", timeout: float = 20.0) -> None:
    """Poll ``cond`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


class Stalled:
    """A service whose handlers wait until released; :meth:`stop_midway` stops a host
    instance while one waits."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.handled: list[int] = []

    def __call__(self, d: Any) -> None:
        self.entered.set()
        self.release.wait(5)
        self.handled.append(d.entry_id)

    def stop_midway(self, inst: Any) -> None:
        """Begin ``inst.stop()`` while a handler waits (no new work from there), then
        release the handler and wait for the stop."""
        assert self.entered.wait(5)
        stopper = threading.Thread(target=inst.stop, kwargs={"timeout": 5})
        stopper.start()
        wait_for(inst._stopping.is_set, what="the stop to begin")
        self.release.set()
        stopper.join()


FAST_HOST: dict[str, Any] = {
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.1,
    "retry_backoff_seconds": 0.0,
    "heartbeat_seconds": 0.2,
    "dead_after_seconds": 1.0,
    "cleanup_interval_seconds": 0.0,
}
"""Host settings for tests: quick polls, retries, heartbeats and dead instances."""
