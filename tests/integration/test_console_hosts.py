"""The console against DNS rebinding (issue 18, D9), through Starlette's test client: every
route answers only to a ``Host`` that names the console (its bound address, the loopback
names when it is bound to loopback, the allowed hosts given), and a message's part
contents need the token when the console has one."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
import warnings
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.predicates import P
from tests.conftest import table_counts

with warnings.catch_warnings():  # starlette 1.x prefers httpx2, and warns with httpx
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "s3cret-tøken"
BEARER = {"Authorization": f"Bearer {TOKEN}".encode()}
BODY = b"<order>card 4111-1111</order>"
FORGED = "rebind.evil.example:8080"


@pytest.fixture
def order(box: MessageBox) -> uuid.UUID:
    """A stored message (body ``BODY``), suspended: its service was unenlisted."""
    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    [routed] = box.publish([Message(BODY, promoted={"orders.Region": "EU"})])
    box.set_service_state("ship", "unenlisted")
    return routed.message_id


def client(box: MessageBox, host: str = "127.0.0.1:8080", **options: Any) -> TestClient:
    """A browser of a console made with ``options`` (token by default), sending
    ``Host: host``."""
    app = create_app(box, **{"token": TOKEN, **options})
    return TestClient(app, base_url=f"http://{host}", follow_redirects=False)


def refused(answer: Any, host: str) -> bool:
    """Whether ``answer`` is the Host check's refusal of ``host``."""
    return (
        answer.status_code == 400
        and answer.headers["content-type"].startswith("text/plain")
        and f"the host {host!r} is not one this console answers to" in answer.text
    )


def previews(html: str) -> list[str]:
    return re.findall(r'<pre class="preview[^"]*">(.*?)</pre>', html, re.S)


# --- the Host check ---


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/"),
        ("GET", "/suspended"),
        ("GET", "/messages/{order}"),
        ("POST", "/messages/{order}"),
        ("GET", "/explain?target={order}"),
        ("GET", "/tracking?message={order}"),
        ("GET", "/metrics"),
        ("GET", "/static/console.css"),
        ("GET", "/nowhere"),
    ],
)
def test_a_forged_host_is_refused_on_every_route(
    box: MessageBox, order: uuid.UUID, method: str, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a console on 127.0.0.1, and a rebinding page's request, token and all
    web = client(box, host=FORGED)
    # When it asks for a page
    with caplog.at_level(logging.WARNING, logger="messagebox.console"):
        answer = web.request(
            method,
            url.format(order=order),
            headers=BEARER,
            data={"token": TOKEN} if method == "POST" else None,
        )
    # Then it is refused, plainly, naming the host; nothing of the store is in it
    assert refused(answer, FORGED), answer.text
    assert "card" not in answer.text
    assert "ship" not in answer.text
    assert answer.headers["x-content-type-options"] == "nosniff"
    # and the refusal is logged
    [record] = [r for r in caplog.records if r.name == "messagebox.console"]
    assert record.levelno == logging.WARNING
    assert f"refused {method} {url.split('?')[0].format(order=order)}" in record.getMessage()
    assert repr(FORGED) in record.getMessage()
    assert record.__dict__["event"] == "console-host-refused"


@pytest.mark.parametrize("action", ["resume", "terminate"])
def test_a_forged_host_cannot_act_even_with_the_token(
    box: MessageBox, order: uuid.UUID, action: str
) -> None:
    [entry] = box.suspended()
    before = table_counts(box)
    answer = client(box, host=FORGED).post(f"/suspended/{entry.id}/{action}", data={"token": TOKEN})
    assert refused(answer, FORGED)
    assert [e.id for e in box.suspended()] == [entry.id]
    assert table_counts(box) == before


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8080",
        "127.0.0.1",
        "localhost:8080",
        "localhost",
        "[::1]:8080",
        "[::1]",
        "LocalHost:8080",
        "localhost.:8080",
        "localhost:9000",  # an SSH tunnel's port: the port is not what a rebinding forges
    ],
)
def test_the_loopback_names_are_answered(box: MessageBox, order: uuid.UUID, host: str) -> None:
    # Given a console on 127.0.0.1, which refuses a rebinding page's host
    web = client(box)
    assert refused(web.get("/", headers={"host": FORGED}), FORGED)
    # Then it answers to the loopback names, with the port or without, pages and contents
    assert web.get("/", headers={"host": host}).status_code == 200
    page = web.get(f"/messages/{order}", headers={**BEARER, "host": host})
    assert page.status_code == 200
    assert previews(page.text) == ["&lt;order&gt;card 4111-1111&lt;/order&gt;"]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.evil.example:8080",
        "127.0.0.2:8080",
        "[::2]:8080",
        "192.0.2.10:8080",
        "localhost:8080:8080",
        "[::1",
        "local host",
        "",
    ],
)
def test_other_hosts_are_refused(box: MessageBox, host: str) -> None:
    answer = client(box).get("/", headers={"host": host})
    assert refused(answer, host), answer.text


