"""Named users in the console, on both backends: a login by name and password opens a
session kept in the store (an ``HttpOnly``, ``SameSite=Strict`` cookie); wrong
passwords are counted per user and per client; a disabled or removed user's sessions
stop at once, a role change applies on the next request, logout deletes the session;
sessions expire; a reader sees no action and is refused one; the audit log names the
user; no password or session token is ever logged or stored."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.console import auth, create_app
from messagebox.console.auth import SessionSettings
from messagebox.predicates import P
from messagebox.storage import schema
from tests.console_support import COOKIE, PASSWORD, browser, csrf_of, ensure_user, login

TOKEN = "operator-token"


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    """A suspended entry (resumable: its service was unenlisted, then started)."""
    from messagebox import Message

    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("o.R") == "EU", name="ship-eu")
    box.publish([Message(b"<order/>", promoted={"o.R": "EU"})])
    box.set_service_state("ship", "unenlisted")
    box.set_service_state("ship", "started")
    return box


def post_login(client: Any, user: str, password: str, **headers: str) -> Any:
    return client.post("/login", data={"user": user, "password": password}, headers=headers)


def test_a_user_logs_in_by_name_and_password(shop: MessageBox) -> None:
    ensure_user(shop, "alice", "operator")
    client = browser(shop, token=TOKEN)
    form = client.get("/login").text
    assert 'name="user"' in form
    assert 'name="password"' in form
    assert 'id="login-token"' in form  # the service accounts' form too
    done = client.post("/login", data={"user": " Alice ", "password": PASSWORD, "next": "/x"})
    assert done.status_code == 303
    assert done.headers["location"] == "/x"
    cookie = done.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for flag in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=28800"):
        assert flag.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain http
    page = client.get("/").text
    assert '<span id="who">alice (operator)</span>' in page
    # the store keeps the digest of the cookie's token, never the token
    token = client.cookies[COOKIE]
    with shop.store.transaction() as conn:
        [row] = conn.execute(sa.select(schema.session)).all()
    assert row.id == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(tuple(row))
    # over https the cookie is Secure
    secure = create_app(shop, token=TOKEN)
    from starlette.testclient import TestClient

    https = TestClient(secure, base_url="https://127.0.0.1", follow_redirects=False)
    assert "secure" in post_login(https, "alice", PASSWORD).headers["set-cookie"].lower()


def test_wrong_and_unknown_users_get_the_same_answer(shop: MessageBox) -> None:
    ensure_user(shop, "alice", "operator")
    client = browser(shop, token=TOKEN)
    wrong = post_login(client, "alice", "not the password")
    unknown = post_login(client, "mallory", PASSWORD)
    for answer in (wrong, unknown):
        assert answer.status_code == 403
        assert "wrong user or password: not logged in" in answer.text
    assert COOKIE not in client.cookies
    both = client.post("/login", data={"user": "alice", "password": PASSWORD, "token": TOKEN})
    assert both.status_code == 400


@pytest.mark.parametrize(
    ("user", "password"),
    [
        ("a" * 100_000, PASSWORD),  # a huge name
        ("alice\x00\x1b[2J", PASSWORD),  # control characters
        ("alice", "x" * 200_000),  # a huge password: never hashed whole
        ("alice", "\udcff\x00binary"),
    ],
)
def test_hostile_logins_are_refused_plainly(shop: MessageBox, user: str, password: str) -> None:
    ensure_user(shop, "alice", "operator")
    client = browser(shop, token=TOKEN)
    answer = client.post(
        "/login", data={"user": user, "password": password.encode("utf-8", "surrogateescape")}
    )
    assert answer.status_code == 403
    assert len(answer.text) < 5000
    assert "wrong user or password" in answer.text
    assert "\x1b" not in answer.text


def test_failed_logins_lock_out_the_user_and_the_client(shop: MessageBox) -> None:
    ensure_user(shop, "alice", "operator")
    ensure_user(shop, "bob", "operator")
    app = create_app(shop, token=TOKEN, trusted_proxies=["127.0.0.1"])
    from starlette.testclient import TestClient

    proxy = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 1))
    proxy.follow_redirects = False
    # Given five wrong passwords for alice, each from another address
    for i in range(5):
        guess = post_login(
            proxy, "alice", f"guess number {i}", **{"X-Forwarded-For": f"203.0.113.{i}"}
        )
        assert guess.status_code == 403
    # Then alice is locked out from any address, even with her password
    locked = post_login(proxy, "alice", PASSWORD, **{"X-Forwarded-For": "198.51.100.1"})
    assert locked.status_code == 429
    assert "user alice" in locked.text
    assert int(locked.headers["Retry-After"]) > 0
    # while bob logs in from there
    assert (
        post_login(proxy, "bob", PASSWORD, **{"X-Forwarded-For": "198.51.100.1"}).status_code == 303
    )
    # and five failures from one address lock that address out, whichever user
    for i in range(5):
        post_login(proxy, f"user{i}", "guess password", **{"X-Forwarded-For": "192.0.2.9"})
    refused = post_login(proxy, "bob", PASSWORD, **{"X-Forwarded-For": "192.0.2.9"})
    assert refused.status_code == 429
    assert "192.0.2.9" in refused.text


def test_a_disabled_or_removed_user_is_out_at_once(shop: MessageBox) -> None:
    ensure_user(shop, "rita", "reader")  # (with no user left, the console is open to all)
    for end in ("disable", "remove", "password"):
        ensure_user(shop, "alice", "operator")
        shop.set_user_disabled("alice", False)
        client = browser(shop, token=TOKEN)
        login(client, shop, "alice", "operator", page="/suspended")
        assert client.get("/suspended").status_code == 200
        if end == "disable":
            shop.set_user_disabled("alice")
        elif end == "remove":
            shop.remove_user("alice")
        else:
            shop.set_user_password("alice", "another good secret")
        away = client.get("/suspended")
        assert away.status_code == 303
        assert away.headers["location"].startswith("/login")
    shop.set_user_disabled("alice")
    refused = post_login(browser(shop), "alice", "another good secret")
    assert refused.status_code == 403
    assert "user alice is disabled" in refused.text


def test_a_role_change_applies_on_the_next_request(shop: MessageBox) -> None:
    [entry] = shop.suspended()
    client = browser(shop, token=TOKEN)
    csrf = login(client, shop, "rita", "reader", page="/suspended")
    page = client.get("/suspended").text
    assert 'class="resume"' not in page  # a reader sees no action
    assert "rita is a reader" in page
    refused = client.post(f"/suspended/{entry.id}/resume", data={"csrf": csrf})
    assert refused.status_code == 403
    assert "rita is a reader: this needs an operator; nothing was changed" in refused.text
    assert shop.count_suspended() == 1
    shop.set_user_role("rita", "operator")
    assert 'class="resume"' in client.get("/suspended").text
    done = client.post(f"/suspended/{entry.id}/resume", data={"csrf": csrf})
    assert done.status_code == 303
    assert shop.count_suspended() == 0
    [row] = shop.audit_log()
    assert (row.who, row.role, row.via, row.action, row.detail) == (
        "rita",
        "operator",
        "console",
        "resume",
        "from testclient",
    )


def test_forms_need_the_session_s_csrf_token(shop: MessageBox) -> None:
    [entry] = shop.suspended()
    client = browser(shop)
    csrf = login(client, shop, "olga", "operator", page="/suspended")
    for data in ({}, {"csrf": "forged"}, {"csrf": csrf[:-1]}):
        refused = client.post(f"/suspended/{entry.id}/terminate", data=data)
        assert refused.status_code == 403
        assert "CSRF" in refused.text
    other = browser(shop)
    assert login(other, shop, "olga", "operator", page="/suspended") != csrf  # per session
    assert shop.count_suspended() == 1


def test_logout_deletes_the_session(shop: MessageBox) -> None:
    client = browser(shop)
    csrf = login(client, shop, "olga", "operator", page="/suspended")
    token = client.cookies[COOKIE]
    assert shop.open_sessions() == {"olga": 1}
    assert client.post("/logout", data={"csrf": "forged"}).status_code == 403
    out = client.post("/logout", data={"csrf": csrf})
    assert out.status_code == 303
    assert shop.open_sessions() == {}
    replay = browser(shop)
    replay.cookies.set(COOKIE, token)
    assert replay.get("/suspended").status_code == 303  # the old cookie is nothing now


def test_sessions_expire_when_idle_and_after_their_lifetime(shop: MessageBox) -> None:
    settings = SessionSettings(idle=300, lifetime=3600)
    app = create_app(shop, sessions=settings)
    from starlette.testclient import TestClient

    client = TestClient(app, base_url="http://127.0.0.1:8080", follow_redirects=False)
    ensure_user(shop, "olga", "operator")
    done = post_login(client, "olga", PASSWORD)
    assert "max-age=3600" in done.headers["set-cookie"].lower()  # the lifetime
    assert client.get("/suspended").status_code == 200
    s = schema.session
    now_plus = shop.store.dialect.now_plus
    with shop.store.transaction() as conn:  # ten minutes without a request
        conn.execute(s.update().values(last_seen=now_plus(-600.0)))
    assert client.get("/suspended").status_code == 303
    login(client, shop, "olga", "operator", page="/suspended")
    with shop.store.transaction() as conn:  # past its lifetime
        conn.execute(s.update().values(expires_at=now_plus(-1.0)))
    assert client.get("/suspended").status_code == 303
    for idle, lifetime in ((10, 3600), (300, 10), (3600, 300), (300, 10**9)):
        with pytest.raises(ValueError, match="session"):
            SessionSettings(idle=idle, lifetime=lifetime)


def test_a_token_s_session_ends_when_the_token_changes(shop: MessageBox) -> None:
    client = browser(shop, token=TOKEN)
    done = client.post("/login", data={"token": TOKEN})
    assert done.status_code == 303
    assert '<span id="who">token:admin (admin)</span>' in client.get("/").text
    cookie = client.cookies[COOKIE]
    restarted = browser(shop, token=TOKEN)  # the same token: still logged in
    restarted.cookies.set(COOKIE, cookie)
    assert "token:admin (admin)" in restarted.get("/").text
    rotated = browser(shop, token="a-new-token")
    rotated.cookies.set(COOKIE, cookie)
    assert '<span id="who">' not in rotated.get("/").text
    assert shop.open_sessions() == {}


def test_garbage_cookies_are_no_session(shop: MessageBox) -> None:
    ensure_user(shop, "alice", "reader")
    for garbage in ("", "x", "a" * 5000, "../../../etc/passwd", "%C3%BC" * 10, "A" * 43):
        client = browser(shop)
        client.cookies.set(COOKIE, garbage)
        assert client.get("/").status_code == 303


def test_no_password_or_session_token_is_logged(
    shop: MessageBox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ensure_user(shop, "alice", "operator")
    client = browser(shop, token=TOKEN)
    post_login(client, "alice", "a wrong password here")
    post_login(client, "mallory", "another wrong one")
    csrf = login(client, shop, "alice", "operator", page="/suspended")
    client.post("/logout", data={"csrf": csrf})
    client.post("/login", data={"token": TOKEN})
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in (PASSWORD, "a wrong password here", "another wrong one", TOKEN, csrf):
        assert secret not in logged
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("console-login-failed") == 2
    assert "console-login" in events
    assert "console-logout" in events
    [failed, *_] = [r for r in caplog.records if getattr(r, "event", "") == "console-login-failed"]
    assert getattr(failed, "user", None) == "alice"
    assert auth.COOKIE == COOKIE


def test_the_login_page_of_a_console_without_secrets_offers_users_only(box: MessageBox) -> None:
    page = browser(box).get("/login").text
    assert 'id="login"' in page
    assert 'id="login-token"' not in page
    assert csrf_of('<input name="csrf" value="x">') == "x"


@pytest.mark.parametrize(
    "target", ["//evil.example/", "/\\evil.example", "https://evil.example/", "/x\r\nSet-Cookie: a"]
)
def test_after_logging_in_only_a_path_of_the_console_is_followed(
    shop: MessageBox, target: str
) -> None:
    ensure_user(shop, "alice", "reader")
    client = browser(shop)
    done = client.post("/login", data={"user": "alice", "password": PASSWORD, "next": target})
    assert done.status_code == 303
    assert done.headers["location"] == "/"


@pytest.mark.parametrize(
    ("env", "why"),
    [
        (
            {"MESSAGEBOX_CONSOLE_SESSION_IDLE": "1s"},
            "idle time is from 5 minutes to 1 day, not 1 s",
        ),
        ({"MESSAGEBOX_CONSOLE_SESSION_LIFETIME": "90d"}, "from 1 minute to 30 days, not 90 days"),
        ({"MESSAGEBOX_CONSOLE_SESSION_IDLE": "soon"}, "expected an age such as 90s"),
        (
            {"MESSAGEBOX_CONSOLE_SESSION_IDLE": "2h", "MESSAGEBOX_CONSOLE_SESSION_LIFETIME": "1h"},
            "lifetime (1 hour) is shorter than its idle time (2 hours)",
        ),
    ],
)
def test_session_times_out_of_bounds_are_bad_usage(
    duckdb_url: str, env: dict[str, str], why: str
) -> None:
    from tests.cli_support import run_cli

    done = run_cli(["--url", duckdb_url, "console", "--port", "1"], env=env)
    assert done.returncode == 2
    assert why in done.stderr
    assert SessionSettings(idle=1800, lifetime=12 * 3600).lifetime == 43200


def test_logins_past_the_passwords_checked_at_once_are_told_to_come_back(
    shop: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.testclient import TestClient

    from messagebox.console import login as console_login

    ensure_user(shop, "alice", "reader")
    app = create_app(shop)
    client = TestClient(app, base_url="http://127.0.0.1:8080", follow_redirects=False)
    turns = app.state.console.hashing
    for _ in range(auth.HASHING_AT_ONCE):  # every turn taken by logins under way
        assert turns.acquire(timeout=1)
    monkeypatch.setattr(console_login, "HASHING_WAIT_SECONDS", 0.05)
    answer = post_login(client, "alice", PASSWORD)
    assert answer.status_code == 503
    assert "too many logins at once" in answer.text
    for _ in range(auth.HASHING_AT_ONCE):
        turns.release()
    assert post_login(client, "alice", PASSWORD).status_code == 303
