"""Bad input is refused with an error that names the culprit, and stores nothing."""

from __future__ import annotations

from datetime import datetime

import pytest

from messagebox import (
    AlreadyExists,
    FilterValidationError,
    Message,
    MessageBox,
    MessageValidationError,
    UnknownSubscription,
    ValidationError,
)
from messagebox.errors import AlreadyReceived
from messagebox.predicates import P
from messagebox.routing import receipts as mb_receipts
from tests.conftest import table_counts

SQLISH = "a.b'; DROP TABLE mb_spool; --"


@pytest.fixture
def ready(box: MessageBox) -> MessageBox:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("a.X").exists())
    return box


def test_one_bad_message_in_a_batch_stores_none_of_it(ready: MessageBox):
    before = table_counts(ready)
    good = Message(b"ok", promoted={"a.X": 1})
    bad = Message(b"no", promoted={"BTS.MessageType": "PO"})  # reserved, untrusted
    with pytest.raises(
        MessageValidationError, match=r"message 1: property 'messagebox.MessageType'"
    ):
        ready.publish([good, bad])
    assert table_counts(ready) == before


def test_something_that_is_not_a_message_is_refused_by_position(ready: MessageBox):
    before = table_counts(ready)
    with pytest.raises(MessageValidationError, match="message 1: expected a Message, got dict"):
        ready.publish([Message(b"ok", promoted={"a.X": 1}), {"a.X": 1}])  # type: ignore[list-item]
    assert table_counts(ready) == before


def test_a_message_id_already_stored_rolls_the_batch_back(ready: MessageBox):
    [first] = ready.publish([Message(b"ok", promoted={"a.X": 1})])
    before = table_counts(ready)
    with pytest.raises(AlreadyExists, match=r"(?i)duplicate"):
        ready.publish(
            [
                Message(b"new", promoted={"a.X": 2}),
                Message(b"dup", promoted={"a.X": 3}, id=first.message_id),
            ]
        )
    assert table_counts(ready) == before
    # and the connection it failed on serves the next publish (on PostgreSQL the error
    # came back with the COMMIT of a pipeline)
    [second] = ready.publish([Message(b"next", promoted={"a.X": 4})])
    assert second.subscriptions


@pytest.mark.parametrize(
    ("promoted", "culprit"),
    [
        ({"a.X": object()}, "unsupported value type object"),
        ({"a.X": "x" * 257}, "257 characters"),
        ({"a.X": 2**64}, "does not fit in 64 bits"),
        ({"a.X": float("nan")}, "not finite"),
        ({"a.X": datetime(2024, 1, 1)}, "timezone-aware"),
        ({SQLISH: 1}, "is not of the form"),
        ({"noNamespace": 1}, "is not of the form"),
        ({"a.X": "bad\x00nul"}, "NUL"),
    ],
)
def test_a_wrong_property_is_refused_naming_it(promoted: dict[str, object], culprit: str):
    with pytest.raises(MessageValidationError, match=culprit) as info:
        Message(b"x", promoted=promoted)
    assert repr(next(iter(promoted)))[:20] in str(info.value)


def test_a_sql_looking_value_is_just_a_value(ready: MessageBox):
    sub = ready.subscribe("sql", host="h", filter=P("a.Name") == "x'; DROP TABLE mb_spool; --")
    [routed] = ready.publish([Message(b"x", promoted={"a.Name": "x'; DROP TABLE mb_spool; --"})])
    assert sub.id in routed.subscriptions
    assert table_counts(ready)["mb_spool"] == 1


@pytest.mark.parametrize(
    ("make_filter", "culprit"),
    [
        (lambda: P("a.X") > True, "cannot order a bool"),
        (lambda: P("a.X").bitwise_and("3"), "int mask"),  # type: ignore[arg-type]
        (lambda: P("a.X").prefix(3), "prefix takes a str"),  # type: ignore[arg-type]
        (lambda: P(SQLISH) == 1, "is not of the form"),
        (lambda: P("a.X").in_([]), "at least one value"),
    ],
)
def test_a_malformed_filter_is_refused_naming_the_predicate(
    ready: MessageBox, make_filter, culprit: str
):
    with pytest.raises(FilterValidationError, match=culprit):
        ready.subscribe("bad", host="h", filter=make_filter())


