"""Message tracking, on both backends: off by default; once enabled, every event of a
message's life is recorded in the transaction that causes it (so a rolled-back one
leaves none); other processes see the setting; cleanup trims past the retention."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from messagebox import Message, MessageBox
from messagebox.errors import RoutingFailure, ValidationError
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import DELIVERY_FAILURE, ROUTING_FAILURE
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from messagebox.storage.tracking import EVENTS, TrackingSettings
from tests.conftest import FAST_FAILING as FAST
from tests.conftest import wait_for


@pytest.fixture
def tracked_box(box: MessageBox) -> MessageBox:
    box.create_host("h", **FAST)
    box.subscribe("orders", host="h", filter=P("t.Kind") == "order", name="orders")
    box.subscribe("audit", host="h", filter=P("t.Kind").exists(), name="audit")
    box.configure_tracking(True, retention=timedelta(hours=1))
    return box


def events(box: MessageBox, message_id: object) -> list[tuple[str, str | None]]:
    names = {s.id: s.name for s in box.subscriptions()}
    return [
        (e.event, names.get(e.subscription) if e.subscription is not None else None)
        for e in box.tracked(str(message_id))
    ]


def test_tracking_is_off_by_default_and_records_nothing(box: MessageBox) -> None:
    # Given a new store
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.Kind") == "order")
    # Then tracking is disabled, with the default retention
    assert box.tracking() == TrackingSettings(enabled=False, retention=timedelta(days=7))
    # When a message is published, nothing is tracked
    box.publish([Message(b"x", promoted={"t.Kind": "order"})])
    assert box.tracked() == []


def test_a_message_s_whole_life_is_tracked_in_order(
    tracked_box: MessageBox, instances: list[HostInstance]
) -> None:
    box = tracked_box
    # Given a message routed to two subscriptions, one whose service fails every time
    [routed] = box.publish([Message(b"order", promoted={"t.Kind": "order"})])

    def orders(d: Delivery) -> None:
        raise RuntimeError("warehouse down")

    seen = threading.Event()
    inst = HostInstance(
        box, "h", {"orders": orders, "audit": lambda d: seen.set()}, settings=FAST
    ).start()
    instances.append(inst)
    # When it is delivered to one, and suspended after two attempts at the other
    wait_for(lambda: bool(box.suspended(reason=DELIVERY_FAILURE)), "the suspension")
    assert seen.is_set()
    inst.stop(timeout=5)
    history = box.tracked(routed.message_id)
    # Then its history says so, in order, with hosts, entries and details
    assert [(e.event, e.host) for e in history][:3] == [
        ("published", None),
        ("routed", "h"),
        ("routed", "h"),
    ]
    assert sorted(events(box, routed.message_id)[3:]) == sorted(
        [
            ("delivered", "audit"),
            ("failed", "orders"),
            ("failed", "orders"),
            ("suspended", "orders"),
        ]
    )
    failed = [e for e in history if e.event == "failed"]
    assert [e.detail for e in failed] == ["RuntimeError: warehouse down"] * 2
    [suspended] = [e for e in history if e.event == "suspended"]
    assert suspended.detail == DELIVERY_FAILURE
    assert history[-1].event == "suspended"  # after both failures
    [entry] = box.suspended(reason=DELIVERY_FAILURE)
    assert suspended.entry == entry.id
    assert history[0].detail == "tests"  # the publisher
    # When it is resumed and then delivered
    box.resume(entry.id)
    instances.append(
        HostInstance(
            box, "h", {"orders": lambda d: None, "audit": lambda d: None}, settings=FAST
        ).start()
    )
    wait_for(lambda: not box.queue_depth(), "the delivery")
    # Then the history ends resumed, delivered
    assert events(box, routed.message_id)[-2:] == [("resumed", "orders"), ("delivered", "orders")]
    assert [e.event for e in box.tracked(event="delivered")] == ["delivered", "delivered"]


def test_routing_failures_and_terminations_are_tracked(tracked_box: MessageBox) -> None:
    box = tracked_box
    # Given a message that matches nothing (suspended by the default policy)
    [lost] = box.publish([Message(b"?", promoted={"t.Other": 1})])
    # When its suspended entry is terminated
    [entry] = box.suspended(reason=ROUTING_FAILURE)
    box.terminate(entry.id)
    # Then its history is published, suspended (routing failure), terminated
    history = box.tracked(lost.message_id)
    assert [(e.event, e.detail) for e in history] == [
        ("published", "tests"),
        ("suspended", ROUTING_FAILURE),
        ("terminated", None),
    ]
    assert {e.entry for e in history[1:]} == {entry.id}


def test_a_rolled_back_publish_tracks_nothing(tracked_box: MessageBox) -> None:
    box = tracked_box
    # When a batch fails to route under policy "raise", storing nothing
    with pytest.raises(RoutingFailure):
        box.publish(
            [Message(b"a", promoted={"t.Kind": "order"}), Message(b"b", promoted={"t.X": 1})],
            policy="raise",
        )
    # Then no event was recorded for it either
    assert box.tracked() == []


def test_events_can_be_filtered(tracked_box: MessageBox) -> None:
    box = tracked_box
    box.publish([Message(b"1", promoted={"t.Kind": "order"})])
    box.publish([Message(b"2", promoted={"t.Kind": "note"})])
    orders = box.subscription("orders").id
    # by event, subscription, host, time and count
    assert len(box.tracked(event="published")) == 2
    assert len(box.tracked(event="routed")) == 3
    assert [e.subscription for e in box.tracked(subscription=orders)] == [orders]
    assert len(box.tracked(host="h")) == 3
    assert box.tracked(since=datetime.now(UTC) + timedelta(minutes=1)) == []
    newest = box.tracked(limit=2)
    assert len(newest) == 2
    assert newest == box.tracked()[-2:]  # the newest, oldest first


def test_disabling_stops_recording_and_keeps_what_was_recorded(tracked_box: MessageBox) -> None:
    box = tracked_box
    box.publish([Message(b"1", promoted={"t.Kind": "note"})])
    # When tracking is disabled, the retention is kept and new messages are not tracked
    assert box.configure_tracking(False) == TrackingSettings(False, timedelta(hours=1))
    box.publish([Message(b"2", promoted={"t.Kind": "note"})])
    assert [e.event for e in box.tracked()] == ["published", "routed"]


def test_another_process_sees_the_setting(backend_url: str, box: MessageBox) -> None:
    # Given a second MessageBox on the same store (another process, as far as the
    # settings cache is concerned), which has read the setting already
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.Kind").exists())
    with MessageBox(backend_url) as other:
        other.store.tracking.ttl = 0.2
        other.publish([Message(b"before", promoted={"t.Kind": "x"})])
        # When the first enables tracking
        box.configure_tracking(True)
        # Then the second's publishes are tracked once its cache expires

        def other_sees_it() -> bool:
            with other.store.transaction() as conn:  # through its cache, as a publish reads
                return other.store.tracking.get(conn).enabled

        wait_for(other_sees_it, "the second's cache to expire")
        [routed] = other.publish([Message(b"after", promoted={"t.Kind": "x"})])
    assert {e.message_id for e in box.tracked()} == {routed.message_id}


def test_cleanup_trims_events_past_the_retention(tracked_box: MessageBox) -> None:
    box = tracked_box
    box.publish([Message(b"old", promoted={"t.Kind": "note"})])
    [new] = box.publish([Message(b"new", promoted={"t.Kind": "note"})])
    # Given events of one message made two hours old (the retention is one hour)
    t = mb_schema.tracking
    with box.store.transaction() as conn:
        conn.execute(
            t.update()
            .where(t.c.msg != new.message_id)
            .values(tracked_at=datetime.now(UTC) - timedelta(hours=2))
        )
    # When cleanup runs
    report = box.cleanup()
    # Then those are gone and the others kept
    assert report.tracking_events == 2
    assert {e.message_id for e in box.tracked()} == {new.message_id}


def test_bad_settings_and_queries_are_refused(tracked_box: MessageBox) -> None:
    box = tracked_box
    before = box.tracking()
    with pytest.raises(ValidationError, match="retention must be a positive timedelta"):
        box.configure_tracking(True, retention=-5)
    with pytest.raises(ValidationError, match="enabled must be a bool"):
        box.configure_tracking("yes")  # type: ignore[arg-type]
    assert box.tracking() == before
    with pytest.raises(ValidationError, match="unknown tracking event 'delivred'"):
        box.tracked(event="delivred")
    with pytest.raises(ValidationError, match="not a message id: 'nope'"):
        box.tracked("nope")
    with pytest.raises(ValidationError, match="limit must be a positive int"):
        box.tracked(limit=0)


def test_every_event_kind_is_named_once() -> None:
    assert EVENTS == (
        "published",
        "routed",
        "delivered",
        "failed",
        "suspended",
        "expired",
        "resumed",
        "terminated",
    )
    assert len(set(EVENTS)) == len(EVENTS)


def test_tracking_rows_are_written_in_bulk(tracked_box: MessageBox) -> None:
    box = tracked_box
    # A batch of 500 messages routed twice each: 1,500 events, one insert per kind
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "mb_tracking" in statement:
            statements.append(statement)

    sa.event.listen(box.store.engine, "before_cursor_execute", seen)
    try:
        box.publish(Message(b"x", promoted={"t.Kind": "order"}) for _ in range(500))
    finally:
        sa.event.remove(box.store.engine, "before_cursor_execute", seen)
    assert len(box.tracked(limit=5000)) == 1500
    # one bulk insert per kind (DuckDB: INSERT … SELECT from Arrow; PostgreSQL: COPY,
    # which the cursor hook does not see), never a statement per row
    assert len(statements) <= 2


def test_events_are_stamped_by_the_database_clock_not_the_process_s(
    tracked_box: MessageBox,
) -> None:
    # Given a process whose clock is a day fast (machines of one store disagree)
    from messagebox import clock

    # When it publishes, the events carry the database's time
    with clock.use_local(lambda: datetime.now(UTC) + timedelta(days=1)):
        [routed] = tracked_box.publish([Message(b"x", promoted={"t.Kind": "order"})])
    stamps = {e.at for e in tracked_box.tracked(routed.message_id)}
    assert len(stamps) == 1
    assert abs(stamps.pop() - datetime.now(UTC)) < timedelta(minutes=5)


def test_a_fired_timeout_dropped_by_its_completed_instance_ends_its_history(
    tracked_box: MessageBox,
) -> None:
    from messagebox.delivery import service_instances

    box = tracked_box
    sub = box.subscription("orders")
    terminated = REGISTRY.get_sample_value("messagebox_terminated_total", {"host": "h"}) or 0
    # Given a timeout fired for an instance, still on its queue
    past = datetime.now(UTC) - timedelta(seconds=1)
    with box.store.transaction() as conn:
        conn.execute(
            mb_schema.timer.insert().values(
                id=1, instance_id="i-1", service="orders", host="h", sub=sub.id,
                name="payment", due_at=past, created_at=past,
            )
        )  # fmt: skip
        service_instances.fire_timers(conn, box.store.dialect, "h", datetime.now(UTC))
    [entry] = box.queue_depth()
    assert entry.depth == 1
    # When the instance completes before consuming it
    with box.store.transaction() as conn:
        assert (
            service_instances.complete(
                conn, box.store.dialect, {"i-1": "orders"}, datetime.now(UTC)
            )
            == 0
        )
    # Then the timeout's history ends terminated, saying why, and nothing is left of it
    [event] = box.tracked(event="terminated")
    assert event.detail == "timeout dropped: its instance completed"
    history = [e.event for e in box.tracked(event.message_id)]
    assert history == ["published", "routed", "terminated"]
    assert box.queue_depth() == []
    assert box.suspended() == []
    assert box.references(event.message_id) == 0
    # and it is not counted as an operator's termination
    after = REGISTRY.get_sample_value("messagebox_terminated_total", {"host": "h"}) or 0
    assert after == terminated
