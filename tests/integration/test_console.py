"""The web console (messagebox.console) on both backends, through Starlette's test
client: each page renders real data; resume and terminate need the configured token and
change nothing otherwise; bad ids and properties are refused, naming the culprit; every
value is escaped."""

from __future__ import annotations

import re
import uuid
import warnings

import pytest
from markupsafe import escape
from starlette.exceptions import StarletteDeprecationWarning

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.hosts import HostInstance
from messagebox.models import SERVICE_UNENLISTED
from messagebox.predicates import P, format_filter
from tests.conftest import table_counts

with warnings.catch_warnings():  # starlette 1.x prefers httpx2, and warns with httpx
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "s3cret-tøken"
HOSTILE = '<script>alert("x")</script>'
BEARER = {"Authorization": f"Bearer {TOKEN}".encode()}


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    """A host ``shipping`` with two subscriptions, an EU order waiting on its queue, and
    a US order suspended (resumable: its service was unenlisted, then started again)."""
    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    box.subscribe(
        "audit",
        host="shipping",
        filter=(P("orders.Total") >= 100) & (P("orders.Region") == "US"),
        name="audit-big-us",
        priority=5,
    )
    box.publish(
        [Message(b"<order>US</order>", promoted={"orders.Region": "US", "orders.Total": 150})]
    )
    box.set_service_state("audit", "unenlisted")
    box.set_service_state("audit", "started")
    box.publish([Message(b"<order>EU</order>", promoted={"orders.Region": "EU"})])
    return box


def client(box: MessageBox, token: str | None = TOKEN) -> TestClient:
    """A browser of the console as served by default (on 127.0.0.1, its Host)."""
    return TestClient(
        create_app(box, token=token), base_url="http://127.0.0.1:8080", follow_redirects=False
    )


def suspended_id(box: MessageBox) -> int:
    [entry] = box.suspended()
    return entry.id


def error_text(html: str) -> str:
    """The error message of an error page, unescaped enough to compare."""
    found = re.search(r'<p class="error" id="error"><strong>\d+</strong> (.*?)</p>', html, re.S)
    assert found, html
    return found.group(1).replace("&#39;", "'").replace("&#34;", '"')


# --- pages ---


def test_the_overview_shows_hosts_instances_queues_and_counts(shop: MessageBox) -> None:
    # Given a running host instance of a second host
    shop.create_host("idle", heartbeat_seconds=0.2, dead_after_seconds=5)
    inst = HostInstance(shop, "idle", {}).start()
    try:
        # When the overview is opened
        page = client(shop).get("/")
    finally:
        inst.stop(5.0)
    # Then it shows both hosts, the instance with its heartbeat, and the queue
    assert page.status_code == 200
    html = page.text
    assert "<td>shipping</td>" in html
    assert "<td>idle</td>" in html
    assert f"<td>{escape(inst.id)}</td>" in html
    [queue] = shop.queue_stats()
    assert f"<td>ship-eu ({queue.subscription})</td>" in html
    assert "Every queue is empty" not in html
    assert "(ready 1, held 0, blocked 0, leased 0, scheduled 0)" in html
    assert "service-unenlisted 1" in html
    assert "Message tracking is disabled" in html


def test_the_overview_counts_tracked_events_per_minute_and_hour(shop: MessageBox) -> None:
    # Given tracking enabled and three more messages published
    shop.configure_tracking(True)
    shop.publish([Message(b"x", promoted={"orders.Region": "EU"}) for _ in range(3)])
    # When the throughput is read, and the overview shown
    minute, hour = shop.throughput()
    html = client(shop).get("/").text
    # Then the three are counted in both windows, and shown
    assert (minute.seconds, hour.seconds) == (60.0, 3600.0)
    assert minute.events["published"] == hour.events["published"] == 3
    assert minute.events["routed"] == 3
    assert minute.events["delivered"] == 0
    assert "Message tracking is disabled" not in html
    assert re.search(r"<td>minute</td>\s*<td class=\"num\">3</td>", html)


def test_the_subscriptions_page_shows_each_filter_in_its_text_form(shop: MessageBox) -> None:
    # When the subscriptions page is opened
    page = client(shop).get("/subscriptions")
    # Then every subscription is there with host, service, state, kind, priority, filter
    assert page.status_code == 200
    assert {s.priority for s in shop.subscriptions()} == {0, 5}
    for sub in shop.subscriptions():
        row = re.search(rf'<tr id="subscription-{sub.id}">(.*?)</tr>', page.text, re.S)
        assert row is not None
        cells = row.group(1)
        for text in (sub.name, sub.host, sub.service, "started", "activation", str(sub.priority)):
            assert f">{text}<" in cells or f">{text} " in cells
        assert f'<code class="filter">{escape(format_filter(sub.filter))}</code>' in cells


