"""The filter model: validation when a filter is built, and its typed JSON form
(docs/concepts.md: Messages, Filters)."""

from __future__ import annotations

import functools
import json
import operator
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from messagebox.errors import FilterValidationError, MessageBoxError, ValidationError
from messagebox.predicates import MAX_GROUPS, MAX_IN_VALUES, Filter, Group, Op, P, Predicate

total = P("orders.Total")
PLUS_0530 = timezone(timedelta(hours=5, minutes=30))


# --- operator against value type -------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "culprit"),
    [
        (lambda: total > True, "predicate orders.Total > True: > cannot order a bool"),
        (lambda: total >= False, "predicate orders.Total >= False: >= cannot order a bool"),
        (lambda: total < True, "predicate orders.Total < True: < cannot order a bool"),
        (lambda: total <= True, "predicate orders.Total <= True: <= cannot order a bool"),
        (
            lambda: total.bitwise_and("x"),  # type: ignore[arg-type]
            "predicate orders.Total.bitwise_and('x'): bitwise_and takes an int mask, not str",
        ),
        (
            lambda: total.bitwise_and(3.0),  # type: ignore[arg-type]
            "predicate orders.Total.bitwise_and(3.0): bitwise_and takes an int mask, not float",
        ),
        (
            lambda: total.bitwise_and(True),
            "predicate orders.Total.bitwise_and(True): bitwise_and takes an int mask, not bool",
        ),
        (
            lambda: total.bitwise_and(0),
            "predicate orders.Total.bitwise_and(0): bitwise_and with mask 0 can never match",
        ),
        (
            lambda: total.prefix(1),  # type: ignore[arg-type]
            "predicate orders.Total.prefix(1): prefix takes a str, not int",
        ),
        (
            lambda: total.prefix(1.5),  # type: ignore[arg-type]
            "predicate orders.Total.prefix(1.5): prefix takes a str, not float",
        ),
        (
            lambda: total.prefix(True),  # type: ignore[arg-type]
            "predicate orders.Total.prefix(True): prefix takes a str, not bool",
        ),
    ],
    ids=[
        "gt-bool",
        "ge-bool",
        "lt-bool",
        "le-bool",
        "bitwise-str",
        "bitwise-float",
        "bitwise-bool",
        "bitwise-zero",
        "prefix-int",
        "prefix-float",
        "prefix-bool",
    ],
)
def test_an_operator_that_does_not_fit_its_value_is_refused_naming_the_predicate(
    build: Callable[[], Predicate], culprit: str
) -> None:
    with pytest.raises(FilterValidationError, match=re.escape(culprit)):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: total > 1,
        lambda: total > 1.5,
        lambda: total > "m",
        lambda: total > datetime(2024, 1, 1, tzinfo=UTC),
        lambda: total == True,  # noqa: E712
        lambda: total != False,  # noqa: E712
        lambda: total.bitwise_and(-1),
        lambda: total.bitwise_and(2**62),
        lambda: total.prefix(""),
    ],
    ids=[
        "gt-int",
        "gt-float",
        "gt-str",
        "gt-datetime",
        "eq-bool",
        "ne-bool",
        "mask-1",
        "mask-big",
        "prefix-empty",
    ],
)
def test_an_operator_that_fits_its_value_is_accepted(build: Callable[[], Predicate]) -> None:
    assert isinstance(build(), Predicate)


@pytest.mark.parametrize("op", [Op.EXISTS, Op.NOT_EXISTS])
def test_exists_and_not_exists_take_no_value(op: Op) -> None:
    with pytest.raises(FilterValidationError, match=f"{op.value} takes no value"):
        Predicate(property="orders.Total", op=op, value=1)


@pytest.mark.parametrize("op", [Op.EQ, Op.NE, Op.GT, Op.BITWISE_AND, Op.PREFIX, Op.IN])
def test_an_operator_with_a_value_needs_one(op: Op) -> None:
    with pytest.raises(FilterValidationError, match=r"predicate orders\.Total"):
        Predicate(property="orders.Total", op=op)


# --- empty filters and in_ -------------------------------------------------------------


def test_an_empty_filter_is_refused() -> None:
    with pytest.raises(FilterValidationError, match="empty filter"):
        Filter(groups=())


def test_an_empty_group_is_refused() -> None:
    with pytest.raises(FilterValidationError, match="at least one predicate"):
        Group(predicates=())


@pytest.mark.parametrize("values", [[], (), set(), iter([])], ids=["list", "tuple", "set", "iter"])
def test_in_with_no_values_is_refused_naming_the_predicate(values: object) -> None:
    with pytest.raises(FilterValidationError, match=r"orders\.Total.*in_ needs at least one value"):
        total.in_(values)  # type: ignore[arg-type]


