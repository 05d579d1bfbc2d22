"""The console in an incident, on both backends: an operator logs in (session cookie,
CSRF token on every action, reader and operator roles), finds the failures grouped,
resumes, terminates or reroutes a group, a selection or all matching a filter after a
confirmation with the count, pages through the suspended entries, and every action is in
the audit log, beside the command line's."""

from __future__ import annotations

import re
import uuid
import warnings

import pytest

from messagebox import Message, MessageBox
from messagebox.claims import Failure
from messagebox.console import create_app, pages
from messagebox.console.auth import COOKIE
from messagebox.delivery import leases
from messagebox.models import HostSettings
from messagebox.predicates import P
from tests.cli_support import run_cli
from tests.conftest import claim

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "operator-secret"
READ = "reader-secret"


def browser(box: MessageBox, read_token: str | None = None) -> TestClient:
    return TestClient(
        create_app(box, token=TOKEN, read_token=read_token),
        base_url="http://127.0.0.1:8080",
        follow_redirects=False,
    )


def fail(box: MessageBox, host: str, errors: list[str]) -> None:
    """Suspend one queued entry of ``host`` per error, as a failing service would."""
    claims = claim(box, host, n=len(errors), owner="worker")
    assert len(claims) == len(errors)
    failures = [Failure(c, e, permanent=True) for c, e in zip(claims, errors, strict=True)]
    with box.store.transaction(serial=True) as conn:
        leases.finish(conn, box.store.dialect, "worker", [], failures, HostSettings(), set())


@pytest.fixture
def incident(box: MessageBox) -> MessageBox:
    """Seven failed deliveries in two groups (a timeout on any id, a refused total), and
    two routing failures."""
    box.create_host("billing")
    box.subscribe("bill", host="billing", filter=P("t.N") >= 0, name="bill-all")
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(7)])
    ids = [str(uuid.uuid4()) for _ in range(5)]
    fail(
        box,
        "billing",
        [
            f"Traceback...\nTimeoutError: no answer for order {i} after 3{i}.5 s ({ids[i]})"
            for i in range(5)
        ]
        + [f"ValueError: total '{t}' is not allowed" for t in ("12.5", "99")],
    )
    box.publish([Message(b"r", promoted={"u.X": i}) for i in range(2)])  # match nothing
    return box


def login(b: TestClient, token: str = TOKEN, name: str = "ada") -> str:
    done = b.post("/login", data={"name": name, "token": token, "next": "/failures"})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/failures"
    assert COOKIE in b.cookies
    page = b.get("/failures").text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def group_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="group-([0-9a-f]+)">', html)


def test_failures_are_grouped_by_how_they_failed(incident: MessageBox) -> None:
    groups = incident.failure_groups()
    assert [(g.reason, g.exception, g.count) for g in groups[:1]] == [
        ("delivery-failure", "TimeoutError", 5)
    ]
    assert {(g.reason, g.exception, g.count) for g in groups[1:]} == {
        ("delivery-failure", "ValueError", 2),
        ("routing-failure", None, 2),
    }
    assert groups[0].message == "no answer for order <n> after <n> s (<id>)"
    assert groups[0].service == "bill"
    html = browser(incident).get("/failures").text
    assert group_ids(html) == [g.id for g in groups]
    assert "no answer for order &lt;n&gt;" in html


def test_an_operator_logs_in_and_resumes_a_group_after_confirming(incident: MessageBox) -> None:
    b = browser(incident)
    csrf = login(b)
    timeout_group = incident.failure_groups()[0]
    # the first post asks to confirm, with the count, and changes nothing
    asked = b.post(
        "/suspended/bulk", data={"action": "resume", "group": timeout_group.id, "csrf": csrf}
    )
    assert asked.status_code == 200, asked.text
    assert '<p id="confirm-count"><strong>5</strong> entries' in asked.text
    assert incident.count_suspended() == 9
    done = b.post(
        "/suspended/bulk",
        data={"action": "resume", "group": timeout_group.id, "csrf": csrf, "confirm": "yes"},
    )
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/failures?done=resumed&n=5"
    assert incident.count_suspended() == 4
    assert "5 entries resumed." in b.get(done.headers["location"]).text
    [row, *_] = incident.audit_log()
    assert (row.who, row.role, row.via, row.action, row.count, row.detail) == (
        "token:admin",  # the console token's service account: no self-declared name
        "admin",
        "console",
        "resume (bulk)",
        5,
        "from testclient",
    )
    assert "resume (bulk)" in b.get("/audit").text


def test_session_actions_need_the_csrf_token_and_an_operator(incident: MessageBox) -> None:
    b = browser(incident, read_token=READ)
    csrf = login(b)
    [entry, *_] = incident.suspended()
    for data in ({}, {"csrf": "forged"}):
        refused = b.post(f"/suspended/{entry.id}/terminate", data=data)
        assert refused.status_code == 403
        assert "nothing was changed" in refused.text
    assert incident.count_suspended() == 9
    reader = browser(incident, read_token=READ)
    reader_csrf = login(reader, token=READ, name="bob")
    refused = reader.post(f"/suspended/{entry.id}/terminate", data={"csrf": reader_csrf})
    assert refused.status_code == 403
    assert "reader" in refused.text
    assert incident.count_suspended() == 9
    done = b.post(f"/suspended/{entry.id}/terminate", data={"csrf": csrf})
    assert done.status_code == 303
    assert incident.count_suspended() == 8
    logged_out = b.post("/logout", data={"csrf": csrf})
    assert logged_out.status_code == 303
    again = b.post(f"/suspended/{entry.id}/terminate", data={"csrf": csrf})
    assert again.status_code == 303
    assert again.headers["location"].startswith("/login?next=")  # sent to log in again
    assert incident.count_suspended() == 8