def test_a_console_bound_to_another_address_answers_to_that_address(box: MessageBox) -> None:
    # Given a console bound to a LAN address
    bind = {"bind": "192.0.2.10"}
    # Then it answers to that address, with any port or none
    assert client(box, host="192.0.2.10:8080", **bind).get("/").status_code == 200
    assert client(box, host="192.0.2.10", **bind).get("/").status_code == 200
    # and not to the loopback names (it is not on loopback) nor any other
    for host in ("localhost:8080", "127.0.0.1:8080", FORGED):
        assert refused(client(box, host=host, **bind).get("/"), host)


def test_a_console_bound_to_ipv6_loopback_answers_to_the_loopback_names(box: MessageBox) -> None:
    for host in ("[::1]:8080", "localhost:8080", "127.0.0.1"):
        assert client(box, host=host, bind="::1").get("/").status_code == 200
    assert refused(client(box, host=FORGED, bind="::1").get("/"), FORGED)


def test_allowed_hosts_add_names_with_any_port_or_their_own(
    box: MessageBox, order: uuid.UUID
) -> None:
    # Given a console behind a proxy, allowed its public name and an internal name:port
    options = {"allowed_hosts": ["Console.Example.com", "proxy.internal:8443"]}
    # Then those are answered, the name with any port, the name:port with that one only
    for host in ("console.example.com", "console.example.com:443", "proxy.internal:8443"):
        web = client(box, host=host, **options)
        assert web.get("/").status_code == 200, host
        assert previews(web.get(f"/messages/{order}", headers=BEARER).text), host
    # and the loopback names still are
    assert client(box, host="localhost:8080", **options).get("/").status_code == 200
    # but not the internal name on another port, nor another name
    for host in ("proxy.internal", "proxy.internal:9000", "example.com", FORGED):
        assert refused(client(box, host=host, **options).get("/"), host), host