def test_an_absurd_dnf_expansion_is_refused_and_stores_nothing(ready: MessageBox):
    before = table_counts(ready)
    expr = (P("a.A0") == 0) | (P("a.B0") == 0)
    for i in range(1, 12):
        expr = expr & ((P(f"a.A{i}") == i) | (P(f"a.B{i}") == i))
    with pytest.raises(FilterValidationError, match="disjunctive normal form"):
        ready.subscribe("huge", host="h", filter=expr)
    assert table_counts(ready) == before


def test_an_empty_or_foreign_filter_is_refused(ready: MessageBox):
    with pytest.raises(FilterValidationError):
        ready.subscribe("bad", host="h", filter=None)
    with pytest.raises(FilterValidationError):
        ready.subscribe("bad", host="h", filter="a.X == 1")


def test_one_bad_subscription_in_a_bulk_subscribe_creates_none(ready: MessageBox):
    before = table_counts(ready)
    with pytest.raises(AlreadyExists):
        ready.subscribe_many(
            [
                {"service": "x", "host": "h", "filter": P("a.Y") == 1, "name": "dup"},
                {"service": "y", "host": "h", "filter": P("a.Z") == 1, "name": "dup"},
            ]
        )
    assert table_counts(ready) == before


@pytest.mark.parametrize(
    "spec",
    [
        {"service": "", "host": "h", "filter": P("a.Y") == 1},
        {"service": "s", "host": "h", "filter": P("a.Y") == 1, "kind": "instance"},
        {"service": "s", "host": "h", "filter": P("a.Y") == 1, "instance_id": "i"},
        {"service": "s", "host": "h", "filter": P("a.Y") == 1, "priority": "high"},
        {"service": "s", "host": "h", "filter": P("a.Y") == 1, "state": "sleeping"},
        {"service": "s", "host": "h", "filter": P("a.Y") == 1, "colour": "red"},
    ],
)
def test_bad_subscription_fields_are_refused(ready: MessageBox, spec: dict[str, object]):
    before = table_counts(ready)
    with pytest.raises(ValidationError):
        ready.subscribe_many([spec])
    assert table_counts(ready) == before


def test_unknown_subscriptions_are_named(ready: MessageBox):
    with pytest.raises(UnknownSubscription, match="'nope'"):
        ready.unsubscribe("nope")
    with pytest.raises(UnknownSubscription, match="ghost"):
        ready.set_service_state("ghost", "started")


def test_bad_host_settings_are_refused(box: MessageBox):
    with pytest.raises(ValidationError, match="claim_batch"):
        box.create_host("h2", claim_batch=0)
    assert box.hosts() == []


def test_a_receipt_recorded_between_check_and_insert_is_already_received(
    ready: MessageBox, monkeypatch: pytest.MonkeyPatch
):
    # Given an input published once, with its receipt
    [first] = ready.publish([Message(b"1", promoted={"a.B": 1})], receipts=[("loc", "k", [0])])
    before = table_counts(ready)
    # When a second publish of it passes the check (as when a concurrent publish records
    # the receipt after the check) and only the insert meets the stored key
    checks = iter([None])
    real = mb_receipts.refuse_received

    def late(conn: object, keys: object, cause: Exception | None = None) -> None:
        if next(checks, "again") is None:
            return  # the first check saw nothing yet
        real(conn, keys, cause)  # type: ignore[arg-type]

    monkeypatch.setattr(mb_receipts, "refuse_received", late)
    # Then it is refused as already received, naming the first publish's message
    with pytest.raises(AlreadyReceived, match="loc: input 'k' was published already") as info:
        ready.publish([Message(b"1", promoted={"a.B": 1})], receipts=[("loc", "k", [0])])
    assert info.value.message_ids == [str(first.message_id)]
    assert table_counts(ready) == before
