"""Scheduled delivery and expiry as an operator meets them, on both backends: the
command line publishes with times, lists, delivers now and cancels scheduled entries
(audited), subscribes with ``--on-expiry`` and resumes expired entries with a new
expiry; the console shows a subscription's scheduled entries and delivers them now or
cancels them behind its token (audited); a routing file declares ``on_expiry`` and a
host's ``message_ttl_seconds``, applied in place."""

from __future__ import annotations

import json
import warnings
from datetime import timedelta

import pytest

from messagebox import Message, MessageBox
from messagebox.models import EXPIRED
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.cli_support import run_cli
from tests.conftest import claim, table_counts

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "time-token"


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    return box


def _cli(url: str, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    done = run_cli(["--url", url, *args], stdin=stdin)
    return done.returncode, done.stdout, done.stderr


def test_the_command_line_schedules_lists_delivers_now_and_cancels(
    shop: MessageBox, backend_url: str
) -> None:
    # Publish two messages an hour late, one expiring in two hours
    code, out, err = _cli(
        backend_url, "publish", "-p", "orders.Region=EU", "--delay", "1h", "--ttl", "2h", stdin=b"x"
    )
    assert code == 0, err
    code, out, err = _cli(
        backend_url,
        "publish",
        "-p",
        "orders.Region=EU",
        "--deliver-at",
        (shop.now() + timedelta(hours=1)).isoformat(),
        stdin=b"y",
    )
    assert code == 0, err
    code, out, _ = _cli(backend_url, "queues")
    assert "SCHEDULED" in out
    assert "2 (next at " in out
    code, out, _ = _cli(backend_url, "--json", "scheduled", "list", "--subscription", "ship-eu")
    listed = json.loads(out)
    assert len(listed) == 2
    assert sum(e["expires_at"] is not None for e in listed) == 1
    first, second = (e["id"] for e in listed)
    # Deliver one now by id, cancel the other by subscription
    code, out, err = _cli(backend_url, "scheduled", "deliver-now", str(first))
    assert (code, out.strip()) == (0, f"delivered now 1 entry: {first}"), err
    code, out, err = _cli(backend_url, "scheduled", "cancel", "--subscription", "ship-eu")
    assert (code, out.strip()) == (0, f"cancelled 1 entry: {second}"), err
    assert shop.scheduled() == []
    assert len(claim(shop, "shipping", n=5)) == 1
    # Both actions are audited, with how many entries they changed
    audit = [(r.action, r.count) for r in shop.audit_log()[:2]]
    assert audit == [("scheduled cancel", 1), ("scheduled deliver-now", 1)]
    # and what is not scheduled is refused, as not found
    code, _, err = _cli(backend_url, "scheduled", "cancel", str(first))
    assert code == 3
    assert f"no scheduled entry {first}" in err
    code, _, err = _cli(backend_url, "scheduled", "cancel")
    assert code == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--deliver-at", "2030-01-01T00:00:00"], "has no zone"),
        (["--deliver-at", "tomorrow"], "expected an ISO 8601 time"),
        (["--delay", "soon"], "expected an age"),
        (["--delay", "400d"], "delay must be at most 365 days"),
        (["--ttl", "400d"], "ttl must be at most 365 days"),
        (
            ["--deliver-at", "2031-01-01T00:00:00Z", "--expires-at", "2030-01-01T00:00:00Z"],
            "is not before expires_at",
        ),
        (["--delay", "2h", "--ttl", "1h"], "not before its expiry"),
    ],
)
def test_the_command_line_refuses_bad_times_and_stores_nothing(
    shop: MessageBox, backend_url: str, args: list[str], said: str
) -> None:
    before = table_counts(shop)
    code, _, err = _cli(backend_url, "publish", "-p", "orders.Region=EU", *args, stdin=b"x")
    assert code in (1, 2)
    assert said in err
    assert table_counts(shop) == before


def test_the_command_line_subscribes_with_on_expiry_and_resumes_with_a_new_ttl(
    shop: MessageBox, backend_url: str
) -> None:
    code, out, err = _cli(
        backend_url,
        "subscriptions",
        "add",
        "drain",
        "--host",
        "shipping",
        "--filter",
        'orders.Region == "EU"',
        "--on-expiry",
        "drop",
    )
    assert code == 0, err
    assert shop.subscription("drain").on_expiry == "drop"
    code, out, _ = _cli(backend_url, "subscriptions", "list")
    assert "ON EXPIRY" in out
    assert "drop" in out
    code, out, _ = _cli(backend_url, "--json", "subscriptions", "list")
    assert {s["name"]: s["on_expiry"] for s in json.loads(out)} == {
        "ship-eu": "suspend",
        "drain": "drop",
    }
    code, _, err = _cli(
        backend_url, "subscriptions", "add", "x", "--host", "shipping", "--filter", "a.B == 1",
        "--on-expiry", "keep",
    )  # fmt: skip
    assert code == 2
    assert "invalid choice: 'keep'" in err
    # An entry that expired is suspended for ship-eu and dropped for drain
    shop.publish([Message(b"eu", promoted={"orders.Region": "EU"}, ttl=3600)])
    q = mb_schema.queue
    with shop.store.transaction(serial=True) as conn:
        conn.execute(q.update().values(expires_at=shop.now() - timedelta(seconds=1)))
    assert shop.cleanup().expired == 2
    [entry] = shop.suspended(reason=EXPIRED)
    code, out, err = _cli(backend_url, "suspended", "resume", str(entry.id), "--ttl", "30m")
    assert code == 0, err
    with shop.store.transaction() as conn:
        [end] = conn.execute(q.select().with_only_columns(q.c.expires_at)).scalars()
    assert timedelta(minutes=29) < end - shop.now() <= timedelta(minutes=30)
    code, _, err = _cli(backend_url, "suspended", "resume", "1", "--ttl", "1m", "--expires-at", "x")
    assert code == 2
    assert "not both" in err