@pytest.mark.parametrize("bind", ["0.0.0.0", "::"])
def test_a_console_bound_to_every_address_with_no_names_checks_no_host_and_warns(
    box: MessageBox, bind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # When a console is made bound to every address, with no allowed hosts
    with caplog.at_level(logging.WARNING, logger="messagebox.console"):
        web = client(box, host=FORGED, bind=bind)
    # Then it warns, at once, that the Host check is off
    [warning] = [r for r in caplog.records if r.name == "messagebox.console"]
    assert warning.levelno == logging.WARNING
    assert f"bound to {bind} with no allowed host names" in warning.getMessage()
    assert "--allowed-host" in warning.getMessage()
    # and it answers any Host
    assert web.get("/").status_code == 200


def test_a_console_bound_to_every_address_with_names_checks_them(
    box: MessageBox, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"bind": "0.0.0.0", "allowed_hosts": ["console.example.com"]}
    with caplog.at_level(logging.WARNING, logger="messagebox.console"):
        assert client(box, host="console.example.com", **options).get("/").status_code == 200
        assert client(box, host="localhost:8080", **options).get("/").status_code == 200
    assert not [r for r in caplog.records if "no allowed host names" in r.getMessage()]
    assert refused(client(box, host=FORGED, **options).get("/"), FORGED)


@pytest.mark.parametrize(
    "name", ["", "http://console.example.com/", "a b", "x:0", "x:65536", "x:port", "[::1", "*"]
)
def test_a_malformed_allowed_host_is_refused(box: MessageBox, name: str) -> None:
    with pytest.raises(ValueError, match="is not a host name or an IP address"):
        create_app(box, allowed_hosts=[name])


def call(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """One GET / with exactly these raw headers, straight through ASGI."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


def test_a_request_with_no_host_or_two_is_refused(box: MessageBox) -> None:
    app = create_app(box, token=TOKEN)
    assert call(app, [(b"host", b"127.0.0.1:8080")])[0] == 200
    status, body = call(app, [])
    assert status == 400
    assert b"the request has no Host header" in body
    status, body = call(app, [(b"host", b"127.0.0.1:8080"), (b"host", FORGED.encode())])
    assert status == 400
    assert b"the request has 2 Host headers" in body


# --- a message's part contents need the token ---


def test_without_the_token_a_message_shows_its_parts_sizes_not_their_contents(
    box: MessageBox, order: uuid.UUID
) -> None:
    # When a message's page is opened on a console with a token, without it
    page = client(box).get(f"/messages/{order}")
    # Then it shows the message's context and its parts' names and sizes
    assert page.status_code == 200
    assert "<td>orders.Region</td><td>str</td>" in page.text
    assert f"body (body) · {len(BODY)} B" in page.text
    # but not their contents: a form asks for the token
    assert "card" not in page.text
    assert previews(page.text) == []
    assert f'<form method="post" action="/messages/{order}" class="reveal"' in page.text
    assert 'name="token"' in page.text


def test_the_token_shows_a_message_s_part_contents(box: MessageBox, order: uuid.UUID) -> None:
    web = client(box)
    expected = ["&lt;order&gt;card 4111-1111&lt;/order&gt;"]
    # A script sends the token as a bearer header
    by_header = web.get(f"/messages/{order}", headers=BEARER)
    assert by_header.status_code == 200
    assert previews(by_header.text) == expected
    # A browser posts the page's form with the token field
    by_form = web.post(f"/messages/{order}", data={"token": TOKEN})
    assert by_form.status_code == 200
    assert previews(by_form.text) == expected
    assert 'class="reveal"' not in by_form.text
    assert by_form.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("method", "data", "headers", "why"),
    [
        ("GET", None, {"Authorization": "Bearer wrong"}, "wrong token"),
        ("GET", None, {"Authorization": f"Bearer {TOKEN[:-1]}".encode()}, "wrong token"),
        ("POST", {"token": "wrong"}, {}, "wrong token"),
        ("POST", {"token": ""}, {}, "the contents of a message's parts need the console token"),
        ("POST", {}, {}, "the contents of a message's parts need the console token"),
    ],
)
def test_a_wrong_or_missing_token_shows_no_part_contents(
    box: MessageBox,
    order: uuid.UUID,
    method: str,
    data: dict[str, str] | None,
    headers: dict[str, Any],
    why: str,
) -> None:
    answer = client(box).request(method, f"/messages/{order}", data=data, headers=headers)
    assert answer.status_code == 403
    assert why in answer.text.replace("&#39;", "'")
    assert "card" not in answer.text


def test_a_console_without_a_token_shows_part_contents_as_before(
    box: MessageBox, order: uuid.UUID
) -> None:
    # A console without a token has no login: its pages, part contents too, are open
    web = client(box, token=None)
    for answer in (web.get(f"/messages/{order}"), web.post(f"/messages/{order}")):
        assert answer.status_code == 200
        assert previews(answer.text) == ["&lt;order&gt;card 4111-1111&lt;/order&gt;"]
        assert 'class="reveal"' not in answer.text
