"""``messagebox host run``, ``instances`` and ``cleanup`` as a user runs them, on the
embedded default (DuckDB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from messagebox import Message, MessageBox
from predicates import P

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "messagebox.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_host_run_delivers_then_cleanup_empties(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("workers", poll_max_seconds=0.1)
        box.subscribe("record", host="workers", filter=P("t.N") >= 0, name="record-all")
        box.publish(Message(b"x", promoted={"t.N": i}) for i in range(50))
    out = tmp_path / "out"
    out.mkdir()
    done = cli(
        "--url",
        url,
        "host",
        "run",
        "tests.apps.recorder:app",
        "--duration",
        "3",
        env={"MB_TEST_OUT": str(out)},
    )
    assert done.returncode == 0, done.stderr
    assert "running; Ctrl-C stops it" in done.stderr
    lines = [line for f in out.glob("*.log") for line in f.read_text().splitlines()]
    assert len(lines) == 50
    cleaned = cli("--url", url, "cleanup")
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.startswith("deleted 50 messages and 50 parts")
    listed = cli("--url", url, "instances")
    assert (listed.returncode, listed.stdout) == (0, "")  # it unregistered on the way out


def test_host_run_names_a_bad_target(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'box.duckdb'}"
    done = cli("--url", url, "host", "run", "tests.apps.nowhere:app")
    assert done.returncode == 1
    assert "cannot import 'tests.apps.nowhere'" in done.stderr
    done = cli("--url", url, "host", "run", "tests.apps.recorder:record")
    assert done.returncode == 1
    assert "is not a HostApp" in done.stderr