def test_the_suspended_page_lists_entries_with_their_action_buttons(shop: MessageBox) -> None:
    # When the suspended page is opened on a console with a token
    entry = shop.suspended()[0]
    html = client(shop).get("/suspended").text
    # Then the entry is listed with its message, a token field, Resume and Terminate
    assert f'<tr id="entry-{entry.id}">' in html
    assert SERVICE_UNENLISTED in html
    assert f'href="/messages/{entry.message_id}"' in html
    assert 'name="token"' in html
    assert f'action="/suspended/{entry.id}/resume"' in html
    assert f'formaction="/suspended/{entry.id}/terminate"' in html


def test_a_read_only_console_shows_no_action_buttons(shop: MessageBox) -> None:
    # When the pages are opened on a console without a token
    reader = client(shop, token=None)
    listing = reader.get("/suspended").text
    detail = reader.get(f"/suspended/{suspended_id(shop)}").text
    # Then neither shows a token field nor an action
    for html in (listing, detail):
        assert 'name="token"' not in html
        assert "/resume" not in html
        assert "read-only" in html


def test_the_suspended_entry_page_shows_the_entry_and_its_message(shop: MessageBox) -> None:
    entry = shop.suspended()[0]
    page = client(shop).get(f"/suspended/{entry.id}")
    assert page.status_code == 200
    assert "service-unenlisted (resumable)" in page.text
    assert "audit-big-us" in page.text
    assert "<td>orders.Total</td><td>int</td><td><code>150</code></td>" in page.text
    assert "body 17 B (body)" in page.text


def test_the_message_page_shows_context_and_bounded_part_previews(box: MessageBox) -> None:
    # Given a message with a long text part, a binary part and a written property
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N").exists())
    long_text = "line of text\n" * 1000
    [routed] = box.publish(
        [
            Message(
                parts={"body": long_text.encode(), "blob": bytes(range(256)) * 4},
                promoted={"t.N": 7},
                written={"t.Note": "kept"},
            )
        ]
    )
    # When its page is opened with the token
    page = client(box).get(f"/messages/{routed.message_id}", headers=BEARER)
    # Then it shows both contexts and, per part, its size and a bounded preview
    assert page.status_code == 200
    html = page.text
    assert "<td>t.N</td><td>int</td><td><code>7</code></td>" in html
    assert "<td>t.Note</td><td>str</td><td><code>&#34;kept&#34;</code></td>" in html
    assert "body (body) · 12.7 KiB" in html
    [preview, _hex] = re.findall(r'<pre class="preview[^"]*">(.*?)</pre>', html, re.S)
    assert preview == str(escape(long_text[:4096]))
    assert "The first 4.0 KiB of 12.7 KiB." in html
    assert "blob · 1.0 KiB" in html
    assert "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f" in html
    assert "10 11 12" in html
    assert len(html) < 20_000


def test_explain_by_message_id_shows_the_first_failing_predicate(shop: MessageBox) -> None:
    # Given a stored EU order
    [routed] = shop.publish([Message(b"o", promoted={"orders.Region": "EU"})])
    # When it is explained by id
    page = client(shop).get("/explain", params={"target": str(routed.message_id)})
    # Then ship-eu routes, and audit-big-us says which predicate fails and why
    assert page.status_code == 200
    html = page.text
    ship, audit = shop.subscription("ship-eu"), shop.subscription("audit-big-us")
    row = re.search(rf'<tr id="verdict-{ship.id}" class="routes">(.*?)</tr>', html, re.S)
    assert row is not None
    assert "matches (group 1)" in row.group(1)
    row = re.search(rf'<tr id="verdict-{audit.id}" class="misses">(.*?)</tr>', html, re.S)
    assert row is not None
    assert "group 1: <code>orders.Total &gt;= 100</code>: is absent" in row.group(1)
    assert "Routes to 1 of 2 subscriptions: ship-eu." in html


