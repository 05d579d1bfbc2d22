"""Lifecycle on both backends, from Python, the command line and the console: a
subscription's filter changed in place (its id and waiting entries kept, the routing
index of a running process follows), an empty host removed (a busy one refused, saying
what is left)."""

from __future__ import annotations

import warnings

import pytest

from messagebox import Message, MessageBox
from messagebox.errors import Conflict, FilterValidationError, UnknownHost, UnknownSubscription
from messagebox.predicates import P, format_filter
from tests.cli_support import run_cli
from tests.conftest import table_counts
from tests.console_support import login

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "lifecycle-token"


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    box.publish([Message(b"eu", promoted={"orders.Region": "EU"})])  # waits on the queue
    return box


def test_a_filter_is_changed_in_place(shop: MessageBox) -> None:
    before = shop.subscription("ship-eu")
    predicates_before = table_counts(shop)["mb_predicate"]
    after = shop.set_filter("ship-eu", P("orders.Region").in_(["EU", "UK"]))
    assert (after.id, after.name, after.host, after.service) == (
        before.id,
        before.name,
        before.host,
        before.service,
    )
    assert format_filter(after.filter) == 'orders.Region in ["EU", "UK"]'
    assert [(d.subscription, d.depth) for d in shop.queue_depth()] == [(before.id, 1)]  # kept
    [uk] = shop.publish([Message(b"uk", promoted={"orders.Region": "UK"})])
    assert uk.subscriptions == (before.id,)  # this process's routing index follows
    assert table_counts(shop)["mb_predicate"] == predicates_before  # the old one is gone
    with pytest.raises(UnknownSubscription):
        shop.set_filter("nope", P("a.B") == 1)
    with pytest.raises(FilterValidationError):
        shop.set_filter("ship-eu", "not a filter")
    assert format_filter(shop.subscription("ship-eu").filter) == 'orders.Region in ["EU", "UK"]'


def test_another_process_routes_by_the_new_filter(shop: MessageBox, backend_url: str) -> None:
    with MessageBox(backend_url) as other:
        other.publish([Message(b"x", promoted={"orders.Region": "EU"})])  # index loaded
        shop.set_filter("ship-eu", P("orders.Region") == "US")
        [us, eu] = other.publish(
            [
                Message(b"us", promoted={"orders.Region": "US"}),
                Message(b"eu", promoted={"orders.Region": "EU"}),
            ]
        )
    assert us.subscriptions == (shop.subscription("ship-eu").id,)
    assert eu.subscriptions == ()
    with MessageBox(backend_url, router="sql") as in_sql:  # the set-based router agrees
        [us, eu] = in_sql.publish(
            [
                Message(b"us", promoted={"orders.Region": "US"}),
                Message(b"eu", promoted={"orders.Region": "EU"}),
            ]
        )
    assert us.subscriptions == (shop.subscription("ship-eu").id,)
    assert eu.subscriptions == ()


def test_only_an_empty_host_is_removed(shop: MessageBox) -> None:
    with pytest.raises(Conflict, match="has 1 subscription"):
        shop.remove_host("shipping")
    shop.create_host("spare")
    shop.remove_host("spare")
    assert [h.name for h in shop.hosts()] == ["shipping"]
    with pytest.raises(UnknownHost):
        shop.remove_host("spare")
    shop.unsubscribe("ship-eu")  # its waiting entry is suspended on the host
    with pytest.raises(Conflict, match="1 suspended entries"):
        shop.remove_host("shipping")
    [entry] = shop.suspended()
    shop.terminate(entry.id)
    shop.remove_host("shipping")
    assert shop.hosts() == []


def test_the_command_line_changes_filters_and_removes_hosts(
    shop: MessageBox, backend_url: str
) -> None:
    sub = shop.subscription("ship-eu")
    done = run_cli(
        [
            "--url",
            backend_url,
            "subscriptions",
            "set-filter",
            "ship-eu",
            "--filter",
            'orders.Region == "FR"',
        ]
    )
    assert done.returncode == 0, done.stderr
    assert f"subscription {sub.id} 'ship-eu': orders.Region == \"FR\"" in done.stdout
    bad = run_cli(
        ["--url", backend_url, "subscriptions", "set-filter", "ship-eu", "--filter", "x =="]
    )
    assert bad.returncode == 2
    busy = run_cli(["--url", backend_url, "hosts", "remove", "shipping"])
    assert busy.returncode == 1
    assert "remove them first" in busy.stderr
    run_cli(["--url", backend_url, "hosts", "add", "spare"])
    gone = run_cli(["--url", backend_url, "hosts", "remove", "spare"])
    assert gone.returncode == 0, gone.stderr
    assert [r.action for r in shop.audit_log()][:2] == ["hosts remove", "hosts add"]


