"""The demo and the CLI, run as a user runs them: as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# plain output whatever the CI's terminal settings (rich honours these even into a pipe)
PLAIN = {
    k: v
    for k, v in os.environ.items()
    if k not in {"FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"}
}


def run(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=150,
        env={**PLAIN, "COLUMNS": "200", **(env or {})},
    )


@contextmanager
def busy_cpu() -> Iterator[None]:
    """A second process burning one CPU for the block (bounded: it stops by itself)."""
    spin = "import time\nend = time.time() + 300\nwhile time.time() < end: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def test_the_demo_routes_a_day_of_orders_to_the_predicted_ports_on_a_busy_machine(
    tmp_path: Path,
):
    # Given the demo's order routing on a DuckDB file, with a day large enough that
    # receiving it takes longer than the 3 s an order waits for the rest of its payment
    # (the demo once dropped the payments after the orders: an order's payment then
    # raced its timeout, and lost on a slow or busy machine)
    url = f"duckdb:///{tmp_path / 'demo.duckdb'}"
    # When it runs as `make demo` runs it, while another process keeps a CPU busy
    with busy_cpu():
        result = run(
            *("examples/orders/demo.py", url, "--orders", "2000", "--workdir", str(tmp_path)),
            *("--timeout", "120"),
            env={"ORDERS_PAYMENT_TIMEOUT": "3"},  # the default, whatever the environment
        )
    # Then every outbound folder holds what the reference evaluator predicts, and each
    # web order was shipped and confirmed, or cancelled, as its payments call for
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Every order reached exactly the ports the reference evaluator predicts" in (
        result.stdout
    )
    assert "suspended (receive-failure): 4" in result.stdout
    assert "orders/s" in result.stdout
    # and the inbound folders are empty: every file was published, then deleted
    assert list((tmp_path / "in").iterdir()) == []
    assert list((tmp_path / "payments").iterdir()) == []
    written = {d.name: len(list(d.iterdir())) for d in (tmp_path / "out").iterdir()}
    assert written["errors"] == 4
    assert written["cancellations"] > 0  # the time-out path ran
    assert written["confirmations"] == written["warehouse"] > written["cancellations"]


def test_the_demo_works_in_a_temporary_folder_and_removes_it(tmp_path: Path) -> None:
    # Given no --workdir: the demo works in the system's temporary folder
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    # When it runs a small day there
    result = run("examples/orders/demo.py", "--orders", "200", env={"TMPDIR": str(temporary)})
    # Then it said where, and left nothing behind
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"working folder: {temporary}/messagebox-orders-" in result.stdout.replace("\n", "")
    assert list(temporary.iterdir()) == []


def test_cli_route_explain_and_its_exit_codes(tmp_path: Path):
    url = f"duckdb:///{tmp_path / 'cli.duckdb'}"
    from messagebox import MessageBox
    from messagebox.predicates import P

    with MessageBox(url) as box:
        box.create_host("h")
        sub = box.subscribe("eu", host="h", filter=P("orders.Region") == "EU")

    ok = run(
        "-m",
        "messagebox.cli",
        "--url",
        url,
        "route",
        "explain",
        json.dumps({"orders.Region": "EU"}),
        "--json",
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["routes_to"] == [sub.id]

    bad_json = run("-m", "messagebox.cli", "--url", url, "route", "explain", "{not json")
    assert bad_json.returncode == 2
    assert "not JSON" in bad_json.stderr

    bad_value = run("-m", "messagebox.cli", "--url", url, "route", "explain", '{"no dot": 1}')
    assert bad_value.returncode == 2
    assert "no dot" in bad_value.stderr


def test_a_second_process_on_one_duckdb_file_gets_a_clear_error(tmp_path: Path):
    from messagebox import MessageBox

    url = f"duckdb:///{tmp_path / 'owned.duckdb'}"
    with MessageBox(url):
        other = run("-m", "messagebox.cli", "--url", url, "hosts")
    assert other.returncode == 1
    assert "use PostgreSQL for several processes" in other.stderr