@pytest.mark.parametrize("values", ["abc", b"abc"], ids=["str", "bytes"])
def test_in_with_a_string_instead_of_a_list_is_refused_naming_the_predicate(values: object) -> None:
    with pytest.raises(
        FilterValidationError, match=r"predicate orders\.Total\.in_\(.*in_ takes a list of values"
    ):
        total.in_(values)  # type: ignore[arg-type]


def test_in_with_a_string_built_directly_is_refused() -> None:
    with pytest.raises(FilterValidationError, match="in_ takes a list of values"):
        Predicate(property="orders.Total", op=Op.IN, value="abc")


def test_in_with_a_single_number_is_refused_naming_the_predicate() -> None:
    with pytest.raises(FilterValidationError, match=r"orders\.Total"):
        total.in_(5)  # type: ignore[arg-type]


def test_in_with_max_values_is_accepted() -> None:
    pred = total.in_(range(MAX_IN_VALUES))
    assert len(pred.value) == MAX_IN_VALUES


def test_in_with_more_than_max_values_is_refused() -> None:
    with pytest.raises(FilterValidationError, match=f"in_ takes at most {MAX_IN_VALUES} values"):
        total.in_(range(MAX_IN_VALUES + 1))


def test_in_counts_values_after_removing_duplicates() -> None:
    pred = total.in_([*range(MAX_IN_VALUES), 0, 1.0, 2])
    assert len(pred.value) == MAX_IN_VALUES


@pytest.mark.parametrize(
    ("member", "culprit"),
    [
        (float("nan"), "not finite"),
        (None, "unsupported value type NoneType"),
        (datetime(2024, 1, 1), "timezone-aware"),
        ("x" * 257, "257 characters"),
    ],
    ids=["nan", "none", "naive", "long"],
)
def test_a_bad_member_of_in_is_refused_naming_the_predicate(member: object, culprit: str) -> None:
    with pytest.raises(FilterValidationError, match=rf"predicate orders\.Total\.in.*{culprit}"):
        total.in_([1, member])


# --- property names --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "orders.Total Amount",
        "orders .Total",
        "orders.'Total'",
        '"orders".Total',
        "a.b'; DROP TABLE x;--",
        "orders",
        "",
        ".Total",
        "orders.",
        "orders..Total",
        "orders.Total\n",
        "orders.Tötal",
        "orders.To$tal",
        "x." + "y" * 255,
    ],
    ids=[
        "space-in-name",
        "space-after-ns",
        "single-quotes",
        "double-quotes",
        "sql",
        "no-dot",
        "empty",
        "no-namespace",
        "no-name",
        "double-dot",
        "newline",
        "non-ascii",
        "dollar",
        "257-chars",
    ],
)
def test_a_bad_property_name_is_refused_naming_the_predicate(name: str) -> None:
    with pytest.raises(FilterValidationError, match=r"(?s)^predicate .*property name") as info:
        P(name) == 1  # noqa: B015
    assert name[:40] in str(info.value)


@pytest.mark.parametrize(
    "name",
    ["a.b", "orders.Total", "my-ns.Sub_Name.Leaf", "0.1", "x." + "y" * 254],
    ids=["short", "plain", "dashes-dots", "digits", "256-chars"],
)
def test_a_good_property_name_is_accepted(name: str) -> None:
    assert (P(name) == 1).property == name


@pytest.mark.parametrize("name", [5, None, 1.5], ids=["int", "none", "float"])
def test_a_property_name_that_is_not_a_string_is_refused_as_a_filter_error(name: object) -> None:
    with pytest.raises(FilterValidationError):
        P(name) == 1  # type: ignore[arg-type]  # noqa: B015


# --- values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "culprit"),
    [
        (float("inf"), "float inf is not finite"),
        (float("-inf"), "float -inf is not finite"),
        (float("nan"), "float nan is not finite"),
        (datetime(2024, 1, 1, 12, 0), "datetime must be timezone-aware"),
        (2**63, "does not fit in 64 bits"),
        (-(2**63) - 1, "does not fit in 64 bits"),
        ("x" * 257, "257 characters long"),
        ("PO\x00", "NUL characters"),
        ("PO\ud800", "lone surrogate"),
        ("\udfff", "lone surrogate"),
        (None, "eq needs a value"),
        (b"PO", "unsupported value type bytes"),
        ([1], "unsupported value type list"),
        (date(2024, 1, 1), "unsupported value type date"),
        (object(), "unsupported value type object"),
    ],
    ids=[
        "inf",
        "-inf",
        "nan",
        "naive-datetime",
        "int-too-big",
        "int-too-small",
        "long-string",
        "nul",
        "lone-high-surrogate",
        "lone-low-surrogate",
        "none",
        "bytes",
        "list",
        "date",
        "object",
    ],
)
def test_a_bad_value_is_refused_naming_the_predicate(value: object, culprit: str) -> None:
    with pytest.raises(FilterValidationError, match=r"^predicate orders\.Total == ") as info:
        total == value  # noqa: B015
    assert culprit in str(info.value)