def test_the_console_changes_filters_services_and_removes_hosts(shop: MessageBox) -> None:
    from messagebox.console import create_app

    b = TestClient(create_app(shop, token=TOKEN), base_url="http://127.0.0.1:8080")
    b.follow_redirects = False
    sub = shop.subscription("ship-eu")
    # the token is the store owner's (an admin service account); a named admin too
    assert (
        f'id="edit-{sub.id}"'
        in b.get("/subscriptions", headers={"Authorization": f"Bearer {TOKEN}"}).text
    )
    csrf = login(b, shop, "ada", "admin", page="/subscriptions")
    page = b.get("/subscriptions").text
    assert f'id="edit-{sub.id}"' in page
    done = b.post(
        f"/subscriptions/{sub.id}/filter", data={"filter": 'orders.Region == "DE"', "csrf": csrf}
    )
    assert done.status_code == 303, done.text
    assert format_filter(shop.subscription(sub.id).filter) == 'orders.Region == "DE"'
    assert "filter is now" in b.get(done.headers["location"]).text
    refused = b.post(f"/subscriptions/{sub.id}/filter", data={"filter": "x ==", "csrf": csrf})
    assert refused.status_code == 400
    assert format_filter(shop.subscription(sub.id).filter) == 'orders.Region == "DE"'
    stopped = b.post("/services/stop", data={"service": "ship", "csrf": csrf})
    assert stopped.status_code == 303
    assert shop.subscription(sub.id).state.value == "stopped"
    busy = b.post("/hosts/remove", data={"host": "shipping", "csrf": csrf})
    assert busy.status_code == 409
    shop.create_host("spare")
    assert 'id="remove-spare"' in b.get("/").text
    assert b.post("/hosts/remove", data={"host": "spare", "csrf": csrf}).status_code == 303
    assert [h.name for h in shop.hosts()] == ["shipping"]
    page = b.get("/").text
    assert 'id="settings-shipping"' in page
    assert "claim_batch=10" in page  # the current settings, one per line
    changed = b.post(
        "/hosts/settings",
        data={"host": "shipping", "settings": "claim_batch=25\nunserved=refuse\n", "csrf": csrf},
    )
    assert changed.status_code == 303, changed.text
    settings = shop.host("shipping").settings
    assert (settings.claim_batch, settings.unserved) == (25, "refuse")
    bad = b.post(
        "/hosts/settings",
        data={"host": "shipping", "settings": "claim_batch=0\nnope=1", "csrf": csrf},
    )
    assert bad.status_code == 400
    assert "claim_batch" in bad.text
    assert shop.host("shipping").settings.claim_batch == 25  # nothing changed
    rows = shop.audit_log()
    actions = [r.action for r in rows]
    assert actions[:4] == ["hosts set", "hosts remove", "services stop", "subscriptions set-filter"]
    assert {(r.who, r.role) for r in rows[:4]} == {("ada", "admin")}


def test_a_host_removal_waits_for_a_subscribe_to_it_in_flight(box: MessageBox) -> None:
    import threading

    from messagebox.specs import check_spec
    from messagebox.storage import store_clock, subscriptions

    box.create_host("h2")
    spec = check_spec(0, {"service": "svc", "host": "h2", "filter": P("a.B") == 1})
    outcome: list[BaseException | None] = []
    with box.store.transaction(serial=box.one_process) as conn:  # a subscribe, not committed
        subscriptions.subscribe(conn, box.store.dialect, [spec], store_clock.now(conn))

        def remove() -> None:
            trying.set()
            try:
                box.remove_host("h2")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        trying = threading.Event()
        remover = threading.Thread(target=remove)
        remover.start()
        assert trying.wait(30)
        remover.join(1.0)
        assert remover.is_alive()  # it waits for the subscribe's lock
    remover.join(30)
    [result] = outcome
    assert isinstance(result, Conflict)  # it sees the subscription that committed
    assert "h2" in [h.name for h in box.hosts()]


def test_a_host_with_a_pending_timer_is_not_removed(box: MessageBox) -> None:
    import sqlalchemy as sa

    from messagebox.storage import schema, store_clock

    box.create_host("timed")
    with box.store.transaction() as conn:
        now = store_clock.now(conn)
        conn.execute(
            sa.insert(schema.timer).values(
                id=1,
                instance_id="i-1",
                service="svc",
                host="timed",
                sub=1,
                name="t",
                due_at=now,
                created_at=now,
            )
        )
    with pytest.raises(Conflict, match="1 pending timers"):
        box.remove_host("timed")
    assert "timed" in [h.name for h in box.hosts()]
