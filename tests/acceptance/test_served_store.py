"""A store held by a running process is watched and steered through it (issue 21, item 1):
``host run`` of several apps on a DuckDB file, then every kind of command from other
processes while it runs; ``messagebox console`` the same; PostgreSQL with an explicit
``--url http://…``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from messagebox import Message, MessageBox
from messagebox.cli.remote import endpoint_file
from tests.cli_support import ROOT, process_env, run_cli
from tests.conftest import free_port

START_SECONDS = 60.0


def wait_for(condition: Callable[[], object], what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not condition():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the process ended before {what}: {err}")
        assert time.monotonic() < deadline, f"no {what} within {START_SECONDS} s"
        time.sleep(0.05)


def background(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "messagebox.cli", *argv],
        cwd=ROOT,
        env=process_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the process's standard error; killed if it does not end."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the process did not stop on SIGTERM: {err}") from None
    assert proc.returncode == 0, err
    return err


def ended(proc: subprocess.Popen[str]) -> None:
    """Make sure the process is gone (after a failure too), without masking it."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def cli(url: str, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    """A command in this process: it must not open the DuckDB file (run_cli checks)."""
    return run_cli(["--url", url, *argv], stdin=stdin)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Two host apps running in one process on a DuckDB file."""
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with MessageBox(url):
        pass
    proc = background("--url", url, "host", "run", "tests.apps.pair:alpha", "tests.apps.pair:beta")
    endpoint = endpoint_file(tmp_path / "store.duckdb")
    try:
        wait_for(endpoint.exists, "endpoint file", proc)
        yield url, proc
    finally:
        ended(proc)


