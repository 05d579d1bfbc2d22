"""The reference evaluator ``Filter.matches``: the semantics every other evaluator must
agree with (docs/concepts.md: Messages, Filters)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from messagebox.predicates import (
    Filter,
    P,
    Predicate,
    filter_matches,
    normalize_properties,
    predicate_holds,
)

prop = P("t.X")
NOON_UTC = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
PLUS_2 = timezone(timedelta(hours=2))
MINUS_5 = timezone(timedelta(hours=-5))


def matches(expr: object, properties: Mapping[str, object]) -> bool:
    return Filter.of(expr).matches(properties)


# --- each operator on a present property -----------------------------------------------


@pytest.mark.parametrize(
    ("build", "value", "expected"),
    [
        (lambda p: p == 5, 5, True),
        (lambda p: p == 5, 6, False),
        (lambda p: p != 5, 6, True),
        (lambda p: p != 5, 5, False),
        (lambda p: p > 5, 6, True),
        (lambda p: p > 5, 5, False),
        (lambda p: p >= 5, 5, True),
        (lambda p: p >= 5, 4, False),
        (lambda p: p < 5, 4, True),
        (lambda p: p < 5, 5, False),
        (lambda p: p <= 5, 5, True),
        (lambda p: p <= 5, 6, False),
        (lambda p: p.exists(), 0, True),
        (lambda p: p.exists(), "", True),
        (lambda p: p.exists(), False, True),
        (lambda p: p.not_exists(), 0, False),
        (lambda p: p.bitwise_and(0b0110), 0b0100, True),
        (lambda p: p.bitwise_and(0b0110), 0b1001, False),
        (lambda p: p.bitwise_and(-1), 1, True),
        (lambda p: p.bitwise_and(1), -1, True),
        (lambda p: p.bitwise_and(-(2**63)), -1, True),
        (lambda p: p.bitwise_and(2**62), -(2**63), False),
        (lambda p: p.prefix("PO-"), "PO-123", True),
        (lambda p: p.prefix("PO-"), "PO-", True),
        (lambda p: p.prefix("PO-"), "XPO-1", False),
        (lambda p: p.prefix("PO-"), "po-1", False),
        (lambda p: p.prefix("PO-"), "PO", False),
        (lambda p: p.prefix(""), "anything", True),
        (lambda p: p.in_([1, 2, 3]), 2, True),
        (lambda p: p.in_([1, 2, 3]), 4, False),
    ],
    ids=lambda v: None if callable(v) else repr(v),
)
def test_an_operator_on_a_present_property(
    build: Callable[[P], Predicate], value: object, expected: bool
) -> None:
    # Given a predicate and a message with the property
    pred = build(prop)
    # Then it matches exactly when the operator holds
    assert matches(pred, {"t.X": value}) is expected


# --- absent properties -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda p: p == 1, False),
        (lambda p: p != 1, False),
        (lambda p: p > 1, False),
        (lambda p: p >= 1, False),
        (lambda p: p < 1, False),
        (lambda p: p <= 1, False),
        (lambda p: p.exists(), False),
        (lambda p: p.bitwise_and(1), False),
        (lambda p: p.prefix("a"), False),
        (lambda p: p.in_([1, "a"]), False),
        (lambda p: p.not_exists(), True),
    ],
    ids=["eq", "ne", "gt", "ge", "lt", "le", "exists", "bitwise_and", "prefix", "in", "not_exists"],
)
def test_an_absent_property_satisfies_only_not_exists(
    build: Callable[[P], Predicate], expected: bool
) -> None:
    # Given a message without t.X but with other properties
    properties: dict[str, object] = {"t.Y": 1, "t.x": 1}
    # Then only not_exists holds on t.X
    assert matches(build(prop), properties) is expected


def test_an_empty_message_matches_not_exists() -> None:
    assert matches(prop.not_exists(), {}) is True


# --- families never mix ----------------------------------------------------------------

CROSS_FAMILY = [
    ("1", 1),
    (1, "1"),
    ("1.0", 1.0),
    (True, 1),
    (1, True),
    (False, 0),
    (0.0, False),
    (NOON_UTC, 1717243200),
    (1717243200, NOON_UTC),
    (NOON_UTC, NOON_UTC.isoformat()),
    ("true", True),
]


@pytest.mark.parametrize(("property_value", "filter_value"), CROSS_FAMILY, ids=repr)
@pytest.mark.parametrize(
    "build",
    [lambda p, v: p == v, lambda p, v: p != v, lambda p, v: p.in_([v])],
    ids=["eq", "ne", "in"],
)
def test_an_equality_across_families_never_matches(
    build: Callable[[P, object], Predicate], property_value: object, filter_value: object
) -> None:
    # Given a filter value and a property value of different families
    pred = build(prop, filter_value)
    # Then neither == nor != nor in_ matches
    assert matches(pred, {"t.X": property_value}) is False


ORDERABLE_CROSS_FAMILY = [(p, f) for p, f in CROSS_FAMILY if not isinstance(f, bool)]


@pytest.mark.parametrize(("property_value", "filter_value"), ORDERABLE_CROSS_FAMILY, ids=repr)
@pytest.mark.parametrize(
    "build",
    [lambda p, v: p > v, lambda p, v: p >= v, lambda p, v: p < v, lambda p, v: p <= v],
    ids=["gt", "ge", "lt", "le"],
)
def test_an_ordering_across_families_never_matches(
    build: Callable[[P, object], Predicate], property_value: object, filter_value: object
) -> None:
    # Given a filter value and a property value of different families
    pred = build(prop, filter_value)
    # Then no ordering matches either way
    assert matches(pred, {"t.X": property_value}) is False


# --- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "value", "expected"),
    [
        (lambda p: p == 1.0, 1, True),
        (lambda p: p == 1, 1.0, True),
        (lambda p: p == float(2**53), 2**53 + 1, False),
        (lambda p: p != float(2**53), 2**53 + 1, True),
        (lambda p: p > float(2**53), 2**53 + 1, True),
        (lambda p: p < 2**53 + 1, float(2**53), True),
        (lambda p: p == 2**53 + 1, 2**53 + 1, True),
        (lambda p: p == 2**53, float(2**53), True),
        (lambda p: p < float(2**63), 2**63 - 1, True),
        (lambda p: p == float(2**63), 2**63 - 1, False),
        (lambda p: p >= 2**63 - 1, float(2**63), True),
        (lambda p: p > 2**63 - 2, 2**63 - 1, True),
        (lambda p: p < -(2**63) + 1, -(2**63), True),
        (lambda p: p == 0, -0.0, True),
        (lambda p: p > 0.1, 0.1000000000000001, True),
        (lambda p: p.in_([1.0]), 1, True),
        (lambda p: p.in_([float(2**53)]), 2**53 + 1, False),
    ],
    ids=lambda v: None if callable(v) else repr(v),
)
def test_ints_and_floats_compare_exactly(
    build: Callable[[P], Predicate], value: object, expected: bool
) -> None:
    assert matches(build(prop), {"t.X": value}) is expected


@pytest.mark.parametrize(
    ("build", "value", "expected"),
    [
        (lambda p: p == 2, Decimal("2"), True),
        (lambda p: p == 2.5, Decimal("2.5"), True),
        (lambda p: p == 2, Decimal("2.000"), True),
        (lambda p: p > 2, Decimal("2.01"), True),
        (lambda p: p == Decimal("2"), 2, True),
        (lambda p: p == Decimal("2.5"), 2.5, True),
        (lambda p: p.bitwise_and(2), Decimal("2"), True),
        (lambda p: p == 2**53 + 1, Decimal(2**53 + 1), True),
        (lambda p: p == "2", Decimal("2"), False),
    ],
    ids=lambda v: None if callable(v) else repr(v),
)
def test_a_decimal_promotes_as_a_number(
    build: Callable[[P], Predicate], value: object, expected: bool
) -> None:
    assert matches(build(prop), {"t.X": value}) is expected


@pytest.mark.parametrize("value", [3.0, 1.0, True, "3", Decimal("3.5")], ids=repr)
def test_bitwise_and_needs_an_int_property(value: object) -> None:
    # Given a mask that would match 3 as an int
    pred = prop.bitwise_and(1)
    # Then a non-int property never matches
    assert matches(pred, {"t.X": value}) is False


@pytest.mark.parametrize("value", [123, 1.5, True, NOON_UTC], ids=repr)
def test_prefix_only_matches_strings(value: object) -> None:
    pred = prop.prefix(str(value)[:1])
    assert matches(pred, {"t.X": value}) is False


# --- strings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        ("Z", "a"),
        ("B", "a"),
        ("z", "é"),
        ("a", "ab"),
        ("", "a"),
        ("10", "9"),
        ("\uffff", "\U00010000"),
        ("\ue000", "😀"),
    ],
    ids=repr,
)
def test_strings_compare_by_code_point(smaller: str, larger: str) -> None:
    # Given a string property
    properties = {"t.X": larger}
    # Then it is greater than the smaller one, and not smaller or equal
    assert matches(prop > smaller, properties) is True
    assert matches(prop <= smaller, properties) is False


def test_string_equality_is_case_sensitive() -> None:
    assert matches(prop == "po", {"t.X": "PO"}) is False


# --- datetimes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "value", "expected"),
    [
        (lambda p: p == NOON_UTC, datetime(2024, 6, 1, 14, 0, tzinfo=PLUS_2), True),
        (lambda p: p == NOON_UTC, datetime(2024, 6, 1, 7, 0, tzinfo=MINUS_5), True),
        (lambda p: p == NOON_UTC, datetime(2024, 6, 1, 12, 0, tzinfo=PLUS_2), False),
        (lambda p: p < NOON_UTC, datetime(2024, 6, 1, 13, 0, tzinfo=PLUS_2), True),
        (lambda p: p > NOON_UTC, datetime(2024, 6, 1, 8, 0, tzinfo=MINUS_5), True),
        (lambda p: p > datetime(2024, 6, 1, 13, tzinfo=PLUS_2), NOON_UTC, True),
        (lambda p: p.in_([datetime(2024, 6, 1, 14, 0, tzinfo=PLUS_2)]), NOON_UTC, True),
        (lambda p: p >= NOON_UTC, NOON_UTC + timedelta(microseconds=1), True),
        (lambda p: p > NOON_UTC, NOON_UTC, False),
    ],
    ids=lambda v: None if callable(v) else v.isoformat() if isinstance(v, datetime) else None,
)
def test_datetimes_compare_chronologically_across_time_zones(
    build: Callable[[P], Predicate], value: datetime, expected: bool
) -> None:
    assert matches(build(prop), {"t.X": value}) is expected


# --- bools -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "value", "expected"),
    [
        (lambda p: p == True, True, True),  # noqa: E712
        (lambda p: p == True, False, False),  # noqa: E712
        (lambda p: p != True, False, True),  # noqa: E712
        (lambda p: p.in_([False]), False, True),
        (lambda p: p.in_([False]), 0, False),
    ],
    ids=lambda v: None if callable(v) else repr(v),
)
def test_bools_compare_only_with_bools(
    build: Callable[[P], Predicate], value: object, expected: bool
) -> None:
    assert matches(build(prop), {"t.X": value}) is expected


# --- in_ with mixed types --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, True),
        (1.0, True),
        ("1", True),
        (NOON_UTC, True),
        (True, False),
        ("x", False),
        (2, False),
        (NOON_UTC.astimezone(PLUS_2), True),
    ],
    ids=repr,
)
def test_in_with_mixed_types_matches_within_each_family(value: object, expected: bool) -> None:
    # Given an in_ list with a number, a string and a datetime
    pred = prop.in_([1, "1", NOON_UTC])
    # Then a value matches only a member of its own family
    assert matches(pred, {"t.X": value}) is expected


# --- names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "filter_name", ["BTS.MessageType", "bts.MessageType", "messagebox.MessageType"]
)
@pytest.mark.parametrize(
    "message_name",
    ["BTS.MessageType", "messagebox.MessageType", "MessageBox.MessageType", "Bts.MessageType"],
)
def test_the_bts_alias_and_messagebox_name_the_same_property(
    filter_name: str, message_name: str
) -> None:
    assert matches(P(filter_name) == "PO", {message_name: "PO"}) is True


def test_the_alias_is_not_exists_when_the_canonical_name_is_present() -> None:
    assert matches(P("BTS.MessageType").not_exists(), {"messagebox.MessageType": "PO"}) is False


@pytest.mark.parametrize(
    ("filter_name", "message_name"),
    [
        ("BTS.MessageType", "BTS.messagetype"),
        ("orders.Total", "Orders.Total"),
        ("BTSX.MessageType", "BTS.MessageType"),
    ],
)
def test_other_names_are_case_sensitive_and_distinct(filter_name: str, message_name: str) -> None:
    assert matches(P(filter_name).exists(), {message_name: 1}) is False


def test_one_property_given_twice_through_an_alias_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        normalize_properties({"BTS.X": 1, "messagebox.X": 2})


# --- filters: any group, all predicates ------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ({"t.A": 1, "t.B": 2}, True),
        ({"t.C": 3}, True),
        ({"t.A": 1, "t.B": 2, "t.C": 3}, True),
        ({"t.A": 1}, False),
        ({"t.B": 2, "t.C": 4}, False),
        ({}, False),
    ],
    ids=["first-group", "second-group", "both-groups", "half-a-group", "near-miss", "empty"],
)
def test_a_filter_matches_when_any_group_has_all_its_predicates(
    properties: dict[str, object], expected: bool
) -> None:
    # Given (a == 1 & b == 2) | c == 3
    filt = Filter.of((P("t.A") == 1) & (P("t.B") == 2) | (P("t.C") == 3))
    # Then a message matches when one group holds in full
    assert filt.matches(properties) is expected


def test_a_json_round_trip_does_not_change_what_matches() -> None:
    filt = Filter.of((prop == 1) | (prop == "1") | (prop > NOON_UTC))
    back = Filter.from_json(filt.to_json())
    for value in [1, 1.0, "1", True, NOON_UTC + timedelta(seconds=1), NOON_UTC, 2]:
        assert back.matches({"t.X": value}) is filt.matches({"t.X": value}), value


@pytest.mark.parametrize(
    ("properties", "culprit"),
    [
        ({"t.X": float("nan")}, "not finite"),
        ({"t.X": datetime(2024, 1, 1)}, "timezone-aware"),
        ({"t.X": 2**63}, "64 bits"),
        ({"t.X": None}, "unsupported value type"),
        ({"bad name": 1}, "namespace.Name"),
    ],
    ids=["nan", "naive", "too-big", "none", "bad-name"],
)
def test_matching_bad_properties_raises_value_error(
    properties: dict[str, object], culprit: str
) -> None:
    with pytest.raises(ValueError, match=culprit):
        Filter.of(prop.exists()).matches(properties)


def test_the_low_level_evaluators_agree_with_filter_matches() -> None:
    # Given a filter and normalised properties
    pred = prop > 1
    filt = Filter.of(pred)
    properties = normalize_properties({"t.X": Decimal("1.5")})
    # Then the building blocks give the same answer as the filter
    assert properties == {"t.X": 1.5}
    assert predicate_holds(pred, properties) is True
    assert pred.matches(properties) is True
    assert filter_matches(filt, properties) is True


def test_a_predicate_normalises_values_as_a_filter_does() -> None:
    # Given a value that normalisation changes (a Decimal becomes a float)
    pred = P("a.T") == 120.5
    # Then Predicate.matches agrees with Filter.matches on them
    assert pred.matches({"a.T": Decimal("120.50")})
    assert Filter.of(pred).matches({"a.T": Decimal("120.50")})
    assert not pred.matches({"a.T": Decimal("120.51")})
