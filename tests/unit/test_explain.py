"""``predicates.explain``: why a filter matches a message or not, by the reference
semantics. (Its agreement with the SQL router through ``MessageBox.explain`` is
tests/integration/test_explain.py.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings

from messagebox.predicates import (
    Filter,
    P,
    Predicate,
    explain,
    filter_matches,
    normalize_properties,
    predicate_holds,
)
from messagebox.predicates.explain import check
from tests.strategies import filters, messages

X = P("t.X")
NOON = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


@settings(max_examples=400, database=None)
@given(filt=filters, props=messages)
def test_the_explanation_agrees_with_the_reference_evaluator(
    filt: Filter, props: dict[str, object]
) -> None:
    # Given any filter and any message
    normal = normalize_properties(props)
    # When it is explained
    found = explain(filt, normal)
    # Then it matches exactly when the reference evaluator says so
    assert found.matched is filter_matches(filt, normal)
    assert len(found.groups) == len(filt.groups)
    for group, why in zip(filt.groups, found.groups, strict=True):
        holds = [predicate_holds(p, normal) for p in group.predicates]
        assert why.matched is all(holds)
        if why.matched:
            assert why.failed is None
            continue
        # and a failing group names its first failing predicate, with the actual value
        assert why.failed is not None
        first = holds.index(False)
        assert why.failed.predicate == group.predicates[first]
        assert why.failed.holds is False
        assert why.failed.present is (why.failed.predicate.property in normal)
        assert why.failed.actual == normal.get(why.failed.predicate.property)
        assert why.failed.why


@pytest.mark.parametrize(
    ("pred", "value", "why"),
    [
        (X == "EU", "US", '"US" != "EU"'),
        (X != 5, 5, "5 == 5"),
        (X > 10, 10, "10 <= 10"),
        (X >= 10, 9.5, "9.5 < 10"),
        (X < 10, 10, "10 >= 10"),
        (X <= 10, 11, "11 > 10"),
        (X == 1, "1", '"1" is a str, the predicate compares a number'),
        (X > NOON, 5, "5 is a number, the predicate compares a datetime"),
        (X.in_(["EU", "UK"]), "US", '"US" is not one of ["EU", "UK"]'),
        (X.prefix("PO-"), "XPO-1", '"XPO-1" does not start with "PO-"'),
        (X.prefix("PO-"), 7, "7 is a number (prefix needs a str)"),
        (X.bitwise_and(6), 8, "8 & 6 == 0"),
        (X.bitwise_and(6), 6.0, "6.0 is a number, not an int"),
        (X.bitwise_and(6), True, "true is a bool (bitwise_and needs an int)"),
        (X.not_exists(), NOON, 'is present (datetime("2024-06-01T12:00:00+00:00"))'),
    ],
    ids=repr,
)
def test_a_failing_predicate_says_why_with_the_actual_value(
    pred: Predicate, value: object, why: str
) -> None:
    # Given a predicate that fails on a message's value
    result = check(pred, normalize_properties({"t.X": value}))
    # Then the reason names the value and what holds instead
    assert result.holds is False
    assert result.present is True
    assert result.why.startswith(why)


@pytest.mark.parametrize(
    "build",
    [lambda p: p == 1, lambda p: p.exists(), lambda p: p.in_([1]), lambda p: p.prefix("a")],
)
def test_an_absent_property_is_reported_absent(build: Callable[[P], Predicate]) -> None:
    result = check(build(X), normalize_properties({"t.Y": 1}))
    assert (result.holds, result.present, result.actual, result.why) == (
        False,
        False,
        None,
        "is absent",
    )


def test_each_group_reports_its_own_first_failure() -> None:
    # Given a filter of two groups, each failing on a different predicate
    filt = Filter.of(
        (P("orders.Region") == "EU") & (P("orders.Total") >= 100)
        | (P("orders.Rush") == True)  # noqa: E712  (a DSL predicate, not a comparison)
        & P("orders.Total").exists()
    )
    # When a US order of 50 without the rush flag is explained
    found = explain(filt, normalize_properties({"orders.Region": "US", "orders.Total": 50}))
    # Then the first group fails on its region, the second on the absent flag
    assert found.matched is False
    first, second = found.groups
    assert first.failed is not None
    assert first.failed.predicate == (P("orders.Region") == "EU")
    assert first.failed.actual == "US"
    assert second.failed is not None
    assert second.failed.why == "is absent"


def test_a_matching_group_has_no_failure() -> None:
    found = explain(Filter.of(X >= 1), normalize_properties({"t.X": 3}))
    assert found.matched is True
    assert found.groups[0].failed is None
