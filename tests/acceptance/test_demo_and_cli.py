"""The demo and the CLI, run as a user runs them: as subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_demo_routes_every_order_and_prints_where(tmp_path: Path):
    url = f"duckdb:///{tmp_path / 'demo.duckdb'}"
    result = run("examples/orders/demo.py", url)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line[:7].strip().isdigit()]
    assert len(lines) == 20  # one row per order, each with its destinations
    assert all(line.split()[-1] for line in lines)
    assert "Queue depth per host and subscription" in result.stdout


def test_cli_would_route_and_its_exit_codes(tmp_path: Path):
    url = f"duckdb:///{tmp_path / 'cli.duckdb'}"
    from messagebox import MessageBox
    from predicates import P

    with MessageBox(url) as box:
        box.create_host("h")
        sub = box.subscribe("eu", host="h", filter=P("orders.Region") == "EU")

    ok = run(
        "-m", "messagebox.cli", "--url", url, "would-route", json.dumps({"orders.Region": "EU"})
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split("\t")[0] == str(sub.id)

    bad_json = run("-m", "messagebox.cli", "--url", url, "would-route", "{not json")
    assert bad_json.returncode == 2
    assert "not JSON" in bad_json.stderr

    bad_value = run("-m", "messagebox.cli", "--url", url, "would-route", '{"no dot": 1}')
    assert bad_value.returncode == 1
    assert "no dot" in bad_value.stderr


def test_a_second_process_on_one_duckdb_file_gets_a_clear_error(tmp_path: Path):
    from messagebox import MessageBox

    url = f"duckdb:///{tmp_path / 'owned.duckdb'}"
    with MessageBox(url):
        other = run("-m", "messagebox.cli", "--url", url, "hosts")
    assert other.returncode == 1
    assert "use PostgreSQL for several processes" in other.stderr