@pytest.mark.parametrize(
    "value",
    [2**63 - 1, -(2**63), "x" * 256, "é😀", 1.7976931348623157e308, 5e-324],
    ids=["int64-max", "int64-min", "256-chars", "non-ascii", "max-float", "min-subnormal"],
)
def test_a_value_at_the_edge_is_accepted(value: object) -> None:
    assert (total == value).value == value


def test_a_filter_error_is_a_messagebox_validation_error() -> None:
    with pytest.raises(FilterValidationError) as info:
        total > True  # noqa: B015
    assert isinstance(info.value, ValidationError)
    assert isinstance(info.value, MessageBoxError)


def test_too_many_groups_is_refused_naming_a_predicate() -> None:
    expr = functools.reduce(operator.or_, [total == i for i in range(MAX_GROUPS + 1)])
    with pytest.raises(FilterValidationError, match=r"orders\.Total == 0"):
        Filter.of(expr)


# --- the model itself ------------------------------------------------------------------


def test_a_filter_lists_the_canonical_properties_it_tests() -> None:
    filt = Filter.of((P("BTS.MessageType") == "PO") & (total > 5) | P("orders.Rush").exists())
    assert filt.properties == {"messagebox.MessageType", "orders.Total", "orders.Rush"}


def test_a_predicate_is_immutable() -> None:
    pred = total == 1
    with pytest.raises(Exception, match="frozen"):
        pred.value = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("pred", "text"),
    [
        (total == "PO", "orders.Total == 'PO'"),
        (total >= 1.5, "orders.Total >= 1.5"),
        (total.exists(), "orders.Total.exists()"),
        (total.not_exists(), "orders.Total.not_exists()"),
        (total.bitwise_and(4), "orders.Total.bitwise_and(4)"),
        (total.prefix("P"), "orders.Total.prefix('P')"),
        (total.in_([1, "a"]), "orders.Total.in((1, 'a'))"),
    ],
    ids=["eq", "ge", "exists", "not_exists", "bitwise_and", "prefix", "in"],
)
def test_a_predicate_renders_readably(pred: Predicate, text: str) -> None:
    assert str(pred) == text


def test_a_datetime_value_is_stored_in_utc() -> None:
    pred = total == datetime(2024, 1, 1, 17, 30, tzinfo=PLUS_0530)
    assert pred.value == datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
    assert pred.value.utcoffset() == timedelta(0)


# --- JSON round trip -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        1,
        1.0,
        "1",
        True,
        False,
        0,
        0.0,
        -0.0,
        2**63 - 1,
        -(2**63),
        2**53 + 1,
        float(2**53),
        0.1,
        5e-324,
        1.7976931348623157e308,
        "",
        "é😀\u2028\"'\\",
        "a.b'; DROP TABLE x;--",
        datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1900, 1, 1, tzinfo=PLUS_0530),
    ],
    ids=repr,
)
def test_a_value_keeps_its_exact_type_and_value_through_json(value: object) -> None:
    # Given a filter on the value
    filt = Filter.of(total == value)
    # When it goes through JSON
    back = Filter.from_json(filt.to_json())
    # Then the value is the same, of the same type
    [[pred]] = [g.predicates for g in back.groups]
    assert pred.value == value
    assert type(pred.value) is type(value)
    assert back == filt


def test_one_one_point_oh_string_one_and_true_stay_four_predicates_through_json() -> None:
    # Given four predicates that must not be confused
    filt = Filter.of((total == 1) | (total == 1.0) | (total == "1") | (total == True))  # noqa: E712
    # When the filter goes through JSON
    back = Filter.from_json(filt.to_json())
    # Then there are still four, with their four types
    assert [type(g.predicates[0].value) for g in back.groups] == [int, float, str, bool]


def test_in_values_keep_their_types_through_json() -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    filt = Filter.of(total.in_([1, 2.5, "1", True, when]))
    back = Filter.from_json(filt.to_json())
    [[pred]] = [g.predicates for g in back.groups]
    assert [type(v) for v in pred.value] == [int, float, str, bool, datetime]
    assert pred.value == (1, 2.5, "1", True, when)


