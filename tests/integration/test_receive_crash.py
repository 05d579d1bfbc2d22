"""A receive location killed mid-batch and restarted publishes no file twice and loses
none (issue 4). The location runs in real ``messagebox host run`` processes, on both
backends: one dies right after a publish committed but before its files were archived,
one is SIGKILLed at a random moment, and a third finishes the work."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from messagebox import MessageBox
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
N_FILES = 600


def start(
    url: str, inbound: Path, out: Path, log: Path, *extra: str, **env: str
) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "messagebox.cli",
                "--url",
                url,
                "host",
                "run",
                "tests.apps.receiver:app",
                "--log-level",
                "WARNING",
                *extra,
            ],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "MB_TEST_IN": str(inbound),
                "MB_TEST_OUT": str(out),
                **env,
            },
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def queue_depth(port: int) -> float | None:
    """Entries on the receiver's queue, as the running host's metrics report them."""
    try:
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None  # not serving yet
    depths = [
        sample.value
        for family in text_string_to_metric_families(body)
        if family.name == "messagebox_queue_depth"
        for sample in family.samples
    ]
    return sum(depths) if depths else None  # no gauge is not an empty queue


def wait_for(condition, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def test_killed_receive_location_publishes_each_file_exactly_once(backend_url: str, tmp_path: Path):
    # Given 600 files in the inbound folder
    inbound, out, log = tmp_path / "in", tmp_path / "out", tmp_path / "hosts.log"
    inbound.mkdir()
    out.mkdir()
    for n in range(N_FILES):
        (inbound / f"item-{n:04d}.xml").write_bytes(f"<Item><N>{n}</N></Item>".encode())

    def outputs() -> list[str]:
        return [p.name.split(".xml.")[0] for p in out.iterdir() if not p.name.startswith(".")]

    # When a host dies right after its third publish committed, before archiving
    first = start(backend_url, inbound, out, log, MB_TEST_CRASH_AFTER="3")
    assert first.wait(60) == 9, log.read_text()
    taken = [p.name for p in inbound.iterdir() if p.name.endswith(".mbin")]
    assert len(taken) == 25  # the last batch: published, but its files still taken
    # and the next host is SIGKILLed at a random moment mid-run
    second = start(backend_url, inbound, out, log)
    kill_at = random.randint(150, 350)
    wait_for(lambda: len(outputs()) >= kill_at, 60, f"{kill_at} outputs", log)
    second.send_signal(signal.SIGKILL)
    second.wait(10)
    # and a third host finishes the work: every file received and sent, and the entries
    # the killed host had claimed (their files possibly already written) sent again
    port = free_port()
    third = start(backend_url, inbound, out, log, "--metrics-port", str(port))
    try:
        wait_for(
            lambda: (
                not list(inbound.iterdir())
                and len(set(outputs())) >= N_FILES
                and queue_depth(port) == 0
            ),
            120,
            "every file to be received and sent, and the queue empty",
            log,
        )
    finally:
        third.send_signal(signal.SIGTERM)
        assert third.wait(30) == 0, log.read_text()

    # Then every file was published exactly once: one output per input, none twice
    sources = Counter(outputs())
    assert len(sources) == N_FILES
    assert max(sources.values()) == 1, sources.most_common(3)
    with MessageBox(backend_url) as box:
        assert box.suspended() == []
        assert box.queue_depth() == []
