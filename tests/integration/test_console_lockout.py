"""The console's lock-out of addresses that guess secrets: it counts the socket peer (a
forged ``X-Forwarded-For`` changes nothing unless the operator names trusted proxies,
and then the client is read from the right), and it counts wrong bearer tokens on
pages and on the management API as it counts failed logins."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import httpx
import pytest

from messagebox import MessageBox
from messagebox.console import create_app
from messagebox.console.background import BackgroundServer

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "operator-secret"


@pytest.fixture
def box(duckdb_url: str) -> Iterator[MessageBox]:
    with MessageBox(duckdb_url) as opened:
        yield opened


@pytest.fixture
def served(box: MessageBox) -> Iterator[str]:
    """The console served by uvicorn, as ``messagebox console`` and ``host run`` serve it."""
    server = BackgroundServer(create_app(box, token=TOKEN, api_token=TOKEN), "127.0.0.1", 0)
    url = server.start()
    yield url
    server.stop()


def test_a_forged_x_forwarded_for_does_not_escape_the_lock_out(served: str) -> None:
    with httpx.Client(base_url=served, timeout=10) as browser:
        for i in range(5):
            guess = browser.post(
                "/login", data={"token": "guess"}, headers={"X-Forwarded-For": f"203.0.113.{i}"}
            )
            assert guess.status_code == 403
        locked = browser.post(
            "/login", data={"token": TOKEN}, headers={"X-Forwarded-For": "203.0.113.99"}
        )

    assert locked.status_code == 429
    assert "127.0.0.1" in locked.text
    assert int(locked.headers["Retry-After"]) > 0


def test_the_log_names_the_socket_peer_not_a_forged_address(
    served: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="messagebox.console")

    with httpx.Client(base_url=served, timeout=10) as browser:
        browser.post("/login", data={"token": "x"}, headers={"X-Forwarded-For": "203.0.113.7"})

    [failed] = [r for r in caplog.records if getattr(r, "event", "") == "console-login-failed"]
    assert getattr(failed, "client", None) == "127.0.0.1"


def test_wrong_bearer_tokens_on_the_api_count_towards_the_lock_out(box: MessageBox) -> None:
    api = TestClient(create_app(box, token=TOKEN, api_token=TOKEN), base_url="http://127.0.0.1")
    for _ in range(5):
        guess = api.get("/api/v1/status", headers={"Authorization": "Bearer guess"})
        assert guess.status_code == 403

    right = api.get("/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})

    assert right.status_code == 429
    assert "too many failed" in right.json()["error"]


def test_wrong_bearer_tokens_on_pages_count_towards_the_lock_out(box: MessageBox) -> None:
    browser = TestClient(
        create_app(box, token=TOKEN), base_url="http://127.0.0.1", follow_redirects=False
    )
    for _ in range(5):  # an open page shows a right token's holder more: an oracle
        browser.get("/", headers={"Authorization": "Bearer guess"})

    login = browser.post("/login", data={"token": TOKEN})

    assert login.status_code == 429


def test_one_wrong_token_counts_once_however_often_a_request_checks_it(box: MessageBox) -> None:
    browser = TestClient(
        create_app(box, token=TOKEN), base_url="http://127.0.0.1", follow_redirects=False
    )
    for _ in range(4):  # each is checked by the action, then by the error page
        refused = browser.post("/suspended/1/resume", headers={"Authorization": "Bearer x"})
        assert refused.status_code == 403

    assert browser.post("/login", data={"token": TOKEN}).status_code == 303


def test_behind_trusted_proxies_the_client_is_read_from_the_right(box: MessageBox) -> None:
    app = create_app(box, token=TOKEN, trusted_proxies=["127.0.0.1", "10.0.0.0/8"])
    proxy = TestClient(
        app, base_url="http://127.0.0.1", follow_redirects=False, client=("127.0.0.1", 40000)
    )
    for i in range(5):  # the leftmost entry is the client's own, forged at will
        forwarded = f"198.51.100.{i}, 203.0.113.5, 10.1.2.3"
        guess = proxy.post("/login", data={"token": "x"}, headers={"X-Forwarded-For": forwarded})
        assert guess.status_code == 403

    locked = proxy.post(
        "/login", data={"token": TOKEN}, headers={"X-Forwarded-For": "203.0.113.5, 10.1.2.3"}
    )
    another = proxy.post(
        "/login", data={"token": TOKEN}, headers={"X-Forwarded-For": "203.0.113.6, 10.1.2.3"}
    )

    assert locked.status_code == 429
    assert "203.0.113.5" in locked.text
    assert another.status_code == 303


def test_a_peer_that_is_not_a_trusted_proxy_forwards_nothing(box: MessageBox) -> None:
    app = create_app(box, token=TOKEN, trusted_proxies=["10.0.0.0/8"])
    direct = TestClient(
        app, base_url="http://127.0.0.1", follow_redirects=False, client=("192.0.2.9", 40000)
    )
    for i in range(5):
        forwarded = {"X-Forwarded-For": f"198.51.100.{i}"}
        assert direct.post("/login", data={"token": "x"}, headers=forwarded).status_code == 403

    locked = direct.post("/login", data={"token": TOKEN}, headers={"X-Forwarded-For": "10.9.9.9"})

    assert locked.status_code == 429
    assert "192.0.2.9" in locked.text


def test_a_malformed_trusted_proxy_is_refused_naming_it(box: MessageBox) -> None:
    with pytest.raises(ValueError, match="not-an-address"):
        create_app(box, token=TOKEN, trusted_proxies=["not-an-address"])


def test_a_malformed_trusted_proxy_setting_is_bad_usage(duckdb_url: str) -> None:
    from tests.cli_support import run_cli

    done = run_cli(
        ["--url", duckdb_url, "console", "--port", "1"],
        env={"MESSAGEBOX_CONSOLE_TRUSTED_PROXIES": "10.0.0.1, proxy.example"},
    )

    assert done.returncode == 2
    assert "MESSAGEBOX_CONSOLE_TRUSTED_PROXIES" in done.stderr
    assert "proxy.example" in done.stderr