@pytest.mark.parametrize(
    "params",
    [
        {"properties": "orders.Region=US\norders.Total=50"},
        {"target": '{"orders.Region": "US", "orders.Total": 50}'},
    ],
)
def test_explain_by_properties_in_the_cli_forms(shop: MessageBox, params: dict[str, str]) -> None:
    page = client(shop).get("/explain", params=params)
    assert page.status_code == 200
    audit = shop.subscription("audit-big-us")
    row = re.search(rf'<tr id="verdict-{audit.id}" class="misses">(.*?)</tr>', page.text, re.S)
    assert row is not None
    assert "orders.Total &gt;= 100</code>: 50 &lt; 100" in row.group(1)
    assert "Routes to 0 of 2 subscriptions." in page.text


# --- actions ---


def test_resume_with_the_token_puts_the_entry_back_on_its_queue(shop: MessageBox) -> None:
    entry_id = suspended_id(shop)
    # When Resume is posted with the token
    done = client(shop).post(f"/suspended/{entry_id}/resume", data={"token": TOKEN})
    # Then the entry is back on its queue, and the list page says so
    assert done.status_code == 303
    assert done.headers["location"] == f"/suspended?done=resumed&entry={entry_id}"
    assert shop.suspended() == []
    [queue] = [q for q in shop.queue_stats() if q.name == "audit-big-us"]
    assert queue.ready == 1
    listing = client(shop).get(done.headers["location"]).text
    assert f"Entry {entry_id} resumed." in listing
    assert "No suspended entries." in listing


def test_a_bearer_token_is_accepted_too(shop: MessageBox) -> None:
    entry_id = suspended_id(shop)
    done = client(shop).post(
        f"/suspended/{entry_id}/terminate", headers={"Authorization": f"Bearer {TOKEN}".encode()}
    )
    assert done.status_code == 303
    assert shop.suspended() == []


def test_terminate_with_the_token_deletes_the_entry(shop: MessageBox) -> None:
    entry = shop.suspended()[0]
    done = client(shop).post(f"/suspended/{entry.id}/terminate", data={"token": TOKEN})
    assert done.status_code == 303
    assert shop.suspended() == []
    assert shop.references(entry.message_id) == 0


@pytest.mark.parametrize("action", ["resume", "terminate"])
@pytest.mark.parametrize(
    ("data", "headers", "why"),
    [
        ({}, {}, "this action needs the console token"),
        ({"token": ""}, {}, "this action needs the console token"),
        ({"token": "wrong"}, {}, "wrong token; nothing was changed"),
        ({"token": TOKEN[:-1]}, {}, "wrong token; nothing was changed"),
        ({}, {"Authorization": "Bearer wrong"}, "wrong token; nothing was changed"),
        ({}, {"Authorization": f"Basic {TOKEN}".encode()}, "this action needs the console token"),
    ],
)
def test_a_missing_or_wrong_token_is_refused_and_changes_nothing(
    shop: MessageBox,
    action: str,
    data: dict[str, str],
    headers: dict[str, bytes],
    why: str,
) -> None:
    entry_id = suspended_id(shop)
    before = table_counts(shop)
    # When the action is posted without the right token
    refused = client(shop).post(f"/suspended/{entry_id}/{action}", data=data, headers=headers)
    # Then it is forbidden, says why, and the entry is still suspended
    assert refused.status_code == 403
    assert why in error_text(refused.text)
    assert shop.suspended_entry(entry_id).id == entry_id
    assert table_counts(shop) == before


@pytest.mark.parametrize("action", ["resume", "terminate"])
def test_actions_are_disabled_without_a_configured_token(shop: MessageBox, action: str) -> None:
    entry_id = suspended_id(shop)
    before = table_counts(shop)
    refused = client(shop, token=None).post(
        f"/suspended/{entry_id}/{action}", data={"token": TOKEN}
    )
    assert refused.status_code == 403
    assert error_text(refused.text).startswith("actions are disabled: this console was started")
    assert shop.suspended_entry(entry_id).id == entry_id
    assert table_counts(shop) == before


def test_an_empty_token_cannot_be_configured(box: MessageBox) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        create_app(box, token="")


# --- bad input ---


@pytest.fixture
def unknown_message() -> str:
    return str(uuid.uuid4())


