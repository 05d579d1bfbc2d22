"""Prometheus metrics, on both backends: this process's counters count what committed
(published, routed, routing failures, delivered, failed, suspended, resumed,
terminated), claims are timed, and the store's gauges (queue depth, oldest entry,
suspended entries, host instances) are read at scrape time."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.delivery import leases
from messagebox.errors import RoutingFailure
from messagebox.hosts import Delivery, HostInstance
from messagebox.metrics import exposition
from messagebox.models import DELIVERY_FAILURE, ROUTING_FAILURE
from messagebox.predicates import P
from tests.conftest import FAST_FAILING as FAST
from tests.conftest import claim, fail_for_good, wait_for


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Counter values now, to compare with later ones."""

    NAMES: tuple[tuple[str, dict[str, str]], ...] = (
        ("messagebox_published_total", {}),
        ("messagebox_routing_failures_total", {"outcome": "suspended"}),
        ("messagebox_routing_failures_total", {"outcome": "dropped"}),
        ("messagebox_suspended_total", {"reason": ROUTING_FAILURE}),
        ("messagebox_suspended_total", {"reason": DELIVERY_FAILURE}),
    )

    def __init__(self, host: str) -> None:
        self.host = host
        self.before = self.read()

    def read(self) -> dict[str, float]:
        found = {f"{n}{sorted(lb.items())}": value(n, **lb) for n, lb in self.NAMES}
        for name in (
            "messagebox_routed_total",
            "messagebox_delivered_total",
            "messagebox_delivery_failures_total",
            "messagebox_resumed_total",
            "messagebox_terminated_total",
        ):
            found[name] = value(name, host=self.host)
        return found

    def __call__(self) -> dict[str, float]:
        now = self.read()
        return {k: now[k] - self.before[k] for k in now if now[k] != self.before[k]}


@pytest.fixture
def host(box: MessageBox) -> str:
    """A host of a name of its own, so that its counters are this test's."""
    name = f"h{uuid.uuid4().hex[:8]}"
    box.create_host(name, **FAST)
    box.subscribe("orders", host=name, filter=P("t.Kind") == "order", name="orders")
    return name


def test_publishing_counts_published_routed_and_routing_failures(
    box: MessageBox, host: str
) -> None:
    delta = Delta(host)
    # When three messages are published: two route, one matches nothing (suspended)
    box.publish(
        [
            Message(b"1", promoted={"t.Kind": "order"}),
            Message(b"2", promoted={"t.Kind": "order"}),
            Message(b"3", promoted={"t.Kind": "other"}),
        ]
    )
    # and one more matches nothing and is dropped by the policy
    box.publish([Message(b"4", promoted={"t.Kind": "other"})], policy="drop")
    # Then the counters say so
    assert delta() == {
        "messagebox_published_total[]": 3,
        "messagebox_routed_total": 2,
        "messagebox_routing_failures_total[('outcome', 'suspended')]": 1,
        "messagebox_routing_failures_total[('outcome', 'dropped')]": 1,
        "messagebox_suspended_total[('reason', 'routing-failure')]": 1,
    }


def test_a_rolled_back_publish_counts_nothing(box: MessageBox, host: str) -> None:
    delta = Delta(host)
    with pytest.raises(RoutingFailure):
        box.publish(
            [Message(b"1", promoted={"t.Kind": "order"}), Message(b"2", promoted={})],
            policy="raise",
        )
    assert delta() == {}