def test_with_a_read_token_every_page_needs_a_login(incident: MessageBox) -> None:
    b = browser(incident, read_token=READ)
    away = b.get("/suspended?reason=routing-failure")
    assert away.status_code == 303
    assert away.headers["location"] == "/login?next=/suspended%3Freason%3Drouting-failure"
    assert b.post("/login", data={"token": "wrong"}).status_code == 403
    login(b, token=READ)
    assert b.get("/suspended").status_code == 200
    bearer = browser(incident, read_token=READ).get(
        "/failures", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert bearer.status_code == 200
    assert browser(incident).get("/failures").status_code == 200  # no read token: open


def test_all_matching_a_filter_and_a_selection_reroute_and_terminate(
    incident: MessageBox,
) -> None:
    b = browser(incident)
    csrf = login(b)
    incident.subscribe("catch", host="billing", filter=P("u.X") >= 0, name="catch-u")
    form = {"action": "reroute", "all": "1", "reason": "routing-failure", "csrf": csrf}
    asked = b.post("/suspended/bulk", data=form)
    assert "<strong>2</strong> entries" in asked.text
    done = b.post("/suspended/bulk", data={**form, "confirm": "yes", "back": "/suspended"})
    assert done.headers["location"] == "/suspended?done=rerouted&n=2"
    assert incident.count_suspended(reason="routing-failure") == 0
    catch = incident.subscription("catch-u").id
    assert sum(d.depth for d in incident.queue_depth() if d.subscription == catch) == 2
    picked = [e.id for e in incident.suspended()][:3]
    done = b.post(
        "/suspended/bulk",
        data={
            "action": "terminate",
            "id": [str(i) for i in picked],
            "csrf": csrf,
            "confirm": "yes",
        },
    )
    assert done.headers["location"] == "/failures?done=terminated&n=3"
    assert incident.count_suspended() == 4
    nothing = b.post("/suspended/bulk", data={"action": "terminate", "csrf": csrf})
    assert nothing.status_code == 400
    assert "choose the entries" in nothing.text


def test_the_suspended_list_pages_newest_first(
    incident: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "LIST_LIMIT", 4)
    b = browser(incident)
    newest = [e.id for e in incident.suspended(newest_first=True)]
    first = b.get("/suspended").text
    assert "9 entries; page 1 of 3." in first
    assert re.findall(r'<tr id="entry-(\d+)">', first) == [str(i) for i in newest[:4]]
    third = b.get("/suspended?page=3").text
    assert re.findall(r'<tr id="entry-(\d+)">', third) == [str(newest[8])]
    assert 'id="previous"' in third
    assert 'id="next"' not in third
    oldest = b.get("/suspended?order=oldest").text
    assert re.findall(r'<tr id="entry-(\d+)">', oldest)[0] == str(newest[-1])
    assert b.get("/suspended?page=0").status_code == 400


def test_command_line_actions_are_audited_too(backend_url: str) -> None:
    with MessageBox(backend_url):
        pass
    done = run_cli(["--url", backend_url, "hosts", "add", "h"])
    assert done.returncode == 0, done.stderr
    run_cli(["--url", backend_url, "queues"])  # reads are not audited
    with MessageBox(backend_url) as box:
        [row] = box.audit_log()
    assert (row.via, row.role, row.action) == ("cli", "local", "hosts add")
    assert row.detail == "hosts add h"
    assert "@" in row.who


def test_repeated_wrong_logins_lock_the_address_out_for_a_minute(
    incident: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from messagebox.console import auth

    b = browser(incident)
    for _ in range(5):
        assert b.post("/login", data={"token": "guess"}).status_code == 403
    locked = b.post("/login", data={"token": TOKEN})
    assert locked.status_code == 429
    assert "too many failed logins" in locked.text
    assert COOKIE not in b.cookies
    monkeypatch.setattr(auth, "LOGIN_WINDOW", 0.0)  # the minute has passed
    assert b.post("/login", data={"token": TOKEN}).status_code == 303


def test_a_command_that_fails_is_audited_with_its_error(backend_url: str) -> None:
    with MessageBox(backend_url) as box:
        box.create_host("busy")
        box.subscribe("s", host="busy", filter=P("a.B") == 1)
    refused = run_cli(["--url", backend_url, "hosts", "remove", "busy"])
    assert refused.returncode == 1
    with MessageBox(backend_url) as box:
        [row] = box.audit_log()
    assert row.action == "hosts remove (failed)"
    assert "Conflict: host 'busy' has 1 subscription" in (row.detail or "")
