"""A service's subscriptions and hosts, on both backends: a correlated service runs on
one host (its instances are the service's, whatever the host), and a host app whose
declared subscription name belongs to another host says so at setup instead of
running a service that never gets a message."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from messagebox import MessageBox
from messagebox.errors import ValidationError
from messagebox.hosts import Delivery, HostApp, Orchestration, activate, receive
from messagebox.predicates import P
from tests.conftest import table_counts


class Tally(BaseModel):
    n: int = 0


class Picking(Orchestration[Tally]):
    name = "picking"
    correlation = ("t.Order",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.n += 1

    @receive(P("t.Kind") == "item")
    def item(self, d: Delivery) -> None:
        self.state.n += 1


def test_a_correlated_service_is_refused_on_a_second_host(box: MessageBox) -> None:
    box.create_host("a")
    box.create_host("b")
    box.subscribe(
        "picking", host="a", filter=P("t.Kind") == "order", correlation=("t.Order",), name="p1"
    )

    def items_on(host: str) -> None:
        box.subscribe(
            "picking",
            host=host,
            filter=P("t.Kind") == "item",
            kind="instance",
            correlation=("t.Order",),
            name="p2",
        )

    before = table_counts(box)
    with pytest.raises(ValidationError, match="'picking' has correlated subscriptions on host 'a'"):
        items_on("b")
    assert table_counts(box) == before  # nothing of it stored
    # on its own host it takes more; uncorrelated subscriptions of it go anywhere
    items_on("a")
    box.subscribe("picking", host="b", filter=P("t.Kind") == "audit", name="p3")
    assert {(s.name, s.host) for s in box.subscriptions(service="picking")} == {
        ("p1", "a"),
        ("p2", "a"),
        ("p3", "b"),
    }


def test_one_call_cannot_correlate_a_service_on_two_hosts(box: MessageBox) -> None:
    box.create_host("a")
    box.create_host("b")
    specs = [
        {"service": "picking", "host": h, "filter": P("t.Kind") == k, "correlation": ["t.Order"]}
        for h, k in (("a", "order"), ("b", "other"))
    ]
    with pytest.raises(ValidationError, match="on host 'b' too"):
        box.subscribe_many(specs)
    assert box.subscriptions() == []


def test_once_its_subscriptions_are_removed_the_service_can_move(box: MessageBox) -> None:
    box.create_host("a")
    box.create_host("b")
    box.subscribe(
        "picking", host="a", filter=P("t.Kind") == "order", correlation=("t.Order",), name="p1"
    )
    box.unsubscribe("p1")
    box.subscribe(
        "picking", host="b", filter=P("t.Kind") == "order", correlation=("t.Order",), name="p1"
    )
    assert [s.host for s in box.subscriptions(service="picking")] == ["b"]


def test_an_orchestration_set_up_on_a_second_host_is_refused(box: MessageBox) -> None:
    first, second = HostApp("a"), HostApp("b")
    first.orchestration(Picking)
    second.orchestration(Picking)
    first.setup(box)
    with pytest.raises(ValidationError, match="host 'a'"):
        second.setup(box)
    assert {s.host for s in box.subscriptions()} == {"a"}


def test_a_declared_name_taken_by_another_host_is_refused_at_setup(box: MessageBox) -> None:
    """Before, the second app's setup took the name clash for a concurrent setup of its
    own and went on: its service then ran with no subscription."""
    first, second = HostApp("a"), HostApp("b")
    for app in (first, second):
        app.add_service("audit", lambda _d: None)
        app.subscribe("audit", filter=P("t.Kind") == "order", name="audit")
    first.setup(box)
    with pytest.raises(ValidationError, match="'audit', which exists on host 'a'"):
        second.setup(box)
    first.setup(box)  # its own: set up again, nothing to do
    assert [(s.name, s.host) for s in box.subscriptions()] == [("audit", "a")]