def test_delivery_counts_delivered_failed_suspended_resumed_terminated(
    box: MessageBox, host: str, instances: list[HostInstance]
) -> None:
    box.publish([Message(str(i).encode(), promoted={"t.Kind": "order"}) for i in range(3)])
    delta = Delta(host)
    claims = value("messagebox_claim_seconds_count", host=host)

    def orders(d: Delivery) -> None:
        if d.body == b"0":
            raise RuntimeError("no")

    # When a host instance delivers two and fails the third twice (suspended)
    inst = HostInstance(box, host, {"orders": orders}, settings=FAST).start()
    instances.append(inst)
    wait_for(lambda: bool(box.suspended(host=host)), "the suspension")
    wait_for(lambda: not box.queue_depth(host), "the deliveries")
    inst.stop(timeout=5)
    assert delta() == {
        "messagebox_delivered_total": 2,
        "messagebox_delivery_failures_total": 2,
        "messagebox_suspended_total[('reason', 'delivery-failure')]": 1,
    }
    # and the claims were timed, and each entry's wait on the queue observed once
    assert value("messagebox_claim_seconds_count", host=host) > claims
    assert value("messagebox_claim_latency_seconds_count", host=host) == 3
    # When the suspended entry is resumed, suspended again by hand and terminated
    [entry] = box.suspended(host=host)
    box.resume(entry.id)
    assert delta()["messagebox_resumed_total"] == 1
    [claimed] = claim(box, host)  # claim it and fail it permanently
    fail_for_good(box, claimed, "gave up")
    [entry] = box.suspended(host=host)
    box.terminate(entry.id)
    got = delta()
    assert got["messagebox_terminated_total"] == 1
    assert got["messagebox_suspended_total[('reason', 'delivery-failure')]"] == 2
    assert got["messagebox_delivery_failures_total"] == 3


def test_an_entry_s_wait_is_its_first_claim_s_and_a_resumed_entry_waits_from_its_resume(
    box: MessageBox, host: str
) -> None:
    box.publish([Message(b"1", promoted={"t.Kind": "order"})])
    # (ages by the database's clock, which claims measure waits with)
    wait_for(lambda: box.queue_stats(host)[0].oldest_age_seconds >= 0.3, "a 0.3 s wait")
    # The first claim has waited since the publish
    [first] = claim(box, host, n=5, lease_seconds=0.05)
    assert first.waited is not None
    assert first.waited >= 0.3
    # A lapsed lease, then a give-back, are claimed again, but not waited again
    lapsed: list[Claim] = []

    def claimed_again() -> bool:
        lapsed.extend(claim(box, host, n=5))  # nothing while the lease holds
        return bool(lapsed)

    wait_for(claimed_again, "the lease to lapse")
    [again] = lapsed
    assert again.attempts == 2
    assert again.waited is None
    with box.store.transaction() as conn:
        assert leases.give_back(conn, "t", [again]) == 1
    [given_back] = claim(box, host, n=5)
    assert given_back.attempts == 2
    assert given_back.waited is None
    # Suspended, then resumed: it waits again, from its resume
    fail_for_good(box, given_back, "gave up")
    [entry] = box.suspended(host=host)
    wait_for(lambda: box.now() - entry.suspended_at >= timedelta(seconds=0.3), "0.3 s suspended")
    started = time.monotonic()
    box.resume(entry.id)
    [resumed] = claim(box, host, n=5)
    between = time.monotonic() - started  # encloses the resume and the claim
    assert resumed.attempts == 1
    assert resumed.waited is not None
    # not the 0.65 s or more since the publish, nor the 0.3 s since the suspension
    assert resumed.waited <= between + 0.01


def test_the_exposition_has_the_store_s_gauges(box: MessageBox, host: str) -> None:
    # Given two queued messages and a routing failure
    box.publish([Message(b"1", promoted={"t.Kind": "order"}) for _ in range(2)])
    box.publish([Message(b"x", promoted={"t.Kind": "other"})])
    # When the metrics are scraped
    body, content_type = exposition(box)
    assert content_type.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    # Then the gauges show the queue and the suspended queue, and the counters are there
    assert samples[("messagebox_queue_depth", (("host", host), ("state", "ready")))] == 2
    assert samples[("messagebox_queue_depth", (("host", host), ("state", "leased")))] == 0
    assert samples[("messagebox_queue_oldest_seconds", (("host", host),))] >= 0
    assert samples[("messagebox_suspended_entries", (("reason", ROUTING_FAILURE),))] == 1
    assert samples[("messagebox_host_instances", (("host", host),))] == 0
    assert samples[("messagebox_messages", ())] == 3
    assert ("messagebox_routed_total", (("host", host),)) in samples
