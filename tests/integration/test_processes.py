"""Host instances in separate OS processes sharing one PostgreSQL queue
(docs/concepts.md: Hosts): exactly one instance handles each entry, and a killed instance
loses nothing. The instances run through ``messagebox host run``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.predicates import P

ROOT = Path(__file__).resolve().parents[2]

WORKER_SETTINGS: dict[str, Any] = {
    "dequeue_threads": 2,
    "claim_batch": 20,
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.2,
    "heartbeat_seconds": 0.2,
    "dead_after_seconds": 1.0,
    "lease_seconds": 30.0,
    "cleanup_interval_seconds": 0.0,
}


def start_workers(
    url: str, out: Path, n: int, slow: float = 0.0, app: str = "tests.apps.recorder:app"
) -> list[subprocess.Popen[bytes]]:
    """``n`` processes of ``messagebox host run APP`` (each logging to ``out``)."""
    env = {
        **os.environ,
        "MB_TEST_OUT": str(out),
        "MB_TEST_SLOW": str(slow),
        "PYTHONPATH": str(ROOT),
    }
    procs = []
    for i in range(n):
        with (out / f"worker-{i}.err").open("wb") as err:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "messagebox.cli",
                        "--url",
                        url,
                        "host",
                        "run",
                        app,
                        "--log-level",
                        "WARNING",
                    ],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    return procs


def records(out: Path) -> list[tuple[str, int, int, int]]:
    found = []
    for log in out.glob("*.log"):
        text = log.read_text()
        # a line still being appended is read next time
        for line in text[: text.rfind("\n") + 1].splitlines():
            msg, sub, attempt, pid = line.split()
            found.append((msg, int(sub), int(attempt), int(pid)))
    return found


def wait_drained(box: MessageBox, expected: int, out: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while box.queue_depth() or len(records(out)) < expected:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not drained: {box.queue_depth()}, {len(records(out))} of {expected} recorded"
            )
        time.sleep(0.1)


def stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return [p.wait(timeout=30) for p in procs]


def errors(out: Path) -> str:
    return "\n".join(f.read_text() for f in sorted(out.glob("worker-*.err")))


@pytest.fixture
def setup(pg_url: str, tmp_path: Path) -> tuple[MessageBox, Path]:
    box = MessageBox(pg_url)
    box.create_host("workers", **WORKER_SETTINGS)
    box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
    box.subscribe("record", host="workers", filter=P("t.N") < 5000, name="record-low")
    box.subscribe("record", host="workers", filter=P("t.Even") == True, name="record-even")  # noqa: E712
    return box, tmp_path


def publish(box: MessageBox, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 1000):
        routed = box.publish(
            Message(b"x", promoted={"t.N": i, "t.Even": i % 2 == 0})
            for i in range(start, min(start + 1000, n))
        )
        ids.extend(str(r.message_id) for r in routed)
    return ids


@pytest.mark.postgres
def test_three_processes_handle_each_pair_exactly_once(
    setup: tuple[MessageBox, Path], pg_url: str
) -> None:
    box, out = setup
    # exactly once while no process dies: none may be taken for dead because a loaded
    # machine delayed its heartbeats past the 1 s the kill tests use
    box.configure_host("workers", dead_after_seconds=30.0)
    procs = start_workers(pg_url, out, 3)
    try:
        publish(box, 10_000)
        expected = 10_000 + 5_000 + 5_000
        wait_drained(box, expected, out)
    finally:
        codes = stop(procs)
    assert codes == [0, 0, 0], errors(out)
    found = records(out)
    pairs = Counter((m, s) for m, s, _, _ in found)
    assert len(pairs) == expected
    assert set(pairs.values()) == {1}
    assert all(attempt == 1 for *_, attempt, _ in found)
    assert len({pid for *_, pid in found}) == 3  # the work was shared
    assert box.instances() == []  # each unregistered on SIGTERM
    box.close()


@pytest.mark.postgres
def test_sigkill_mid_run_loses_nothing(setup: tuple[MessageBox, Path], pg_url: str) -> None:
    box, out = setup
    procs = start_workers(pg_url, out, 3, slow=0.002)
    try:
        publish(box, 1_500)
        expected = 1_500 + 1_500 + 750
        deadline = time.monotonic() + 60
        while len(records(out)) < 500:
            assert time.monotonic() < deadline, "workers did not start delivering"
            time.sleep(0.05)
        victim = procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        wait_drained(box, expected, out)
    finally:
        codes = stop(procs[1:])
    assert codes == [0, 0], errors(out)
    found = records(out)
    pairs = Counter((m, s) for m, s, _, _ in found)
    assert len(pairs) == expected  # every pair delivered
    # Redeliveries happen only for entries the killed process had claimed: each is a
    # second attempt, at most the victim's claim capacity (2 threads x 20 entries).
    twice = [p for p, n in pairs.items() if n > 1]
    assert set(pairs.values()) <= {1, 2}
    assert len(twice) <= 2 * 20
    again = {(m, s) for m, s, attempt, _ in found if attempt > 1}
    assert set(twice) <= again
    victim_pid = procs[0].pid
    assert all(
        any(pid == victim_pid for m2, s2, _, pid in found if (m2, s2) == pair) for pair in twice
    )
    box.close()
