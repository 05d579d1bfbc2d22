"""Orchestration instances as an operator finds, reads and terminates them (issue 58,
item 3), and entries held behind a suspended step shown as blocked (item 5), on both
backends: found by correlation value (Python, the command line, the console), one
instance's state and messages in order with their outcomes, terminated (audited; its
messages terminated, its timers and convoy gone), and its held entries counted and
shown with what holds them."""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.errors import UnknownInstance, ValidationError
from messagebox.hosts import Delivery, HostInstance, Orchestration, activate, receive, timeout
from messagebox.models import ROUTING_FAILURE
from messagebox.ops.orchestrations import terminated_detail
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.cli_support import run_cli
from tests.integration.orchestration_support import FAST, make_app, msg, wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "s3cret"


class Order(BaseModel):
    total: float = 0
    paid: float = 0
    note: str = ""


class Shop(Orchestration[Order]):
    """order → payments until paid (a bad one fails) → ship; unpaid after an hour."""

    name = "shop"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.total = float(d.properties.get("t.Total", 0))  # type: ignore[arg-type]
        self.state.note = d.body.decode()
        self.wait_for("payment", timeout=3600)
        self.publish(Message(b"ack", promoted={"t.Kind": "ack"}))

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        if d.properties.get("t.Bad"):
            raise RuntimeError("the ledger refused it")
        self.state.paid += float(d.properties["t.Amount"])  # type: ignore[arg-type]
        if self.state.paid >= self.state.total:
            self.publish(Message(b"ship", promoted={"t.Kind": "ship"}))
            self.complete()
        else:
            self.wait_for("payment", timeout=3600)

    @timeout("payment")
    def unpaid(self) -> None:
        self.complete()


def stuck_order(box: MessageBox, running: Callable[..., HostInstance]) -> str:
    """Order A123 (100) paid 40, then a payment that fails (suspended, holding the
    instance), then one of 60 that waits behind it; order B7 waits for its payment.
    Returns A123's instance id."""
    box.configure_tracking(True)
    app, sink = make_app(Shop, sink_kinds=("ack", "ship"))
    running(app, max_attempts=1)
    box.publish([msg("order", "A123", **{"t.Total": 100.0}), msg("order", "B7")])
    wait_until(lambda: len(sink.kinds("ack")) == 2, what="both orders acknowledged")
    box.publish([msg("payment", "A123", **{"t.Amount": 40.0})])
    wait_until(lambda: not box.queue_depth("orch"), what="the first payment")
    box.publish([msg("payment", "A123", **{"t.Amount": 1.0, "t.Bad": True})])
    wait_until(lambda: box.count_suspended() == 1, what="the failing payment")
    box.publish([msg("payment", "A123", **{"t.Amount": 60.0})])
    [found] = box.find_instances({"t.OrderId": "A123"})
    wait_until(
        lambda: [q.depth for q in box.queue_stats("orch")] == [1], what="the held payment queued"
    )
    return found.id


def console(box: MessageBox, token: str | None = None) -> TestClient:
    return TestClient(
        create_app(box, token=token), base_url="http://127.0.0.1:8080", follow_redirects=False
    )


