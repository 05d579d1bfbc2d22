"""Conformance: publish, route and store, on every backend (docs/concepts.md: Kinds)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from messagebox import (
    AlreadyExists,
    Message,
    MessageBox,
    Outcome,
    RoutingFailure,
    State,
    UnknownHost,
)
from messagebox.models import ROUTING_FAILURE, Suspension
from messagebox.predicates import P
from messagebox.storage import schema
from messagebox.storage.spool import FRAGMENT_SIZE
from tests.conftest import table_counts


@pytest.fixture
def hosts(box: MessageBox) -> MessageBox:
    box.create_host("shipping")
    box.create_host("billing")
    return box


def test_a_message_goes_to_every_matching_subscription_and_is_stored_once(hosts: MessageBox):
    # Given three subscriptions, two of which match, on two hosts
    eu = hosts.subscribe("ship-eu", host="shipping", filter=P("orders.Region") == "EU")
    big = hosts.subscribe("bill-big", host="billing", filter=P("orders.Total") > 1000)
    hosts.subscribe("ship-us", host="shipping", filter=P("orders.Region") == "US")
    # When one message is published
    [routed] = hosts.publish(
        [Message(b"<o/>", promoted={"orders.Region": "EU", "orders.Total": 5000})]
    )
    # Then it is routed to both, stored once, with one queue entry and reference each
    assert routed.outcome is Outcome.ROUTED
    assert set(routed.subscriptions) == {eu.id, big.id}
    counts = table_counts(hosts)
    assert counts["mb_spool"] == 1
    assert counts["mb_part"] == 1
    assert counts["mb_queue"] == 2
    assert hosts.references(routed.message_id) == 2
    depths = {(d.host, d.subscription): d.depth for d in hosts.queue_depth()}
    assert depths == {("shipping", eu.id): 1, ("billing", big.id): 1}


def test_a_subscription_whose_groups_all_match_gets_the_message_once(hosts: MessageBox):
    sub = hosts.subscribe(
        "any",
        host="shipping",
        filter=(P("a.X") == 1) | (P("a.Y") == 2) | P("a.X").exists(),
    )
    [routed] = hosts.publish([Message(b"m", promoted={"a.X": 1, "a.Y": 2})])
    assert routed.subscriptions == (sub.id,)
    assert table_counts(hosts)["mb_queue"] == 1


def test_a_whole_batch_routes_in_one_publish(hosts: MessageBox):
    subs = [hosts.subscribe(f"s{i}", host="shipping", filter=P("n.Value") >= i) for i in range(5)]
    results = hosts.publish([Message(b"x", promoted={"n.Value": v}) for v in range(5)])
    for value, routed in enumerate(results):
        assert set(routed.subscriptions) == {s.id for s in subs[: value + 1]}
    assert table_counts(hosts)["mb_queue"] == 1 + 2 + 3 + 4 + 5


def test_routing_failure_is_suspended_with_a_report_by_default(hosts: MessageBox):
    hosts.subscribe("eu", host="shipping", filter=P("orders.Region") == "EU")
    [routed] = hosts.publish([Message(b"x", promoted={"orders.Region": "APAC"})])
    assert routed.outcome is Outcome.SUSPENDED
    [entry] = hosts.suspended()
    assert entry.message_id == routed.message_id
    assert entry.reason == ROUTING_FAILURE
    assert not entry.resumable
    assert entry.report is not None
    assert entry.report["properties"] == {"orders.Region": ["s", "APAC"]}
    assert entry.report["publisher"] == "tests"
    published = datetime.fromisoformat(entry.report["time"])
    assert published.tzinfo is not None
    assert abs(published - entry.suspended_at) < timedelta(minutes=1)
    assert hosts.suspended_entry(entry.id).report == entry.report
    assert hosts.references(routed.message_id) == 1
    assert hosts.read_message(routed.message_id).body == b"x"


def test_a_routing_failure_report_is_read_from_the_spool_not_stored_twice(hosts: MessageBox):
    [_routed] = hosts.publish([Message(b"x", promoted={"orders.Region": "APAC", "n.V": 2})])
    with hosts.store.transaction() as conn:
        stored = conn.execute(sa.select(schema.suspended.c.report)).scalar_one()
    assert stored is None  # the spool row already holds the properties, time and publisher
    [entry] = hosts.suspended()
    assert entry.report is not None
    assert entry.report["properties"] == {"orders.Region": ["s", "APAC"], "n.V": ["i", 2]}
    # an entry stored with its report (by an earlier version) is read as stored
    old = {"properties": {"a.B": ["i", 1]}, "time": "2024-01-01T00:00:00+00:00", "publisher": "p"}
    with hosts.store.transaction() as conn:
        conn.execute(schema.suspended.update().values(report=json.dumps(old)))
    assert hosts.suspended_entry(entry.id).report == old


@pytest.mark.parametrize("size", [1, 5])
@pytest.mark.parametrize("policy", ["suspend", "drop"])
def test_a_batch_of_routed_and_unrouted_messages_takes_entry_ids_in_message_order(
    hosts: MessageBox, policy: str, size: int
):
    """The batch path (routed_all) gives each message its entries as the one-by-one path
    did: queue entries and routing-failure entries interleaved in message order, one
    reference per entry, nothing at all for a dropped message. (Five times the batch:
    more rows than DuckDB binds as parameters, so its ids go converted once, as Arrow.)"""
    sub = hosts.subscribe("eu", host="shipping", filter=P("orders.Region") == "EU")
    regions = ["EU", "APAC", "EU", "EU", "US", "EU"] * size
    results = hosts.publish(
        [Message(b"x", promoted={"orders.Region": r}) for r in regions], policy=policy
    )
    unrouted = Outcome.SUSPENDED if policy == "suspend" else Outcome.DROPPED
    assert [r.outcome for r in results] == [
        Outcome.ROUTED if r == "EU" else unrouted for r in regions
    ]
    assert [r.subscriptions for r in results] == [(sub.id,) if r == "EU" else () for r in regions]
    with hosts.store.transaction() as conn:
        q = schema.queue
        s = schema.suspended
        entries = [(row.id, row.msg) for row in conn.execute(sa.select(q.c.id, q.c.msg))]
        entries += [(row.id, row.msg) for row in conn.execute(sa.select(s.c.id, s.c.msg))]
    stored = [r for r in results if r.outcome is not Outcome.DROPPED]
    assert [msg for _, msg in sorted(entries)] == [r.message_id for r in stored]
    for r in results:
        assert hosts.references(r.message_id) == (r.outcome is not Outcome.DROPPED)


def test_routing_failure_is_dropped_with_policy_drop(hosts: MessageBox):
    before = table_counts(hosts)
    [routed] = hosts.publish([Message(b"x", promoted={"a.B": 1})], policy="drop")
    assert routed.outcome is Outcome.DROPPED
    assert table_counts(hosts) == before


def test_routing_failure_with_policy_raise_stores_nothing_of_the_batch(hosts: MessageBox):
    hosts.subscribe("eu", host="shipping", filter=P("orders.Region") == "EU")
    before = table_counts(hosts)
    with pytest.raises(RoutingFailure, match="message 1"):
        hosts.publish(
            [
                Message(b"ok", promoted={"orders.Region": "EU"}),
                Message(b"lost", promoted={"orders.Region": "US"}),
            ],
            policy="raise",
        )
    assert table_counts(hosts) == before


def test_a_routing_failure_is_rerouted_once_a_subscription_exists(hosts: MessageBox):
    [routed] = hosts.publish([Message(b"x", promoted={"orders.Region": "US"})])
    [entry] = hosts.suspended()
    assert hosts.reroute(entry.id) == {}  # still nothing matches: it stays suspended
    us = hosts.subscribe("us", host="shipping", filter=P("orders.Region") == "US")
    assert hosts.reroute() == {entry.id: (us.id,)}
    assert hosts.suspended() == []
    assert [(d.subscription, d.depth) for d in hosts.queue_depth()] == [(us.id, 1)]
    assert hosts.references(routed.message_id) == 1


def test_would_route_answers_without_storing(hosts: MessageBox):
    sub = hosts.subscribe("eu", host="shipping", filter=P("orders.Region") == "EU")
    before = table_counts(hosts)
    assert [s.id for s in hosts.would_route({"orders.Region": "EU"})] == [sub.id]
    assert hosts.would_route({"orders.Region": "US"}) == []
    assert table_counts(hosts) == before


def test_a_message_reads_back_with_typed_context_and_parts(hosts: MessageBox):
    hosts.subscribe("all", host="shipping", filter=P("a.Id").exists())
    when = datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    promoted = {"a.Id": 7, "a.Price": 7.0, "a.Name": "7", "a.Ok": True, "a.When": when}
    [routed] = hosts.publish(
        [
            Message(
                parts={"body": b"<order/>", "note": "héllo"},
                promoted=promoted,
                written={"a.Comment": "x" * 1000, "a.Seen": when},
            )
        ]
    )
    stored = hosts.read_message(routed.message_id)
    assert stored.promoted == {**promoted, "a.When": when.astimezone(UTC)}
    assert type(stored.promoted["a.Price"]) is float
    assert type(stored.promoted["a.Id"]) is int
    assert stored.written["a.Comment"] == "x" * 1000
    assert stored.parts == {"body": b"<order/>", "note": "héllo".encode()}
    assert stored.body == b"<order/>"


def test_a_large_part_is_stored_in_fragments_and_streams_back(hosts: MessageBox):
    hosts.subscribe("all", host="shipping", filter=P("a.Id").exists())
    big = bytes(range(256)) * (FRAGMENT_SIZE * 5 // 2 // 256)  # 2.5 fragments
    [routed] = hosts.publish(
        [Message(parts={"body": b"small", "blob": io.BytesIO(big)}, promoted={"a.Id": 1})]
    )
    chunks = list(hosts.iter_part(routed.message_id, "blob"))
    assert len(chunks) == 3
    assert b"".join(chunks) == big
    assert hosts.read_message(routed.message_id).parts["blob"] == big
    assert table_counts(hosts)["mb_fragment"] == 2


def test_a_stopped_service_holds_its_messages_until_started(hosts: MessageBox):
    sub = hosts.subscribe("late", host="shipping", filter=P("a.X") == 1, state="stopped")
    [routed] = hosts.publish([Message(b"x", promoted={"a.X": 1})])
    assert routed.subscriptions == (sub.id,)
    assert [(d.state, d.depth) for d in hosts.queue_depth()] == [("held", 1)]
    hosts.set_service_state("late", State.STARTED)
    assert [(d.state, d.depth) for d in hosts.queue_depth()] == [("ready", 1)]


def test_an_unenlisted_service_gets_nothing(hosts: MessageBox):
    hosts.subscribe("gone", host="shipping", filter=P("a.X") == 1)
    hosts.set_service_state("gone", "unenlisted")
    [routed] = hosts.publish([Message(b"x", promoted={"a.X": 1})], policy="drop")
    assert routed.outcome is Outcome.DROPPED
    hosts.set_service_state("gone", "started")
    [routed] = hosts.publish([Message(b"x", promoted={"a.X": 1})])
    assert routed.outcome is Outcome.ROUTED


def test_identical_predicates_are_stored_once(hosts: MessageBox):
    hosts.subscribe_many(
        [
            {
                "service": f"s{i}",
                "host": "shipping",
                "filter": (P("a.Type") == "PO") & (P("a.Total") > i),
            }
            for i in range(50)
        ]
    )
    counts = table_counts(hosts)
    assert counts["mb_predicate"] == 51  # one shared equality and 50 distinct ranges
    assert counts["mb_pred_str"] == 1
    assert counts["mb_group_pred"] == 100


def test_unsubscribe_stops_routing_and_collects_unshared_predicates(hosts: MessageBox):
    a = hosts.subscribe("a", host="shipping", filter=(P("a.T") == "PO") & (P("a.N") > 1))
    b = hosts.subscribe("b", host="shipping", filter=P("a.T") == "PO")
    assert hosts.unsubscribe(a.id) == 1
    [routed] = hosts.publish([Message(b"x", promoted={"a.T": "PO", "a.N": 5})])
    assert routed.subscriptions == (b.id,)
    counts = table_counts(hosts)
    assert counts["mb_predicate"] == 1
    assert counts["mb_pred_num"] == 0
    assert [s.id for s in hosts.subscriptions()] == [b.id]


def test_instance_subscriptions_carry_their_instance_to_the_queue(hosts: MessageBox):
    sub = hosts.subscribe(
        "orch",
        host="shipping",
        filter=P("orders.OrderId") == 42,
        kind="instance",
        instance_id="inst-1",
    )
    [routed] = hosts.publish([Message(b"x", promoted={"orders.OrderId": 42})])
    assert routed.subscriptions == (sub.id,)
    assert hosts.subscriptions(instance_id="inst-1") == [sub]


def test_a_trusted_publisher_sets_reserved_properties_and_the_alias_routes(hosts: MessageBox):
    sub = hosts.subscribe("po", host="shipping", filter=P("BTS.MessageType") == "PO")
    [routed] = hosts.publish(
        [Message(b"x", promoted={"messagebox.MessageType": "PO"})], trusted=True
    )
    assert routed.subscriptions == (sub.id,)


def test_numbers_compare_exactly_in_storage(hosts: MessageBox):
    big = 2**53
    sub = hosts.subscribe("exact", host="shipping", filter=P("a.N") == float(big))
    results = hosts.publish(
        [Message(b"x", promoted={"a.N": n}) for n in (big, big + 1, 2**63 - 1)], policy="drop"
    )
    assert [r.subscriptions for r in results] == [(sub.id,), (), ()]


def test_strings_compare_by_code_point_in_storage(hosts: MessageBox):
    sub = hosts.subscribe("after-Z", host="shipping", filter=P("a.S") > "Z")
    results = hosts.publish(
        [Message(b"x", promoted={"a.S": s}) for s in ("a", "Y", "é", "ZZ", "😀")], policy="drop"
    )
    assert [bool(r.subscriptions) for r in results] == [True, False, True, True, True]
    assert sub.id in results[0].subscriptions


def test_schema_creation_is_idempotent(backend_url: str):
    for _ in range(2):
        with MessageBox(backend_url) as box:
            box.hosts()


def test_subscribing_to_an_unknown_host_changes_nothing(hosts: MessageBox):
    before = table_counts(hosts)
    with pytest.raises(UnknownHost, match="nowhere"):
        hosts.subscribe("s", host="nowhere", filter=P("a.X") == 1)
    assert table_counts(hosts) == before


def test_subscription_names_are_unique(hosts: MessageBox):
    hosts.subscribe("s", host="shipping", filter=P("a.X") == 1, name="one")
    before = table_counts(hosts)
    with pytest.raises(AlreadyExists, match="one"):
        hosts.subscribe("s", host="shipping", filter=P("a.Y") == 1, name="one")
    assert table_counts(hosts) == before


def test_a_message_stored_suspended_without_routing_reaches_no_subscription(
    hosts: MessageBox,
):
    # Given a subscription for messages without a region, and one for a failed input's
    # error report (as a receive location routes it when its port says so)
    no_region = hosts.subscribe(
        "no-region", host="shipping", filter=P("orders.Region").not_exists()
    )
    reports = hosts.subscribe("reports", host="billing", filter=P("err.Code").exists())
    refused = Message(b"<bad", promoted={"err.Code": "E1"})
    # When two failed inputs are stored suspended, one not routed and one routed
    quiet, loud = hosts.publish(
        [refused, refused],
        suspend={
            0: Suspension("receive-failure", "E1: bad"),
            1: Suspension("receive-failure", "E1: bad", route=True),
        },
    )
    # Then the first reaches no subscription (no properties is not "no region"), the
    # second reaches the subscriptions its properties match, and both are suspended
    assert (quiet.outcome, quiet.subscriptions) == (Outcome.SUSPENDED, ())
    assert (loud.outcome, loud.subscriptions) == (Outcome.SUSPENDED, (no_region.id, reports.id))
    assert {(d.host, d.depth) for d in hosts.queue_depth()} == {("billing", 1), ("shipping", 1)}
    assert table_counts(hosts)["mb_suspended"] == 2
