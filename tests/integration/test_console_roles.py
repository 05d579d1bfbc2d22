"""Every route of the console against every kind of caller, on both backends: each
route has a rule (:data:`messagebox.console.access.RULES`: a route added without one
fails here), and each caller — anonymous, a reader, an operator and an admin logged in
by name, the console token and the read token as bearer tokens — is let through
exactly where its role allows, refused (403) or sent to log in elsewhere."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.console import access, create_app
from messagebox.predicates import P
from tests.console_support import browser, login

TOKEN = "operator-token"
READ = "reader-token"
ROLES = ("reader", "operator", "admin")
PARAMS: dict[str, dict[str, str]] = {
    "set_filter": {"sub": "1"},
    "service_state": {"action": "stop"},
    "scheduled": {"action": "deliver-now"},
    "failure_group": {"group_id": "0" * 16},
    "version": {"number": "1"},
    "suspended_entry": {"entry_id": "999999"},
    "resume": {"entry_id": "999999"},
    "terminate": {"entry_id": "999999"},
    "message": {"message_id": str(uuid.UUID(int=1))},
    "part": {"message_id": str(uuid.UUID(int=1))},
    "instance": {"instance_id": "nope"},
    "terminate_instance": {"instance_id": "nope"},
    "static": {"path": "/console.css"},
}
"""Path parameters for each route that has some (ids of nothing: the allowed get 404)."""


@pytest.fixture
def store(box: MessageBox) -> MessageBox:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("a.N") >= 0, name="s")
    box.publish([Message(b"x", promoted={"a.N": 1})])
    return box


def app_routes(box: MessageBox) -> list[tuple[str, str]]:
    """(name, method) of every route of the console (GET for a mount)."""
    app = create_app(box, token=TOKEN)
    found = []
    for route in app.routes:
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        found += [(getattr(route, "name", ""), m) for m in methods if m != "HEAD"]
    return found


def test_every_route_has_a_rule(store: MessageBox) -> None:
    names = {name for name, _ in app_routes(store)}
    assert names - set(access.RULES) == set(), "routes without a rule: add them to RULES"
    assert set(access.RULES) - names == set(), "rules of no route"
    assert set(access.RULES.values()) <= {access.PUBLIC, access.API, *ROLES}
    methods: dict[str, set[str]] = {}
    for name, method in app_routes(store):
        methods.setdefault(name, set()).add(method)
    for name, posted in methods.items():  # what only changes needs an operator at least
        if posted == {"POST"} and access.RULES[name] not in (access.PUBLIC, access.API):
            assert access.RULES[name] in ("operator", "admin"), name
    assert {n for n, r in access.RULES.items() if r == "admin"} == {
        "set_filter",
        "host_settings",
        "remove_host",
    }


def callers(box: MessageBox) -> dict[str, tuple[Any, dict[str, str], str]]:
    """Each kind of caller: its client, its headers, and the CSRF token its forms carry."""
    made: dict[str, tuple[Any, dict[str, str], str]] = {}
    for role in ROLES:
        client = browser(box, token=TOKEN, read_token=READ)
        made[role] = (client, {}, login(client, box, f"{role}-user", role, page="/"))
    made["anonymous"] = (browser(box, token=TOKEN, read_token=READ), {}, "")
    for secret, role in ((TOKEN, "token:admin"), (READ, "token:reader")):
        client = browser(box, token=TOKEN, read_token=READ)
        made[role] = (client, {"Authorization": f"Bearer {secret}"}, "")
    return made


ROLE_OF = {"token:admin": "admin", "token:reader": "reader", "anonymous": None}


def test_each_caller_reaches_exactly_the_routes_its_role_allows(store: MessageBox) -> None:
    from messagebox.ops.passwords import at_least

    made = callers(store)
    checked = 0
    for name, method in app_routes(store):
        rule = access.RULES[name]
        if rule in (access.PUBLIC, access.API):
            continue
        for who, (client, headers, csrf) in made.items():
            path = client.app.url_path_for(name, **PARAMS.get(name, {}))
            data = {"csrf": csrf} if method == "POST" and csrf else None
            answer = client.request(method, path, headers=headers, data=data)
            role = ROLE_OF.get(who, who)
            where = f"{who} {method} {path} ({rule})"
            if at_least(role, rule):
                assert answer.status_code not in (401, 403), (where, answer.text[:500])
                assert "/login" not in answer.headers.get("location", ""), where
            elif role is None and name in access.SCRAPES:
                assert answer.status_code == 401, where
            elif role is None:
                assert answer.status_code == 303, where
                assert answer.headers["location"].startswith("/login?next="), where
            else:
                assert answer.status_code == 403, (where, answer.text[:500])
                assert f"this needs a{'n' if rule[0] in 'aeo' else ''} {rule}" in answer.text
            checked += 1
    assert checked > 150
    assert store.audit_log() == []  # no refused request changed anything


def test_the_public_routes_and_the_api_need_no_login(store: MessageBox) -> None:
    client = browser(store, token=TOKEN, read_token=READ, api_token="api-token")
    assert client.get("/login").status_code == 200
    assert client.get("/static/console.css").status_code == 200
    assert client.post("/logout").status_code == 303
    # the API checks its own token, whoever is logged in
    login(client, store, "ada", "admin", page="/")
    assert client.get("/api/v1/status").status_code == 401
    ok = client.get("/api/v1/status", headers={"Authorization": "Bearer api-token"})
    assert ok.status_code == 200


def test_a_route_without_a_rule_needs_an_admin(
    store: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = dict(access.RULES)
    del rules["overview"]
    monkeypatch.setattr(access, "RULES", rules)
    reader, admin = browser(store), browser(store)
    login(reader, store, "rita", "reader", page="/suspended")
    login(admin, store, "ada", "admin", page="/suspended")
    assert reader.get("/").status_code == 403
    assert admin.get("/").status_code == 200


def test_an_unknown_path_says_nothing_to_a_stranger(store: MessageBox) -> None:
    store.add_user("ada", "admin", "correct horse battery")
    stranger = browser(store)
    assert stranger.get("/no/such/page").headers["location"] == "/login?next=/no/such/page"
    login(stranger, store, "ada", "admin", page="/")
    assert stranger.get("/no/such/page").status_code == 404


def test_an_open_console_reads_to_anyone_and_takes_the_token_for_actions(
    store: MessageBox,
) -> None:
    # Given a console with a token, no read token and no user: open, as before
    anyone = browser(store, token=TOKEN)
    assert anyone.get("/").status_code == 200
    assert anyone.post("/suspended/999999/resume", data={"token": TOKEN}).status_code == 404
    assert anyone.post("/suspended/999999/resume").status_code == 403
    # the console token is the store owner's: an admin service account
    admin_only = anyone.post("/hosts/remove", data={"host": "h", "token": TOKEN})
    assert admin_only.status_code != 403, admin_only.text
    # When the first user is added, the console needs a login
    store.add_user("rita", "reader", "correct horse battery")
    assert anyone.get("/").headers["location"] == "/login?next=/"