def test_an_instance_is_found_by_its_correlation_value(box: MessageBox, running) -> None:
    # Given orders A123 (its payment suspended) and B7, and an order 42 (a number)
    a123 = stuck_order(box, running)
    box.publish([msg("order", 42)])
    wait_until(lambda: len(box.service_instances(state="running")) == 2, what="order 42's")
    # When the operator looks for A123's instance by its order id
    [found] = box.find_instances({"t.OrderId": "A123"})
    # Then it is that one, with its correlation value and what it holds
    assert (found.id, found.service, found.state) == (a123, "shop", "suspended")
    assert found.correlation == {"t.OrderId": "A123"}
    assert (found.queued, found.suspended) == (1, 1)
    assert [name for name, _ in found.timers] == ["payment"]
    # and a number finds the number, in either type, not its text
    assert [i.correlation for i in box.find_instances({"t.OrderId": 42.0})] == [{"t.OrderId": 42}]
    assert box.find_instances({"t.OrderId": "42"}) == []
    assert box.find_instances({"t.OrderId": "A12"}) == []  # whole values only
    assert box.find_instances({"t.OrderId": "A123"}, state="running") == []
    assert box.find_instances({"t.OrderId": "A123"}, service="other") == []
    with pytest.raises(ValidationError, match="correlation"):
        box.find_instances({"no-namespace": "A123"})
    # and the command line finds it too: `orchestrations find` (a guessed number also
    # finds its text) and `orchestrations list`
    done = run_cli(["--url", box.url.render_as_string(False), "--json", "orchestrations", "find",
                    "t.OrderId=A123"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [i["id"] for i in json.loads(done.stdout)] == [a123]
    listed = run_cli(["--url", box.url.render_as_string(False), "orchestrations", "list"])
    assert len(listed.stdout.splitlines()) == 4  # a heading and three instances
    assert 't.OrderId="A123"' in listed.stdout
    # and the console's search box on /instances
    page = console(box).get("/instances", params={"q": "t.OrderId=A123"}).text
    assert re.findall(r'<tr id="instance-([^"]+)">', page) == [a123]
    assert f'href="/instances/{a123}"' in page
    went = console(box).get("/instances", params={"q": a123})  # an id opens its page
    assert went.headers["location"] == f"/instances/{a123}"
    assert console(box).get("/instances", params={"q": "t.OrderId A123="}).status_code == 400
    assert f'href="/instances/{a123}"' in page


def test_an_instance_page_shows_its_state_and_its_messages_in_order(
    box: MessageBox, running
) -> None:
    # Given order A123: paid 40, a failed payment suspended, a payment waiting behind it
    a123 = stuck_order(box, running)
    [suspended] = box.suspended()
    # When the operator opens the instance
    d = box.service_instance(a123)
    # Then its saved state is there, as stored
    assert d.data["state"] == {"total": 100.0, "paid": 40.0, "note": "order:A123"}
    assert d.version == 2
    # and its messages, in its order, with their outcomes: the order and the first
    # payment handled (by a host instance), the bad one suspended, the last blocked
    assert [m.outcome for m in d.messages] == ["handled", "handled", "suspended", "blocked"]
    assert all(m.detail and m.detail.startswith("orch@") for m in d.messages[:2])
    assert "RuntimeError: the ledger refused it" in (d.messages[2].detail or "")
    assert d.messages[2].entry == suspended.id
    assert d.messages[3].held_by == suspended.id
    assert d.messages[3].detail == f"blocked by suspended entry {suspended.id}"
    # and what its steps published: an acknowledgement by the first step, to the sink
    assert [(p.step, p.subscriptions) for p in d.published] == [(1, (box.subscription("sink").id,))]
    events = [e.event for e in d.history]
    assert {"published", "routed", "delivered", "failed", "suspended"} <= set(events)
    # and the command line shows the same
    shown = run_cli(["--url", box.url.render_as_string(False), "orchestrations", "show", a123])
    assert shown.returncode == 0, shown.stderr
    assert '"paid": 40.0' in shown.stdout
    assert f"blocked by suspended entry {suspended.id}" in shown.stdout
    # and the console's page: state pretty-printed and escaped, steps, timers, links
    page = console(box).get(f"/instances/{a123}").text
    assert "&#34;paid&#34;: 40.0" in page or "&quot;paid&quot;: 40.0" in page
    assert re.findall(r'<tr id="step-(\d+)" class="outcome-(\w+)">', page) == [
        (str(m.entry), m.outcome) for m in d.messages
    ]
    assert f'href="/suspended/{suspended.id}"' in page
    assert 'id="timers"' in page
    assert console(box).get("/instances/no-such-instance").status_code == 404


def test_terminating_an_instance_terminates_its_messages_and_cancels_its_timers(
    box: MessageBox, running
) -> None:
    # Given order A123 held by its suspended payment, with a payment waiting and a timer
    a123 = stuck_order(box, running)
    [suspended] = box.suspended()
    [waiting] = box.peek_queue("orch")
    # When the operator terminates it
    done = box.terminate_instance(a123)
    # Then its queued and suspended messages are terminated (released), not zombies
    assert (done.entries, done.suspended, done.timers) == ((waiting.id,), (suspended.id,), 1)
    assert box.suspended() == []
    assert box.queue_depth("orch") == []
    for m in (waiting.message_id, suspended.message_id):
        assert box.references(m) == 0
        assert [(e.event, e.detail) for e in box.tracked(m)][-1] == (
            "terminated",
            terminated_detail(a123),
        )
    # and the instance has ended as terminated, its timer and convoy gone
    [ended] = box.find_instances({"t.OrderId": "A123"})
    assert ended.state == "terminated"
    assert ended.completed_at is not None
    assert ended.timers == ()
    with box.store.transaction() as conn:
        t, c = mb_schema.timer, mb_schema.convoy
        assert conn.execute(sa.select(t).where(t.c.instance_id == a123)).first() is None
        assert conn.execute(sa.select(c).where(c.c.instance_id == a123)).first() is None
    # and its page still shows every message it had, those two terminated with it
    d = box.service_instance(a123)
    assert [m.outcome for m in d.messages] == ["handled", "handled", "terminated", "terminated"]
    assert [m.entry for m in d.messages[2:]] == [suspended.id, waiting.id]
    # and the store is consistent (references released with the entries)
    assert box.check() == []
    # and order B7 is untouched
    [b7] = box.find_instances({"t.OrderId": "B7"})
    assert (b7.state, len(b7.timers)) == ("running", 1)
    # and a later payment for A123 finds no instance, while a new order starts one
    [late] = box.publish([msg("payment", "A123", **{"t.Amount": 1.0})])
    assert late.subscriptions == ()
    assert len(box.suspended(reason=ROUTING_FAILURE)) == 1
    # and terminating it again, or an unknown instance, is refused
    with pytest.raises(ValidationError, match="terminated already"):
        box.terminate_instance(a123)
    with pytest.raises(UnknownInstance):
        box.terminate_instance("no-such-instance")


def test_terminate_from_the_command_line_and_the_console_is_audited(
    box: MessageBox, running
) -> None:
    # Given order A123 held by its suspended payment, and order B7 waiting
    a123 = stuck_order(box, running)
    [b7] = box.find_instances({"t.OrderId": "B7"})
    url = box.url.render_as_string(False)
    # When the operator terminates A123 from the command line (a script: no question)
    done = run_cli(["--url", url, "orchestrations", "terminate", a123, "--yes"])
    assert done.returncode == 0, done.stderr
    assert "1 queued message, 1 suspended entry terminated, 1 timer cancelled" in done.stdout
    # Then it is terminated, and the audit log says who did it to what
    assert box.service_instance(a123).instance.state == "terminated"
    [entry] = [a for a in box.audit_log() if a.action == "orchestrations terminate"]
    assert entry.target == f"orchestration instance {a123} (shop)"
    assert entry.count == 2
    # and once more is refused (exit 1), an unknown id is not found (exit 3)
    again = run_cli(["--url", url, "orchestrations", "terminate", a123, "--yes"])
    assert again.returncode == 1
    assert "terminated already" in again.stderr
    assert run_cli(["--url", url, "orchestrations", "show", "nope"]).returncode == 3
    # When B7 is terminated from the console: refused without the token, then a
    # confirmation page, then done
    c = console(box, TOKEN)
    assert c.post(f"/instances/{b7.id}/terminate").status_code == 403
    asked = c.post(f"/instances/{b7.id}/terminate", data={"token": TOKEN})
    assert asked.status_code == 200
    assert 'id="confirm-terminate"' in asked.text
    assert box.service_instance(b7.id).instance.state == "running"
    confirmed = c.post(f"/instances/{b7.id}/terminate", data={"token": TOKEN, "confirm": "yes"})
    assert confirmed.status_code == 303
    assert confirmed.headers["location"] == f"/instances/{b7.id}?done=terminated"
    assert box.service_instance(b7.id).instance.state == "terminated"
    [logged] = [a for a in box.audit_log() if a.action == "orchestrations terminate" and
                a.via == "console"]  # fmt: skip
    assert logged.target == f"orchestration instance {b7.id} (shop)"


def test_entries_held_behind_a_suspended_step_are_counted_and_shown_as_blocked(
    box: MessageBox, running
) -> None:
    # Given order A123 held by its suspended payment, a payment waiting behind it
    a123 = stuck_order(box, running)
    [suspended] = box.suspended()
    # Then the waiting payment is counted blocked, not ready
    [stats] = box.queue_stats("orch")
    assert (stats.depth, stats.ready, stats.held, stats.blocked, stats.leased) == (1, 0, 0, 1, 0)
    assert box.stats().queued == {"ready": 0, "held": 0, "blocked": 1, "leased": 0, "scheduled": 0}
    # and a peek shows it blocked, with the suspended entry that holds it
    [entry] = box.peek_queue("orch")
    assert (entry.state, entry.held_by, entry.instance_id) == ("blocked", suspended.id, a123)
    assert entry.holder == f"blocked by suspended entry {suspended.id}"
    assert [e.id for e in box.peek_queue("orch", state="blocked")] == [entry.id]
    assert box.peek_queue("orch", state="ready") == []
    # and so do `messagebox queues` and the console's peek, linking the holder
    url = box.url.render_as_string(False)
    queues = json.loads(run_cli(["--url", url, "--json", "queues"]).stdout)
    assert [(q["ready"], q["blocked"]) for q in queues] == [(0, 1)]
    page = console(box).get("/queue", params={"host": "orch"}).text
    assert f"blocked by suspended entry {suspended.id}" in re.sub(r"<[^>]+>", "", page)
    assert f'href="/suspended/{suspended.id}"' in page
    assert f'href="/instances/{a123}"' in page
    # When the suspended step is resumed (and fails again: still bad), or terminated,
    # the entry is ready again
    box.terminate(suspended.id)
    wait_until(lambda: not box.queue_depth("orch"), what="the held payment handled")
    [done] = box.find_instances({"t.OrderId": "A123"})
    assert done.state == "completed"  # paid 40 + 60


def test_a_stopped_ordered_subscription_shows_the_entry_that_stopped_it(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    # Given an ordered subscription that stops on failure, whose first message fails
    box.create_host("h", **FAST, max_attempts=1)  # type: ignore[arg-type]
    box.subscribe("ledger", host="h", filter=P("t.N") >= 0, ordered=True, on_failure="stop")

    def ledger(d: Delivery) -> None:
        raise RuntimeError("no ledger")

    instances.append(HostInstance(box, "h", {"ledger": ledger}).start())
    box.publish([Message(b"x", promoted={"t.N": n}) for n in range(3)])
    wait_until(lambda: box.count_suspended() == 1, what="the failure")
    [suspended] = box.suspended()
    # Then its later messages are held, and a peek names the entry that stopped it
    entries = box.peek_queue("h")
    assert [(e.state, e.held_by) for e in entries] == [("held", suspended.id)] * 2
    assert entries[0].holder == (
        f"held: its ordered subscription stopped when entry {suspended.id} was suspended"
    )
    [stats] = box.queue_stats("h")
    assert (stats.held, stats.blocked) == (2, 0)
    # and a service stopped by hand holds its entries with no entry to name
    box.create_host("g")
    box.subscribe("report", host="g", filter=P("t.N") >= 0, state="stopped")
    box.publish([Message(b"y", promoted={"t.N": 9})])
    [held] = box.peek_queue("g")
    assert (held.state, held.held_by, held.holder) == ("held", None, "held: its service is stopped")


def test_a_pending_instance_is_found_and_terminated(box: MessageBox, running) -> None:
    # Given an order whose first step fails (no saved state yet), its payment behind it
    app, _ = make_app(Shop)
    app.setup(box)
    box.publish([msg("order", "P1", **{"t.Total": "not a number"})])
    box.publish([msg("payment", "P1", **{"t.Amount": 5.0})])
    running(app, max_attempts=1)
    wait_until(lambda: box.count_suspended() == 1, what="the failing first step")
    # When the operator looks for it
    [pending] = box.find_instances({"t.OrderId": "P1"})
    # Then it is pending: found by its first message's value, holding the payment
    assert (pending.state, pending.correlation) == ("pending", {"t.OrderId": "P1"})
    assert (pending.queued, pending.suspended) == (1, 1)
    d = box.service_instance(pending.id)
    assert (d.data, d.version) == (None, None)
    assert [m.outcome for m in d.messages] == ["suspended", "blocked"]
    # When it is terminated, it ends as terminated with nothing left
    done = box.terminate_instance(pending.id)
    assert (len(done.entries), len(done.suspended)) == (1, 1)
    [ended] = box.find_instances({"t.OrderId": "P1"})
    assert (ended.id, ended.state, ended.correlation) == (
        pending.id,
        "terminated",
        {"t.OrderId": "P1"},
    )
    assert box.service_instance(pending.id).data is None
    assert box.suspended() == []
    assert box.queue_depth() == []


class Gate(Orchestration[Order]):
    """order → a payment whose step waits at a gate, then ships and completes."""

    name = "gate"
    correlation = ("t.OrderId",)
    entered = threading.Event()
    gate = threading.Event()

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.note = "ordered"

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        Gate.entered.set()
        Gate.gate.wait(30)
        self.publish(Message(b"ship", promoted={"t.Kind": "ship"}))
        self.complete()


def test_a_step_in_flight_when_its_instance_is_terminated_commits_nothing(
    box: MessageBox, running
) -> None:
    # Given an instance whose payment's step is running (its entry leased)
    Gate.entered.clear()
    Gate.gate.clear()
    app, sink = make_app(Gate, sink_kinds=("ship",))
    host = running(app, max_attempts=1)
    box.publish([msg("order", "G1")])
    wait_until(lambda: len(box.service_instances()) == 1, what="the instance")
    box.publish([msg("payment", "G1")])
    assert Gate.entered.wait(30)
    [instance] = box.service_instances()
    # When the instance is terminated meanwhile, and the step then ends
    done = box.terminate_instance(instance.id)
    Gate.gate.set()
    # Then the leased entry was terminated with it, and the step committed nothing: no
    # shipment, no zombie, the instance still terminated at its version
    assert len(done.entries) == 1
    wait_until(lambda: host.stats.snapshot()["lost_leases"] >= 1, what="the step's end")
    d = box.service_instance(instance.id)
    assert (d.instance.state, d.version, d.data["state"]["note"]) == ("terminated", 1, "ordered")
    assert sink.kinds("ship") == []
    assert box.suspended() == []
    assert box.queue_depth() == []