@pytest.mark.parametrize(
    ("method", "url", "status", "culprit"),
    [
        ("GET", "/suspended/999999", 404, "no suspended entry 999999"),
        ("GET", f"/suspended/{2**64}", 404, f"no suspended entry {2**64}"),
        ("GET", "/suspended/12ab", 400, "'12ab' is not a suspended entry id (an integer)"),
        ("GET", "/suspended/-1", 400, "'-1' is not a suspended entry id"),
        ("GET", "/messages/not-a-uuid", 400, "'not-a-uuid' is not a message id (a UUID)"),
        ("GET", "/messages/{unknown}", 404, "no message {unknown} in the spool"),
        ("POST", "/suspended/999999/resume", 404, "no suspended entry 999999"),
        ("POST", "/suspended/999999/terminate", 404, "no suspended entry 999999"),
        ("POST", "/suspended/x1/resume", 400, "'x1' is not a suspended entry id"),
        ("GET", "/explain?target={unknown}", 404, "no message {unknown} in the spool"),
        ("GET", "/nowhere", 404, "no page at /nowhere"),
        ("GET", "/suspended/1/resume", 405, "GET is not allowed at /suspended/1/resume"),
        ("GET", "/tracking?message=nope", 400, "'nope' is not a message id (a UUID)"),
        ("GET", "/tracking?event=delivred", 400, "unknown event 'delivred'; one of: published"),
        ("GET", "/tracking?host=nowhere", 404, "no host named 'nowhere'"),
        ("GET", "/suspended?host=nowhere", 404, "no host named 'nowhere'"),
        ("GET", "/suspended?reason=bogus", 400, "unknown reason 'bogus'; one of: "),
    ],
)
def test_bad_ids_are_refused_naming_the_culprit_and_change_nothing(
    shop: MessageBox, unknown_message: str, method: str, url: str, status: int, culprit: str
) -> None:
    before = table_counts(shop)
    answer = client(shop).request(
        method,
        url.format(unknown=unknown_message),
        data={"token": TOKEN} if method == "POST" else None,
    )
    assert answer.status_code == status
    assert answer.headers["content-type"].startswith("text/html")
    assert culprit.format(unknown=unknown_message) in error_text(answer.text)
    assert table_counts(shop) == before


def test_resuming_an_entry_that_is_not_resumable_is_refused(shop: MessageBox) -> None:
    # Given a routing failure (not resumable)
    shop.publish([Message(b"o", promoted={"orders.Region": "MARS"})])
    failure = next(e for e in shop.suspended() if not e.resumable)
    before = table_counts(shop)
    refused = client(shop).post(f"/suspended/{failure.id}/resume", data={"token": TOKEN})
    assert refused.status_code == 409
    assert error_text(refused.text) == (
        f"suspended entry {failure.id} is not resumable (routing-failure); terminate it, "
        "or reroute it; nothing was changed"
    )
    assert table_counts(shop) == before


@pytest.mark.parametrize(
    ("params", "culprit"),
    [
        ({"properties": "orders.Total:int=abc"}, "properties line 1: property 'orders.Total'"),
        ({"properties": "orders.Region=EU\nno-equals-sign"}, "properties line 2: "),
        ({"properties": "bad name=1"}, "properties line 1: "),
        ({"properties": "a.B=1\na.B=2"}, "properties line 2: property 'a.B' is given twice"),
        ({"target": "{not json"}, "the properties are not JSON"),
        ({"target": '{"a.B": null}'}, "properties: property 'a.B'"),
        ({"target": "[1, 2]"}, "'[1, 2]' is neither a message id (a UUID) nor a JSON object"),
        ({"target": "12345"}, "'12345' is neither a message id"),
        ({"target": str(uuid.uuid4()), "properties": "a.B=1"}, "not both"),
        ({"target": '{"a.B": "' + "x" * 300 + '"}'}, "properties: "),
    ],
)
def test_malformed_explain_input_is_refused_naming_the_culprit(
    shop: MessageBox, params: dict[str, str], culprit: str
) -> None:
    before = table_counts(shop)
    page = client(shop).get("/explain", params=params)
    assert page.status_code == 400
    assert culprit in error_text(page.text)
    assert 'id="verdicts"' not in page.text
    assert table_counts(shop) == before


# --- escaping ---


