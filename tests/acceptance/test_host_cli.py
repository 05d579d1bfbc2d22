"""``messagebox host run``, ``instances`` and ``cleanup`` as a user runs them, on the
embedded default (DuckDB)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from messagebox import Message, MessageBox
from messagebox.predicates import P
from tests.cli_support import ROOT, process_env, run_cli
from tests.conftest import free_port


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``messagebox ARGS`` as a subprocess: ``host run`` (it configures logging, serves
    metrics, loads the app's module) stays out of the tests' process."""
    return subprocess.run(
        [sys.executable, "-m", "messagebox.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=process_env(env),
    )


def test_host_run_delivers_then_cleanup_empties(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("workers", poll_max_seconds=0.1)
        box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
        box.publish(Message(b"x", promoted={"t.N": i}) for i in range(50))
    out = tmp_path / "out"
    out.mkdir()

    def lines() -> list[str]:
        return [line for f in out.glob("*.log") for line in f.read_text().splitlines()]

    proc = host_run(url, "tests.apps.recorder:app", env={"MB_TEST_OUT": str(out)})
    try:
        deadline = time.monotonic() + 60
        while len(lines()) < 50 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "running; Ctrl-C stops it" in stderr
    assert len(lines()) == 50
    cleaned = run_cli(["--url", url, "cleanup"])  # short commands: in this process
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.startswith("deleted 50 messages and 50 parts")
    listed = run_cli(["--url", url, "instances"])
    assert (listed.returncode, listed.stdout) == (0, "")  # it unregistered on the way out


def host_run(
    url: str, app: str, *options: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``messagebox host run`` in the background; stop it with SIGTERM."""
    return subprocess.Popen(
        [sys.executable, "-m", "messagebox.cli", "--url", url, "host", "run", app, *options],
        cwd=ROOT,
        env=process_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_host_run_names_a_bad_target(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    done = cli("--url", url, "host", "run", "tests.apps.nowhere:app")
    assert done.returncode == 1
    assert "cannot import 'tests.apps.nowhere'" in done.stderr
    done = cli("--url", url, "host", "run", "tests.apps.recorder:record")
    assert done.returncode == 1
    assert "is not a HostApp" in done.stderr


def test_host_run_serves_metrics_and_logs_json(tmp_path: Path) -> None:
    # Given 20 messages for the recorder app, one of which its service fails
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("workers", poll_max_seconds=0.1, retry_backoff_seconds=0.2)
        box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
        box.publish(Message(b"x", promoted={"t.N": i}) for i in range(19))
        [bad] = box.publish([Message(b"x", promoted={"t.N": 99, "t.Fail": True})])
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    # When a host instance runs with a metrics port and JSON logs
    options = ["--log-format", "json", "--metrics-port", str(port)]
    proc = host_run(url, "tests.apps.recorder:app", *options, env={"MB_TEST_OUT": str(out)})
    try:
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body)
                for s in family.samples
            }
            if samples.get(("messagebox_delivered_total", (("host", "workers"),))) == 19 and (
                samples.get(("messagebox_delivery_failures_total", (("host", "workers"),)), 0) >= 1
            ):
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    # Then the scrape parses, and counts the deliveries, the failure and the claims
    assert samples[("messagebox_delivered_total", (("host", "workers"),))] == 19
    assert samples[("messagebox_delivery_failures_total", (("host", "workers"),))] >= 1
    assert samples[("messagebox_claim_seconds_count", (("host", "workers"),))] >= 1
    assert samples[("messagebox_claim_latency_seconds_count", (("host", "workers"),))] >= 20
    # and serves the store's gauges too (on DuckDB no other process can read them)
    assert samples[("messagebox_host_instances", (("host", "workers"),))] == 1
    assert ("messagebox_queue_depth", (("host", "workers"), ("state", "ready"))) in samples
    assert samples[("messagebox_messages", ())] == 20
    # and every log line is a JSON object; the failure names its message and entry
    logs = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert logs
    assert all({"time", "level", "logger", "message", "event"} <= set(x) for x in logs), [
        x for x in logs if "event" not in x
    ]
    [running] = [x for x in logs if x["event"] == "host-running"]
    assert running["message"].endswith("running; Ctrl-C stops it")
    [metrics] = [x for x in logs if x["event"] == "metrics-serving"]
    assert (metrics["address"], metrics["port"]) == ("127.0.0.1", port)
    [started] = [x for x in logs if x.get("event") == "instance-started"]
    assert started["host"] == "workers"
    failure = next(x for x in logs if x.get("event") == "delivery-failed")
    assert failure["message_id"] == str(bad.message_id)
    assert failure["service"] == "record"
    assert failure["error"].startswith("RuntimeError: told to fail")
    assert failure["level"] == "warning"
    assert any(x.get("event") == "instance-stopped" for x in logs)


def test_host_run_refuses_a_taken_metrics_port(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(
            "--url", url, "host", "run", "tests.apps.recorder:app", "--metrics-port", str(port)
        )
    assert done.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr


def test_host_run_refuses_a_malformed_console_address(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    done = cli("--url", url, "host", "run", "tests.apps.pair:alpha", "--console", "here:port")
    assert done.returncode == 2
    assert "'here:port' is not PORT, ADDR:PORT or off" in done.stderr
    assert not (tmp_path / "box.duckdb").exists()  # refused before anything was opened


def test_host_run_until_idle_handles_what_is_queued_then_exits(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("workers", poll_max_seconds=0.1, retry_backoff_seconds=0.2, max_attempts=2)
        box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
        box.publish(Message(b"x", promoted={"t.N": i}) for i in range(30))
        box.publish([Message(b"x", promoted={"t.N": 99, "t.Fail": True})])
    out = tmp_path / "out"
    out.mkdir()
    done = cli(
        "--url", url, "host", "run", "tests.apps.recorder:app", "--until-idle", "1",
        "--console", "off", env={"MB_TEST_OUT": str(out)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "every instance idle for 1s: stopping" in done.stderr
    lines = [line for f in out.glob("*.log") for line in f.read_text().splitlines()]
    assert len(lines) == 30
    # the failing message's retry came within the idle time: both attempts, then suspended
    assert done.stderr.count("told to fail") == 2, done.stderr
    with MessageBox(url) as box:
        [suspended] = box.suspended()
        assert suspended.attempts == 2
        assert box.queue_depth("workers") == []  # suspended entries leave the queue


def test_host_run_refuses_a_bad_number_of_seconds(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    for option, value in (("--until-idle", "0"), ("--until-idle", "soon"), ("--duration", "-1")):
        done = cli("--url", url, "host", "run", "tests.apps.recorder:app", option, value)
        assert done.returncode == 2
        assert f"{value!r} is not a" in done.stderr
    assert not (tmp_path / "box.duckdb").exists()
