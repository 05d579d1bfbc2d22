"""Looking around in an incident, on both backends, from Python and the console: peek at
a host's queue (ready, held, leased; nothing changes), search by message id or by a
promoted property's value, and the instances of long-running services with what each
waits for."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.hosts import Delivery, HostInstance, Orchestration, activate, receive
from messagebox.predicates import P
from tests.conftest import claim, table_counts
from tests.integration.orchestration_support import make_app, msg, wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def browser(box: MessageBox) -> TestClient:
    return TestClient(create_app(box), base_url="http://127.0.0.1:8080", follow_redirects=False)


def test_a_queue_is_peeked_in_claim_order_by_state(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("fast", host="h", filter=P("t.N") >= 0, priority=5)
    box.subscribe("slow", host="h", filter=P("t.N") >= 10, state="stopped")
    box.publish([Message(b"x", promoted={"t.N": n}) for n in (1, 2, 11)])
    [leased] = claim(box, "h", n=1)
    before = table_counts(box)
    entries = box.peek_queue("h")
    assert [e.state for e in entries] == ["leased", "ready", "ready", "held"]
    assert entries[0].id == leased.id
    assert entries[0].lease_owner == "t"
    assert [e.id for e in box.peek_queue("h", state="held")] == [entries[-1].id]
    html = browser(box).get("/queue?host=h&state=ready").text
    assert re.findall(r'<tr id="queued-(\d+)">', html) == [str(e.id) for e in entries[1:3]]
    assert table_counts(box) == before  # a peek changes nothing
    assert browser(box).get("/queue?host=nowhere").status_code == 404
    assert browser(box).get("/queue?host=h&state=odd").status_code == 400


def test_search_by_message_id_and_by_a_property_value(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("orders.Id") >= 0)
    [first, _, third] = box.publish(
        [
            Message(b"a", promoted={"orders.Id": 42, "orders.Zip": "01234"}),
            Message(b"b", promoted={"orders.Id": 43, "orders.Zip": "01234_"}),
            Message(b"c", promoted={"orders.Id": 42}),
        ]
    )
    found = box.find_messages("orders.Id", 42)
    assert {m.id for m in found} == {third.message_id, first.message_id}
    [later] = box.publish([Message(b"d", promoted={"orders.Id": 42})])
    assert box.find_messages("orders.Id", 42)[0].id == later.message_id  # newest first
    assert [m.id for m in box.find_messages("orders.Zip", "01234")] == [first.message_id]
    assert box.find_messages("orders.Id", "42") == []  # a text 42 is another value
    box.publish([Message(b"w", promoted={"orders.Id": 1}, written={"orders.Zip": "01234"})])
    assert [m.id for m in box.find_messages("orders.Zip", "01234")] == [first.message_id]
    b = browser(box)
    went = b.get(f"/search?q={first.message_id}")
    assert went.status_code == 303
    assert went.headers["location"] == f"/messages/{first.message_id}"
    listed = b.get("/search", params={"q": "orders.Zip:str=01234"}).text
    assert str(first.message_id) in listed
    assert str(third.message_id) not in listed
    assert 'id="not-found"' in b.get("/search", params={"q": "orders.Id=7"}).text
    assert b.get("/search", params={"q": "no equals sign"}).status_code == 400


class Order(BaseModel):
    seen: int = 0


class Waiting(Orchestration[Order]):
    """An order, then its payment (which never comes in this test)."""

    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.seen += 1

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.complete()


def test_service_instances_show_what_they_wait_for(
    box: MessageBox, running: Callable[..., HostInstance]
) -> None:
    app, _ = make_app(Waiting)
    running(app)
    box.publish([msg("order", "A"), msg("order", "B")])

    def running_and_waiting() -> bool:
        found = box.service_instances(state="running")
        return len(found) == 2 and all(i.waiting_for for i in found)

    wait_until(running_and_waiting, what="two instances running and waiting")
    [one, _] = box.service_instances(state="running")
    assert one.service == Waiting.name
    assert one.waiting_for == (f"{Waiting.name}.payment",)
    html = browser(box).get("/instances").text
    assert len(re.findall(r'<tr id="instance-', html)) == 2
    assert "payment" in html
    assert browser(box).get("/instances?state=odd").status_code == 400


def test_a_part_is_downloaded_as_stored_by_whoever_may_see_contents(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("a.B") >= 0)
    body = bytes(range(256)) * 300  # binary, several fragments
    [routed] = box.publish(
        [Message(parts={"body": body, "note": "hi"}, body_part="body", promoted={"a.B": 1})]
    )
    url = f"/messages/{routed.message_id}/part"
    open_console = browser(box).get(url)
    assert open_console.status_code == 200
    assert open_console.content == body
    assert "attachment" in open_console.headers["content-disposition"]
    assert browser(box).get(url, params={"name": "note"}).content == b"hi"
    assert browser(box).get(url, params={"name": "nope"}).status_code == 404
    guarded = TestClient(
        create_app(box, token="t0ken"), base_url="http://127.0.0.1:8080", follow_redirects=False
    )
    assert guarded.get(url).status_code == 403
    assert guarded.get(url, headers={"Authorization": "Bearer t0ken"}).content == body
    assert guarded.post(url, data={"token": "t0ken", "name": "note"}).content == b"hi"
