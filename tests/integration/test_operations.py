"""What operators (the CLI, a console) ask of a MessageBox, on both backends: route
explanations that agree with the router, queue statistics, counts, the suspended queue
in batches, and opening without creating."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox, State
from messagebox.errors import (
    NoSchema,
    UnknownHost,
    UnknownMessage,
    UnknownSuspendedEntry,
    ValidationError,
)
from messagebox.models import ROUTING_FAILURE, SERVICE_UNENLISTED
from messagebox.predicates import Filter, P
from tests.conftest import claim, table_counts
from tests.strategies import filters, messages


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    subs=st.lists(st.tuples(filters, st.sampled_from(list(State))), min_size=1, max_size=5),
    batch=st.lists(messages, min_size=1, max_size=4),
)
def test_the_explanation_agrees_with_would_route(
    shared_box: MessageBox,
    subs: list[tuple[Filter, State]],
    batch: list[dict[str, object]],
) -> None:
    # Given random subscriptions, started, stopped or unenlisted
    made = shared_box.subscribe_many(
        [
            {"service": f"s{i}", "host": "h", "filter": f, "state": st_}
            for i, (f, st_) in enumerate(subs)
        ]
    )
    try:
        for props in batch:
            # When a message is explained
            found = shared_box.explain(props)
            # Then it routes exactly where the SQL router would route it
            routes = {e.subscription.id for e in found.subscriptions if e.routes}
            assert routes == {s.id for s in shared_box.would_route(props)}
            for e in found.subscriptions:
                # and its filter's explanation is the reference evaluator's answer
                assert e.matched is e.subscription.filter.matches(props)
                assert e.routes is (e.matched and e.subscription.state is not State.UNENLISTED)
                failed = [g.failed for g in e.filter.groups if not g.matched]
                assert all(f is not None and not f.holds for f in failed)
    finally:
        shared_box.unsubscribe(*[s.id for s in made])


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    box.create_host("shipping")
    box.create_host("billing")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU", name="ship-eu")
    box.subscribe("bill", host="billing", filter=P("orders.Total") >= 100, name="bill-big")
    return box


def test_a_stored_message_is_explained_from_its_promoted_properties(shop: MessageBox) -> None:
    # Given a stored US order of 150
    [routed] = shop.publish([Message(b"o", promoted={"orders.Region": "US", "orders.Total": 150})])
    # When it is explained by id
    found = shop.explain(str(routed.message_id))
    # Then the explanation reads its stored properties and says why ship-eu missed it
    assert found.message_id == routed.message_id
    assert [s.id for s in found.routes_to] == list(routed.subscriptions)
    ship = next(e for e in found.subscriptions if e.subscription.name == "ship-eu")
    [group] = ship.filter.groups
    assert group.failed is not None
    assert (group.failed.actual, group.failed.why) == ("US", '"US" != "EU"')


def test_explaining_an_unknown_message_changes_nothing(shop: MessageBox) -> None:
    before = table_counts(shop)
    with pytest.raises(UnknownMessage, match="no message"):
        shop.explain(uuid.uuid4())
    assert table_counts(shop) == before


def test_queue_stats_count_ready_held_and_leased_entries_and_the_oldest(
    shop: MessageBox,
) -> None:
    # Given three EU orders for shipping, two big ones for billing, billing stopped
    shop.publish(
        Message(b"o", promoted={"orders.Region": "EU", "orders.Total": t}) for t in (1, 200, 300)
    )
    shop.set_service_state("bill", "stopped")
    # and one shipping entry claimed by a host instance
    [_claimed] = claim(shop, "shipping", owner="test-instance", lease_seconds=60)
    # When the queue statistics are read
    found = {q.host: q for q in shop.queue_stats()}
    # Then each host's subscription shows its entries by state and its oldest's age
    ship, bill = found["shipping"], found["billing"]
    assert (ship.name, ship.service, ship.depth, ship.ready, ship.held, ship.leased) == (
        "ship-eu",
        "ship",
        3,
        2,
        0,
        1,
    )
    assert (bill.depth, bill.ready, bill.held, bill.leased) == (2, 0, 2, 0)
    assert 0 <= ship.oldest_age_seconds < 60
    assert abs(ship.oldest_enqueued_at - datetime.now(UTC)) < timedelta(minutes=1)
    assert [q.host for q in shop.queue_stats("billing")] == ["billing"]


def test_stats_count_every_kind_of_thing(shop: MessageBox) -> None:
    # Given two routed messages, one routing failure and an unenlisted service
    shop.publish(
        [
            Message(b"a", promoted={"orders.Region": "EU", "orders.Total": 500}),
            Message(b"b", promoted={"orders.Region": "EU"}),
            Message(b"c", promoted={"orders.Region": "US"}),
        ]
    )
    shop.set_service_state("bill", "unenlisted")
    # When the box is counted
    stats = shop.stats()
    # Then every count is what was done
    assert stats.messages == 3
    assert stats.parts == 3
    assert stats.part_bytes == 3
    assert stats.queued == {"ready": 2, "held": 0, "blocked": 0, "leased": 0, "scheduled": 0}
    assert stats.suspended == {ROUTING_FAILURE: 1, SERVICE_UNENLISTED: 1}
    assert stats.subscriptions == {"started": 1, "unenlisted": 1}
    assert (stats.hosts, stats.host_instances, stats.service_instances) == (2, 0, {})


def _suspend_many(box: MessageBox, n: int) -> None:
    box.publish(Message(b"x", promoted={"orders.Total": 100 + i}) for i in range(n))
    box.set_service_state("bill", "unenlisted")  # every waiting entry: resumable
    box.set_service_state("bill", "started")
    box.publish([Message(b"x", promoted={"orders.Region": "nowhere"})])  # not resumable


def test_bulk_resume_in_batches_reports_progress_and_skips_what_cannot_resume(
    shop: MessageBox,
) -> None:
    _suspend_many(shop, 7)
    seen: list[tuple[int, int]] = []
    # When every suspended entry is resumed, three per transaction
    resumed = shop.resume(
        reason=SERVICE_UNENLISTED, batch=3, progress=lambda d, t: seen.append((d, t))
    )
    # Then all seven are back on the queue, in id order, with progress after each batch
    assert len(resumed) == 7
    assert resumed == sorted(resumed)
    assert seen == [(3, 7), (6, 7), (7, 7)]
    assert [e.reason for e in shop.suspended()] == [ROUTING_FAILURE]
    assert sum(q.depth for q in shop.queue_stats("billing")) == 7


def test_bulk_terminate_in_batches_deletes_every_match(shop: MessageBox) -> None:
    _suspend_many(shop, 4)
    seen: list[tuple[int, int]] = []
    gone = shop.terminate(host="billing", batch=2, progress=lambda d, t: seen.append((d, t)))
    assert len(gone) == 4
    assert seen == [(2, 4), (4, 4)]  # a last, empty batch reports nothing new
    assert [e.reason for e in shop.suspended()] == [ROUTING_FAILURE]


def test_suspended_entries_are_found_by_age_and_by_id(shop: MessageBox) -> None:
    _suspend_many(shop, 2)
    now = datetime.now(UTC)
    assert len(shop.suspended(before=now + timedelta(minutes=1))) == 3
    assert shop.suspended(before=now - timedelta(hours=1)) == []
    first = shop.suspended()[0]
    assert shop.suspended_entry(first.id) == first
    with pytest.raises(UnknownSuspendedEntry, match="no suspended entry 999999"):
        shop.suspended_entry(999_999)


def test_a_message_summary_has_the_context_and_part_sizes_without_the_parts(
    shop: MessageBox,
) -> None:
    [routed] = shop.publish(
        [
            Message(
                parts={"body": b"12345", "extra": b"xy"},
                promoted={"orders.Region": "EU"},
                written={"orders.Note": "hello"},
            )
        ]
    )
    summary = shop.message_summary(routed.message_id)
    assert summary.part_sizes == {"body": 5, "extra": 2}
    assert (summary.promoted, summary.written) == (
        {"orders.Region": "EU"},
        {"orders.Note": "hello"},
    )
    with pytest.raises(UnknownMessage):
        shop.message_summary(uuid.uuid4())


def test_opening_without_create_refuses_a_missing_database_and_creates_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "typo.duckdb"
    with pytest.raises(NoSchema, match="no database at"):
        MessageBox(f"duckdb:///{path}", create=False)
    assert not path.exists()


def test_opening_without_create_refuses_a_database_without_the_schema(pg_url: str) -> None:
    with pytest.raises(NoSchema, match="has no messagebox schema"):
        MessageBox(pg_url, create=False)
    MessageBox(pg_url).close()  # created
    MessageBox(pg_url, create=False).close()  # now it opens


def test_configure_host_changes_some_settings_and_refuses_bad_ones(box: MessageBox) -> None:
    """(issue 21, item 5) A host's settings can change after it is created."""
    box.create_host("h", dequeue_threads=2, max_attempts=3)
    changed = box.configure_host("h", max_attempts=7, claim_batch=20)
    assert (changed.settings.max_attempts, changed.settings.claim_batch) == (7, 20)
    assert changed.settings.dequeue_threads == 2  # the others keep their values
    assert box.host("h").settings == changed.settings
    with pytest.raises(ValidationError, match="host 'h': bad settings: max_attempts"):
        box.configure_host("h", max_attempts="abc")
    with pytest.raises(ValidationError, match="'bogus' is not a setting"):
        box.configure_host("h", bogus=1)
    with pytest.raises(UnknownHost):
        box.configure_host("nowhere", max_attempts=2)
    assert box.host("h").settings == changed.settings  # nothing changed by the refusals


def test_cleanup_asked_to_stop_ends_between_batches(box: MessageBox) -> None:
    """A host instance that stops ends its cleanup after the batch in progress; what was
    deleted stays deleted and the next run takes the rest."""
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(5)])  # routing failures
    box.terminate(*[e.id for e in box.suspended()])
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 1  # after the first batch

    first = box.cleanup(batch=2, stop=stop)
    assert (first.messages, first.stopped) == (2, True)
    rest = box.cleanup(batch=2)
    assert (rest.messages, rest.stopped) == (3, False)