def test_the_console_delivers_now_and_cancels_a_subscriptions_scheduled_entries(
    shop: MessageBox,
) -> None:
    from messagebox.console import create_app

    later = shop.now() + timedelta(hours=1)
    shop.publish(
        [
            Message(f"{i}".encode(), promoted={"orders.Region": "EU"}, deliver_at=later)
            for i in range(3)
        ]
    )
    sub = shop.subscription("ship-eu")
    b = TestClient(create_app(shop, token=TOKEN), base_url="http://127.0.0.1:8080")
    b.follow_redirects = False
    page = b.get("/").text
    assert "3 (next at " in page
    assert f'id="deliver-now-{sub.id}"' in page
    assert f'id="cancel-{sub.id}"' in page
    refused = b.post("/scheduled/deliver-now", data={"subscription": str(sub.id), "token": "no"})
    assert refused.status_code == 403
    assert len(shop.scheduled()) == 3
    [first, *_] = shop.scheduled()
    done = b.post("/scheduled/deliver-now", data={"entry": str(first.id), "token": TOKEN})
    assert done.status_code == 303, done.text
    assert "1 scheduled entries delivered now" in b.get(done.headers["location"]).text
    done = b.post("/scheduled/cancel", data={"subscription": str(sub.id), "token": TOKEN})
    assert done.status_code == 303, done.text
    assert shop.scheduled() == []
    assert b.post("/scheduled/later", data={"entry": "1", "token": TOKEN}).status_code == 404
    assert b.post("/scheduled/cancel", data={"token": TOKEN}).status_code == 400
    audit = [(r.action, r.target, r.count) for r in shop.audit_log()[:2]]
    assert audit == [
        ("scheduled cancel", f"subscription {sub.id}", 2),
        ("scheduled deliver-now", f"queue entry {first.id}", 1),
    ]
    read_only = TestClient(create_app(shop), base_url="http://127.0.0.1:8080")
    shop.publish([Message(b"z", promoted={"orders.Region": "EU"}, deliver_at=later)])
    assert f'id="deliver-now-{sub.id}"' not in read_only.get("/").text


def test_a_routing_file_declares_on_expiry_and_a_host_ttl_changed_in_place(
    shop: MessageBox,
) -> None:
    text = (
        "[hosts.shipping]\nmessage_ttl_seconds = 600\n"
        '[[subscriptions]]\nname = "ship-eu"\nservice = "ship"\nhost = "shipping"\n'
        'filter = \'orders.Region == "EU"\'\non_expiry = "drop"\n'
    )
    before = shop.subscription("ship-eu")
    plan = shop.plan(text, window=None)
    assert [(c.action, c.fields) for c in plan.diff.subscriptions] == [("change", ("on_expiry",))]
    assert [h.name for h in plan.diff.hosts] == ["shipping"]
    shop.apply(text)
    after = shop.subscription("ship-eu")
    assert (after.id, after.on_expiry) == (before.id, "drop")  # changed in place
    assert shop.host("shipping").settings.message_ttl_seconds == 600
    exported = shop.export_config().text()
    assert "on_expiry = 'drop'" in exported
    assert "message_ttl_seconds = 600" in exported
    # and this process's next publish reads the host's ttl
    shop.publish([Message(b"eu", promoted={"orders.Region": "EU"})])
    q = mb_schema.queue
    with shop.store.transaction() as conn:
        [end] = conn.execute(q.select().with_only_columns(q.c.expires_at)).scalars()
    assert timedelta(minutes=9) < end - shop.now() <= timedelta(minutes=10)


def test_a_bad_on_expiry_is_refused_naming_it_and_nothing_is_stored(shop: MessageBox) -> None:
    from messagebox.errors import ValidationError
    from messagebox.hosts import HostApp

    before = table_counts(shop)
    with pytest.raises(ValidationError, match="on_expiry must be suspend or drop, not 'keep'"):
        shop.subscribe("x", host="shipping", filter=P("a.B") == 1, on_expiry="keep")
    assert table_counts(shop) == before
    app = HostApp("shipping")
    with pytest.raises(ValidationError, match="subscription 'y': on_expiry must be"):
        app.subscribe("y", filter=P("a.B") == 1, name="y", on_expiry="later")


def test_the_command_line_sets_a_hosts_ttl(shop: MessageBox, backend_url: str) -> None:
    code, _, err = _cli(
        backend_url, "hosts", "set", "shipping", "--set", "message_ttl_seconds=86400"
    )
    assert code == 0, err
    assert shop.host("shipping").settings.message_ttl_seconds == 86_400
    code, _, err = _cli(backend_url, "hosts", "set", "shipping", "--set", "message_ttl_seconds=-1")
    assert code == 2  # a bad setting given on the command line is bad usage
    assert "message_ttl_seconds" in err
    code, _, err = _cli(
        backend_url, "hosts", "set", "shipping", "--set", "message_ttl_seconds=null"
    )
    assert code == 0, err
    assert shop.host("shipping").settings.message_ttl_seconds is None