def test_a_whole_filter_survives_a_json_round_trip() -> None:
    # Given a filter using every operator
    filt = Filter.of(
        (P("BTS.MessageType") == "PO") & (total > 1000) & (total <= 5000.5)
        | (P("orders.Rush") != False) & P("orders.Flags").bitwise_and(0b100)  # noqa: E712
        | P("orders.Id").prefix("EU-") & P("orders.Region").in_(["N", "S", 3])
        | P("orders.Due").exists() & (P("orders.Due") >= datetime(2024, 1, 1, tzinfo=UTC))
        | P("orders.Cancelled").not_exists() & (total < 0) & (total >= -1.5) & (total != 7)
    )
    # When it goes through JSON
    text = filt.to_json()
    back = Filter.from_json(text)
    # Then it is equal, and serialises to the same text again
    assert back == filt
    assert back.to_json() == text


def test_from_json_accepts_bytes() -> None:
    filt = Filter.of(total == 1)
    assert Filter.from_json(filt.to_json().encode()) == filt


def test_json_values_are_tagged_with_their_type() -> None:
    filt = Filter.of((total == 1) | (total == 1.0) | (total == "1") | (total == True))  # noqa: E712
    data = json.loads(filt.to_json())
    assert [g["predicates"][0]["value"] for g in data["groups"]] == [
        ["i", 1],
        ["f", 1.0],
        ["s", "1"],
        ["b", True],
    ]


def _one(op: str, value: str) -> str:
    """The JSON of a one-predicate filter whose value is the JSON text ``value``."""
    predicate = {"property": "orders.Total", "op": op, "value": json.loads(value)}
    return json.dumps({"groups": [{"predicates": [predicate]}]})


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nope",
        "[]",
        "{}",
        '{"groups": null}',
        '{"groups": []}',
        '{"groups": [{"predicates": []}]}',
        '{"groups": [{"predicates": [{"op": "eq", "value": ["i", 1]}]}]}',
        '{"groups": [{"predicates": [{"property": "orders.Total", "op": "zz"}]}]}',
        '{"groups": [{"predicates": [{"property": "a b", "op": "exists"}]}]}',
        '{"groups": [{"predicates": [{"property": 5, "op": "exists"}]}]}',
        _one("eq", "5"),
        _one("eq", '"x"'),
        _one("eq", '["x", 1]'),
        _one("eq", '["i"]'),
        _one("eq", '["i", 1, 2]'),
        _one("eq", '["d", "yesterday"]'),
        _one("eq", '["d", 5]'),
        _one("eq", '["d", "2024-01-01T00:00:00"]'),
        _one("eq", '["f", "inf"]'),
        _one("eq", '["f", [1]]'),
        _one("eq", '["i", 99999999999999999999999]'),
        _one("eq", '["s", "\\u0000"]'),
        _one("eq", '[["i", 1], ["i", 2]]'),
        _one("gt", '["b", true]'),
        _one("bitwise_and", '["i", 0]'),
        _one("exists", '["i", 1]'),
        _one("in", "[]"),
        _one("in", '["s", "abc"]'),
        _one("in", '[["i", 1], "x"]'),
        _one("in", '[["i", 1], ["s"]]'),
        '{"groups": [{"predicates": [{"property": "orders.Total", "op": "eq", "value": ',
    ],
    ids=[
        "empty-text",
        "not-json",
        "array",
        "no-groups",
        "null-groups",
        "empty-groups",
        "empty-group",
        "no-property",
        "unknown-op",
        "bad-name",
        "int-name",
        "untagged-number",
        "untagged-string",
        "unknown-tag",
        "short-pair",
        "long-pair",
        "bad-datetime",
        "datetime-not-text",
        "naive-datetime",
        "infinite-float",
        "float-of-list",
        "int-too-big",
        "nul",
        "eq-with-list",
        "gt-bool",
        "mask-zero",
        "exists-with-value",
        "in-empty",
        "in-str",
        "in-untagged-member",
        "in-short-member",
        "truncated",
    ],
)
def test_malformed_json_is_refused_as_a_filter_error(text: str) -> None:
    with pytest.raises(FilterValidationError):
        Filter.from_json(text)


@pytest.mark.parametrize(
    "value",
    [
        '["i", "1"]',
        '["i", true]',
        '["i", 1.5]',
        '["s", 5]',
        '["b", 1]',
        '["f", "1e3"]',
        '["f", true]',
    ],
    ids=[
        "int-of-str",
        "int-of-bool",
        "int-of-float",
        "str-of-int",
        "bool-of-int",
        "float-of-str",
        "float-of-bool",
    ],
)
def test_a_value_whose_payload_does_not_match_its_tag_is_refused(value: str) -> None:
    # Given a value tagged as one type but holding another (["i", "1"] is not the int 1)
    # Then it is refused rather than read as the other type
    with pytest.raises(FilterValidationError, match="malformed"):
        Filter.from_json(_one("eq", value))
