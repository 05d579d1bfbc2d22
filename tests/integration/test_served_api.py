"""The management API as the command line meets it over HTTP (uvicorn, as ``host run``
serves it): a command that runs longer than the command line's idle timeout is waited
for (the process sends keep-alive spaces), and a command that fails in the serving
process is an answer, exit code 1, not a broken connection."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messagebox import MessageBox
from messagebox.cli import remote
from messagebox.console import api, create_app
from messagebox.console.background import BackgroundServer
from messagebox.console.served import answer
from tests.cli_support import run_cli

TOKEN = "api-token"


@pytest.fixture
def served(duckdb_url: str) -> Iterator[str]:
    with MessageBox(duckdb_url) as box:
        server = BackgroundServer(create_app(box, api_token=TOKEN), "127.0.0.1", 0)
        url = server.start()
        yield url
        server.stop()


def cli(url: str, *argv: str) -> tuple[int, str, str]:
    done = run_cli(["--url", url, *argv], env={"MESSAGEBOX_CONSOLE_TOKEN": TOKEN})
    return done.returncode, done.stdout, done.stderr


def test_a_command_longer_than_the_idle_timeout_is_waited_for(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle = 0.3
    monkeypatch.setattr(remote, "TIMEOUTS", remote.Timeouts(connect=5.0, idle=idle))
    monkeypatch.setattr(api, "KEEPALIVE_SECONDS", 0.05)
    running = threading.Event()

    def slow(*_: Any) -> dict[str, Any]:
        running.wait(4 * idle)  # nobody sets it: a command that takes 4 idle timeouts
        return answer(0, b"done\n", "", "stats")

    monkeypatch.setattr(api, "serve", slow)

    code, out, err = cli(served, "stats")

    assert (code, out) == (0, "done\n"), err


def test_a_command_that_raises_in_the_serving_process_is_an_answer(
    served: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: Any) -> dict[str, Any]:
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(api, "serve", broken)
    caplog.set_level(logging.INFO, logger="messagebox.console")

    code, _, err = cli(served, "stats")

    assert code == 1
    assert "the serving process failed: RuntimeError: the disk is on fire" in err
    assert any(getattr(r, "event", "") == "cli-served-failed" for r in caplog.records)


def test_a_malformed_request_is_refused_before_anything_runs(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    ran: list[object] = []
    monkeypatch.setattr(api, "serve", lambda *a: ran.append(a))
    bad = {"argv": ["stats"], "files": {"f": "not base64!"}}

    refused = httpx.post(
        f"{served}/api/v1/cli", json=bad, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )

    assert refused.status_code == 400
    assert "base64" in refused.json()["error"]
    assert ran == []


def test_a_request_past_the_size_limit_is_refused_unread(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import http.client
    from urllib.parse import urlsplit

    monkeypatch.setattr(api, "MAX_REQUEST_BYTES", 1000)
    where = urlsplit(served)
    for body, declared in ((b"{" + b" " * 5000 + b"}", None), (b"{}", "999999999999")):
        conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=10)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        if declared is not None:
            headers["Content-Length"] = declared
        conn.request("POST", "/api/v1/cli", body=body, headers=headers)
        answer_ = conn.getresponse()
        assert answer_.status == 413
        assert b"at most 1000 bytes" in answer_.read()
        conn.close()


def test_the_command_line_sends_no_fifo_and_no_oversized_file(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``messagebox publish FIFO`` to a serving process used to read the FIFO (or
    /dev/zero) whole, for ever; the files it sends are regular and bounded."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, _, err = cli(served, "publish", str(fifo), "-p", "a.B=1")
    assert code == 2
    assert "not a regular file" in err or "not a file" in err, err
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2000)
    monkeypatch.setattr(remote, "SENT_FILE_BYTES", 1000)
    code, _, err = cli(served, "publish", str(big), "-p", "a.B=1")
    assert code == 2
    assert "1000" in err, err


def _post(served: str, body: bytes) -> tuple[int, bytes]:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(served)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    conn.request("POST", "/api/v1/cli", body=body, headers=headers)
    got = conn.getresponse()
    data = got.read()
    conn.close()
    return got.status, data


def test_a_body_nested_too_deeply_is_a_bad_request_not_a_server_error(served: str) -> None:
    status, data = _post(served, b'{"argv": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400
    assert b"nested too deeply" in data


def test_help_comes_back_to_the_caller(served: str) -> None:
    code, out, err = cli(served, "queues", "--help")
    assert code == 0, err
    assert "usage: messagebox queues" in out


def test_a_served_command_naming_another_store_is_refused(served: str, tmp_path: Path) -> None:
    other = f"duckdb:///{tmp_path / 'other.duckdb'}"
    status, data = _post(
        served,
        json.dumps({"argv": ["--url", other, "stats"], "files": {}, "stdin": ""}).encode(),
    )
    assert status == 200
    answer_ = json.loads(data)
    assert answer_["exit"] == 2
    assert "names another store" in base64.b64decode(answer_["stderr"]).decode()