def test_every_command_works_while_hosts_run_on_a_duckdb_file(
    served: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    url, proc = served
    endpoint = endpoint_file(tmp_path / "store.duckdb")
    assert endpoint.stat().st_mode & 0o777 == 0o600  # it holds the API token
    body = tmp_path / "body.bin"
    body.write_bytes(b"\x00\xffbinary body\n")

    # the endpoint file is written once the instances have started: both are listed
    listed = cli(url, "instances", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(i["host"] for i in json.loads(listed.stdout)) == ["alpha", "beta"]

    published = cli(url, "--json", "publish", str(body), "-p", "t.N=7")
    assert published.returncode == 0, published.stderr
    [routed] = json.loads(published.stdout)
    from_stdin = cli(url, "publish", "-p", "t.N=1", stdin=b"from stdin")
    assert from_stdin.returncode == 0, from_stdin.stderr

    raw = subprocess.run(  # bytes as stored, through a real pipe
        [
            sys.executable,
            "-m",
            "messagebox.cli",
            "--url",
            url,
            "messages",
            "show",
            routed["message_id"],
        ],
        cwd=ROOT,
        env=process_env(),
        capture_output=True,
        timeout=120,
    )
    assert (raw.returncode, raw.stdout) == (0, body.read_bytes()), raw.stderr

    def suspended() -> list[dict[str, object]]:
        got = cli(url, "--json", "suspended", "list", "--host", "beta")
        assert got.returncode == 0, got.stderr
        return list(json.loads(got.stdout))

    wait_for(lambda: len(suspended()) == 1, "beta's failure suspended", proc)
    [entry] = suspended()
    assert "beta refuses" in str(entry["error"])
    dry = cli(url, "suspended", "terminate", "--all-matching", "--host", "beta", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    unmeant = cli(url, "suspended", "terminate", "--all-matching", "--host", "beta")
    assert unmeant.returncode == 2, unmeant.stderr  # no terminal to ask at, no --yes
    assert len(suspended()) == 1
    groups = cli(url, "--json", "failures", "list")
    assert groups.returncode == 0, groups.stderr
    assert [g["count"] for g in json.loads(groups.stdout)] == [1]

    filter_file = tmp_path / "filter.txt"
    filter_file.write_text("t.N > 100")
    added = cli(
        url, "subscriptions", "add", "huge", "--host", "alpha", "--filter", f"@{filter_file}"
    )
    assert added.returncode == 0, added.stderr
    missing = cli(url, "subscriptions", "add", "x", "--host", "alpha", "--filter", "@nofile")
    assert missing.returncode == 2
    assert "'nofile': cannot read it" in missing.stderr
    unknown = cli(url, "suspended", "show", "999999")
    assert unknown.returncode == 3, unknown.stderr  # exit codes come back as they were

    for argv in (
        ("stats",),
        ("queues",),
        ("subscriptions", "list"),
        ("hosts", "list"),
        ("tracking", "status"),
        ("metrics",),
        ("route", "explain", "-p", "t.N=6"),
        ("services", "stop", "svc-b"),
        ("hosts", "set", "alpha", "--set", "claim_batch=5"),
        ("suspended", "terminate", "--all-matching", "--host", "beta", "--yes"),
        ("cleanup",),
    ):
        done = cli(url, *argv)
        assert done.returncode == 0, (argv, done.stderr)
    stats = json.loads(cli(url, "--json", "stats").stdout)
    assert stats["suspended"] == {}

    status = json.loads(endpoint.read_text())
    page = httpx.get(status["url"] + "/", timeout=30)  # the console, from the same process
    assert page.status_code == 200
    assert "alpha" in page.text
    refused = httpx.get(status["url"] + "/api/v1/status", timeout=30)
    assert refused.status_code == 401
    answered = httpx.get(
        status["url"] + "/api/v1/status",
        headers={"Authorization": f"Bearer {status['token']}"},
        timeout=30,
    )
    assert answered.status_code == 200
    assert {i["host"] for i in answered.json()["instances"]} == {"alpha", "beta"}

    log = stop(proc)
    assert "served `messagebox suspended terminate`: exit 0" in log  # each command logged
    assert not endpoint.exists()  # withdrawn on the way out: commands open the file again
    direct = run_cli(["--url", url, "--json", "stats"])
    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout)["subscriptions"] == {"started": 2, "stopped": 1}


def test_a_wrong_token_is_refused_and_changes_nothing(
    served: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    url, _ = served
    found = json.loads(endpoint_file(tmp_path / "store.duckdb").read_text())
    refused = run_cli(
        [
            "--url",
            found["url"],
            "subscriptions",
            "add",
            "x",
            "--host",
            "alpha",
            "--filter",
            "t.N > 1",
        ],
        env={"MESSAGEBOX_CONSOLE_TOKEN": "wrong"},
    )
    assert refused.returncode == 1
    assert "answered 403" in refused.stderr
    listed = cli(url, "--json", "subscriptions", "list")
    assert [s["name"] for s in json.loads(listed.stdout)] == ["a-all", "b-big"]
    right = run_cli(
        ["--url", found["url"], "--json", "hosts", "list"],
        env={"MESSAGEBOX_CONSOLE_TOKEN": found["token"]},
    )
    assert right.returncode == 0, right.stderr
    assert sorted(h["name"] for h in json.loads(right.stdout)) == ["alpha", "beta"]


def test_an_endpoint_file_left_by_a_dead_process_is_ignored(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with MessageBox(url):
        pass
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    endpoint = endpoint_file(tmp_path / "store.duckdb")
    for pid in (int(dead.stdout), os.getpid()):  # ended; alive but not serving there
        endpoint.write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": pid, "token": "t"}))
        endpoint.chmod(0o600)
        done = run_cli(["--url", url, "stats"])
        assert done.returncode == 0, done.stderr
        assert f"ignoring {str(endpoint)!r}: process {pid} does not answer" in done.stderr
    endpoint.chmod(0o666)  # others could have written it: refused, not followed
    refused = run_cli(["--url", url, "stats"])
    assert refused.returncode == 1
    assert "not trusted" in refused.stderr


def test_the_console_process_serves_commands_too(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("h")
        box.publish([Message(b"x", promoted={"a.B": 1})])  # a routing failure
    port = free_port()
    proc = background("--url", url, "console", "--port", str(port))
    try:
        wait_for(endpoint_file(tmp_path / "store.duckdb").exists, "endpoint file", proc)
        listed = cli(url, "--json", "suspended", "list")
        assert listed.returncode == 0, listed.stderr
        [entry] = json.loads(listed.stdout)
        assert entry["reason"] == "routing-failure"
        again = cli(url, "console")
        assert again.returncode == 0
        assert f"serves the console: http://127.0.0.1:{port}/" in again.stderr
        stop(proc)
    finally:
        ended(proc)
    assert not endpoint_file(tmp_path / "store.duckdb").exists()


def test_host_run_serves_commands_on_postgresql_when_asked(pg_url: str) -> None:
    with MessageBox(pg_url):
        pass
    port = free_port()
    token = "a-console-token"
    proc = background(
        "--url",
        pg_url,
        "host",
        "run",
        "tests.apps.pair:alpha",
        "--console",
        f"127.0.0.1:{port}",
        env={"MESSAGEBOX_CONSOLE_TOKEN": token},
    )
    served = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(served + "/", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, "console", proc)
        listed = run_cli(
            ["--url", served, "--json", "instances"], env={"MESSAGEBOX_CONSOLE_TOKEN": token}
        )
        assert listed.returncode == 0, listed.stderr
        assert [i["host"] for i in json.loads(listed.stdout)] == ["alpha"]
        stop(proc)
    finally:
        ended(proc)


def test_spark_commands_run_in_the_process_that_holds_the_store(
    served: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    url, proc = served
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.csv").write_text("key,t.N\n1,3\n2,7\n3,9\n")
    # relative paths: the serving process reads and writes them in this directory
    done = subprocess.run(
        [sys.executable, "-m", "messagebox.cli", "--url", url, "spark", "route",
         "--input", "in.csv", "--output", "out", "--master", "local[1]"],
        cwd=work, env=process_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "done: 5 (message, subscription) pairs" in done.stderr  # a-all 3, b-big 2
    counts = {
        line.split("\t")[1]: int(line.split("\t")[3]) for line in done.stdout.splitlines()[1:]
    }
    assert counts == {"a-all": 3, "b-big": 2}
    assert {p.name.split("=")[0] for p in (work / "out").iterdir() if p.is_dir()} == {
        "subscription"
    }
    assert proc.poll() is None  # the hosts run on