def test_hostile_values_are_escaped_on_every_page(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a host, subscription and message whose names and values are markup (names
    # this version refuses, stored as an older version let them be)
    from messagebox import specs
    from messagebox.config import catalog

    monkeypatch.setattr(catalog, "check_name", lambda what, name: name)
    monkeypatch.setattr(specs, "check_name", lambda what, name: name)
    box.create_host(HOSTILE)
    box.subscribe(HOSTILE, host=HOSTILE, filter=P("x.Evil") == HOSTILE, name=HOSTILE)
    [routed] = box.publish(
        [Message(HOSTILE.encode(), promoted={"x.Evil": HOSTILE}, written={"x.Note": HOSTILE})]
    )
    box.set_service_state(HOSTILE, "unenlisted")
    [entry] = box.suspended()
    reader = client(box)
    pages = [
        "/",
        "/subscriptions",
        "/suspended",
        f"/suspended/{entry.id}",
        f"/messages/{routed.message_id}",
        f"/explain?target={routed.message_id}",
    ]
    for url in pages:
        html = reader.get(url, headers=BEARER).text  # the token: the message's parts too
        # Then no page carries the markup, and each shows it as text
        assert "<script>" not in html, url
        assert "&lt;script&gt;" in html, url
    explained = reader.get("/explain", params={"target": HOSTILE}).text
    assert "<script>" not in explained
    assert "&lt;script&gt;" in explained


def test_responses_forbid_scripts_and_framing(shop: MessageBox) -> None:
    page = client(shop).get("/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"


# --- tracking and metrics ---


def test_the_tracking_page_shows_a_message_s_history(shop: MessageBox) -> None:
    # Given tracking enabled, and an order published, delivered... and one suspended
    shop.configure_tracking(True)
    [routed] = shop.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
    web = client(shop)
    # When its history is asked for
    page = web.get("/tracking", params={"message": str(routed.message_id)})
    # Then it shows the events, oldest first, with the subscription's name
    assert page.status_code == 200
    rows = re.findall(r'<tr class="event-(\w+)">', page.text)
    assert rows == ["published", "routed"]
    assert "ship-eu" in page.text
    assert "Tracking is enabled" in page.text
    # and the message page shows it too
    message = web.get(f"/messages/{routed.message_id}").text
    assert re.findall(r'<tr class="event-(\w+)">', message) == ["published", "routed"]
    # and the newest events can be filtered by kind
    routed_only = web.get("/tracking", params={"event": "routed"}).text
    assert re.findall(r'<tr class="event-(\w+)">', routed_only) == ["routed"]
    assert str(routed.message_id) in routed_only


def test_the_tracking_page_says_when_tracking_is_off(shop: MessageBox) -> None:
    page = client(shop).get("/tracking")
    assert page.status_code == 200
    assert "Tracking is disabled" in page.text
    assert "No tracked events." in page.text


def test_the_metrics_endpoint_is_a_prometheus_scrape(shop: MessageBox) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    # When the metrics are scraped without a token (they are read-only)
    answer = client(shop, token=None).get("/metrics")
    # Then the scrape parses, with the store's gauges and this process's counters
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }
    assert samples[("messagebox_queue_depth", (("host", "shipping"), ("state", "ready")))] == 1
    assert samples[("messagebox_suspended_entries", (("reason", SERVICE_UNENLISTED),))] == 1
    assert samples[("messagebox_host_instances", (("host", "shipping"),))] == 0
    assert ("messagebox_published_total", ()) in samples


def test_with_a_read_token_the_metrics_want_it_as_a_bearer_token(shop: MessageBox) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    # Given a console with a read token (every page needs a login)
    scraper = TestClient(
        create_app(shop, token=TOKEN, read_token="reader-secret"),
        base_url="http://127.0.0.1:8080",
        follow_redirects=False,
    )
    # When Prometheus scrapes without credentials, or with a wrong token
    bare = scraper.get("/metrics")
    wrong = scraper.get("/metrics", headers={"Authorization": "Bearer nope"})
    # Then it is told so (401 asking for a bearer token, 403), never sent to the login form
    assert bare.status_code == 401
    assert bare.headers["www-authenticate"].startswith("Bearer")
    assert "read token" in bare.text
    assert wrong.status_code == 403
    assert "location" not in bare.headers
    assert "location" not in wrong.headers
    # And with the read token (authorization: credentials) or the console's, it scrapes
    for secret in ("reader-secret", TOKEN):
        answer = scraper.get("/metrics", headers={"Authorization": f"Bearer {secret}".encode()})
        assert answer.status_code == 200
        names = {f.name for f in text_string_to_metric_families(answer.text)}
        assert "messagebox_queue_depth" in names
    # while a page still sends a browser to log in
    assert scraper.get("/queues").status_code == 303
