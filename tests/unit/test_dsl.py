"""The Python filter language: ``P`` operators, ``&``/``|`` composition, DNF normalisation
and the group limits (docs/concepts.md: Filters)."""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

import messagebox.predicates.model as model
from messagebox.errors import FilterValidationError
from messagebox.predicates import (
    MAX_GROUPS,
    MAX_PREDICATES_PER_GROUP,
    And,
    Filter,
    Op,
    Or,
    P,
    Predicate,
)


def groups_of(filt: Filter) -> set[frozenset[str]]:
    """The filter's groups as sets of rendered predicates (order-free, for comparisons)."""
    return {frozenset(str(p) for p in g.predicates) for g in filt.groups}


def any_of(*preds: Predicate) -> Predicate | Or:
    return functools.reduce(operator.or_, preds)


def all_of(*parts: object) -> object:
    return functools.reduce(operator.and_, parts)


def and_of_ors(n_ors: int, width: int = 2) -> object:
    """An AND of ``n_ors`` ORs of ``width`` distinct predicates: ``width ** n_ors`` groups."""
    return all_of(*(any_of(*(P(f"t.p{i}") == j for j in range(width))) for i in range(n_ors)))


A = P("t.A") == 1
B = P("t.B") == 2
C = P("t.C") == 3
D = P("t.D") == 4
E = P("t.E") == 5


# --- one operator, one predicate ---------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "op", "value"),
    [
        (lambda p: p == 7, Op.EQ, 7),
        (lambda p: p != 7, Op.NE, 7),
        (lambda p: p > 7, Op.GT, 7),
        (lambda p: p >= 7, Op.GE, 7),
        (lambda p: p < 7, Op.LT, 7),
        (lambda p: p <= 7, Op.LE, 7),
        (lambda p: p.exists(), Op.EXISTS, None),
        (lambda p: p.not_exists(), Op.NOT_EXISTS, None),
        (lambda p: p.bitwise_and(0b1010), Op.BITWISE_AND, 0b1010),
        (lambda p: p.prefix("PO-"), Op.PREFIX, "PO-"),
        (lambda p: p.in_([1, "one", True]), Op.IN, (1, "one", True)),
    ],
    ids=["eq", "ne", "gt", "ge", "lt", "le", "exists", "not_exists", "bitwise_and", "prefix", "in"],
)
def test_each_operator_builds_its_predicate(
    build: Callable[[P], Predicate], op: Op, value: object
) -> None:
    # Given a property reference
    ref = P("orders.Total")
    # When an operator is applied to it
    pred = build(ref)
    # Then it is one predicate on that property with that operator and value
    assert isinstance(pred, Predicate)
    assert (pred.property, pred.op, pred.value) == ("orders.Total", op, value)


@pytest.mark.parametrize(
    ("compare", "op"),
    [
        (operator.eq, Op.EQ),
        (operator.ne, Op.NE),
        (operator.lt, Op.GT),
        (operator.le, Op.GE),
        (operator.gt, Op.LT),
        (operator.ge, Op.LE),
    ],
    ids=["7==p", "7!=p", "7<p", "7<=p", "7>p", "7>=p"],
)
def test_a_reflected_comparison_keeps_its_meaning(
    compare: Callable[[object, object], Predicate], op: Op
) -> None:
    # When the value is written on the left: compare(7, p) is `7 <op> p`
    pred = compare(7, P("orders.Total"))
    # Then the predicate still reads "property <op> value"
    assert (pred.op, pred.value) == (op, 7)


@pytest.mark.parametrize("values", [[1, 2, 3], (1, 2, 3), range(1, 4), (v for v in (1, 2, 3))])
def test_in_accepts_any_iterable_and_keeps_its_order(values: object) -> None:
    pred = P("orders.Total").in_(values)  # type: ignore[arg-type]
    assert pred.value == (1, 2, 3)


def test_in_drops_duplicate_values_but_keeps_other_families_apart() -> None:
    # Given values where 1 and 1.0 are the same number but True and "1" are not numbers
    pred = P("orders.Total").in_([1, 1.0, True, "1", 1])
    # Then one number, one bool and one string remain, in first-seen order
    assert pred.value == (1, True, "1")
    assert [type(v) for v in pred.value] == [int, bool, str]


def test_the_property_name_is_canonicalised_in_the_predicate() -> None:
    pred = P("BTS.MessageType") == "PO"
    assert pred.property == "messagebox.MessageType"


# --- P in a boolean context ------------------------------------------------------------


@pytest.mark.parametrize(
    "use",
    [
        bool,
        operator.not_,
        lambda p: p and True,
        lambda p: p or True,
        lambda p: 1 if p else 0,
    ],
    ids=["bool", "not", "and", "or", "if"],
)
def test_a_bare_property_reference_has_no_truth_value(use: Callable[[P], object]) -> None:
    with pytest.raises(TypeError, match=re.escape("P('orders.Total') has no truth value")):
        use(P("orders.Total"))


def test_a_property_reference_is_not_hashable() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        hash(P("orders.Total"))


@pytest.mark.parametrize(
    "build",
    [
        lambda: 1 < P("orders.Total") < 5,
        lambda: (P("orders.Total") > 1) and (P("orders.Total") < 5),
    ],
    ids=["chained-comparison", "python-and"],
)
def test_a_predicate_in_a_boolean_context_is_refused_not_silently_dropped(
    build: Callable[[], object],
) -> None:
    with pytest.raises(TypeError):
        build()


# --- composition and precedence ----------------------------------------------------------


def test_and_builds_one_group_with_both_predicates() -> None:
    assert groups_of(Filter.of(A & B)) == {frozenset({str(A), str(B)})}


def test_or_builds_one_group_per_predicate() -> None:
    assert groups_of(Filter.of(A | B)) == {frozenset({str(A)}), frozenset({str(B)})}


def test_and_binds_tighter_than_or_on_the_right() -> None:
    # When a & b | c is written without parentheses
    filt = Filter.of(A & B | C)
    # Then it means (a & b) | c
    assert groups_of(filt) == {frozenset({str(A), str(B)}), frozenset({str(C)})}


def test_and_binds_tighter_than_or_on_the_left() -> None:
    # When a | b & c is written without parentheses
    filt = Filter.of(A | B & C)
    # Then it means a | (b & c)
    assert groups_of(filt) == {frozenset({str(A)}), frozenset({str(B), str(C)})}


def test_parentheses_override_precedence() -> None:
    filt = Filter.of((A | B) & C)
    assert groups_of(filt) == {frozenset({str(A), str(C)}), frozenset({str(B), str(C)})}


def test_an_unparenthesised_comparison_next_to_an_operator_is_a_type_error() -> None:
    # `P(a) == 1 & P(b) == 2` parses as `P(a) == (1 & P(b)) == 2`
    with pytest.raises(TypeError, match="unsupported operand"):
        P("t.A") == 1 & P("t.B") == 2  # type: ignore[operator]  # noqa: B015


def test_and_or_expressions_are_trees_until_normalised() -> None:
    expr = (A | B) & C
    assert isinstance(expr, And)
    assert isinstance(expr.parts[0], Or)


def test_a_predicate_ands_with_a_filter_on_its_right() -> None:
    # Given a filter already in DNF
    filt = Filter.of(A | B)
    # When a predicate is ANDed with it
    combined = Filter.of(C & filt)
    # Then the predicate is distributed over its groups
    assert groups_of(combined) == {frozenset({str(A), str(C)}), frozenset({str(B), str(C)})}


def test_a_predicate_ors_with_a_filter_on_its_right() -> None:
    combined = Filter.of(C | Filter.of(A & B))
    assert groups_of(combined) == {frozenset({str(C)}), frozenset({str(A), str(B)})}


@pytest.mark.parametrize("combine", [operator.and_, operator.or_], ids=["and", "or"])
def test_a_filter_combines_with_a_predicate_on_its_right(
    combine: Callable[[object, object], object],
) -> None:
    # Given a filter already in DNF
    filt = Filter.of(A | B)
    # When it is combined with a predicate on its right
    combined = Filter.of(combine(filt, C))
    # Then the result is the same as with the operands swapped
    assert groups_of(combined) == groups_of(Filter.of(combine(C, filt)))


def test_normalising_a_filter_returns_it_unchanged() -> None:
    filt = Filter.of(A | B)
    assert Filter.of(filt) is filt


def test_a_single_predicate_is_a_filter_of_one_group() -> None:
    assert groups_of(Filter.of(A)) == {frozenset({str(A)})}


@pytest.mark.parametrize(
    "build",
    [
        lambda: A & 5,
        lambda: A | "t.B == 2",
        lambda: A & P("t.B"),
        lambda: Filter.of(P("t.A")),
        lambda: Filter.of(None),
        lambda: Filter.of(True),
    ],
    ids=["int", "str", "bare-P", "filter-of-P", "filter-of-None", "filter-of-bool"],
)
def test_combining_with_something_that_is_not_a_predicate_is_refused(
    build: Callable[[], object],
) -> None:
    with pytest.raises(FilterValidationError, match="cannot combine"):
        build()


# --- normalisation to DNF ----------------------------------------------------------------


def test_and_of_two_ors_is_their_cross_product() -> None:
    filt = Filter.of((A | B) & (C | D))
    assert groups_of(filt) == {
        frozenset({str(A), str(C)}),
        frozenset({str(A), str(D)}),
        frozenset({str(B), str(C)}),
        frozenset({str(B), str(D)}),
    }


def test_deep_nesting_is_flattened_to_dnf() -> None:
    # When a & (b | (c & (d | e))) is normalised
    filt = Filter.of(A & (B | (C & (D | E))))
    # Then the groups are a&b, a&c&d, a&c&e
    assert groups_of(filt) == {
        frozenset({str(A), str(B)}),
        frozenset({str(A), str(C), str(D)}),
        frozenset({str(A), str(C), str(E)}),
    }


def test_nested_ors_flatten_into_one_level() -> None:
    filt = Filter.of(A | (B | (C | (D | E))))
    assert len(filt.groups) == 5
    assert all(len(g.predicates) == 1 for g in filt.groups)


@pytest.mark.parametrize(
    "build",
    [
        lambda: A & A,
        lambda: (P("BTS.X") == 1) & (P("messagebox.X") == 1),
        lambda: (P("bts.X") == 1) & (P("MessageBox.X") == 1),
        lambda: (P("t.A") == Decimal("2")) & (P("t.A") == 2),
        lambda: (
            (P("t.A") == datetime(2024, 1, 1, 12, tzinfo=UTC))
            & (P("t.A") == datetime(2024, 1, 1, 14, tzinfo=timezone(timedelta(hours=2))))
        ),
        lambda: P("t.A").in_([1, 2]) & P("t.A").in_([1, 2, 2]),
    ],
    ids=["same", "alias", "alias-case", "decimal", "datetime-zones", "in-duplicates"],
)
def test_equal_predicates_in_one_group_are_kept_once(build: Callable[[], object]) -> None:
    # When a group repeats a predicate (possibly spelled differently)
    filt = Filter.of(build())
    # Then the group holds it once
    [group] = filt.groups
    assert len(group.predicates) == 1


def test_identical_groups_are_kept_once() -> None:
    filt = Filter.of((A & B) | (A & B))
    assert len(filt.groups) == 1


def test_groups_with_the_same_predicates_in_another_order_are_kept_once() -> None:
    filt = Filter.of((A & B) | (B & A) | A | A)
    assert groups_of(filt) == {frozenset({str(A), str(B)}), frozenset({str(A)})}


def test_dedup_inside_groups_makes_cross_product_groups_collapse() -> None:
    # (a | b) & (a | b) expands to a&a, a&b, b&a, b&b
    filt = Filter.of((A | B) & (A | B))
    # Then it normalises to a, a&b, b
    assert groups_of(filt) == {
        frozenset({str(A)}),
        frozenset({str(A), str(B)}),
        frozenset({str(B)}),
    }


def test_normalisation_keeps_the_first_spelling_order_of_groups() -> None:
    filt = Filter.of(C | A | B)
    assert [str(g.predicates[0]) for g in filt.groups] == [str(C), str(A), str(B)]


# --- limits ------------------------------------------------------------------------------


def test_max_groups_is_documented_as_128() -> None:
    assert MAX_GROUPS == 128


def test_an_expansion_to_exactly_max_groups_is_accepted() -> None:
    # Given an AND of 7 ORs of 2: 2**7 == MAX_GROUPS groups
    expr = and_of_ors(7)
    # When normalised
    filt = Filter.of(expr)
    # Then every group is kept
    assert len(filt.groups) == MAX_GROUPS


def test_an_or_of_exactly_max_groups_predicates_is_accepted() -> None:
    filt = Filter.of(any_of(*(P("t.A") == i for i in range(MAX_GROUPS))))
    assert len(filt.groups) == MAX_GROUPS


def test_one_group_past_the_limit_is_refused() -> None:
    with pytest.raises(FilterValidationError, match=f"at most {MAX_GROUPS} are allowed"):
        Filter.of(any_of(*(P("t.A") == i for i in range(MAX_GROUPS + 1))))


def test_the_limit_counts_groups_after_removing_duplicates() -> None:
    # Given MAX_GROUPS distinct predicates plus repeats of the first ones
    preds = [P("t.A") == i for i in range(MAX_GROUPS)] + [P("t.A") == 0, P("t.A") == 1]
    # When normalised
    filt = Filter.of(any_of(*preds))
    # Then the repeats do not count
    assert len(filt.groups) == MAX_GROUPS


def test_an_and_of_eight_ors_of_two_is_refused() -> None:
    with pytest.raises(FilterValidationError, match="256 groups"):
        Filter.of(and_of_ors(8))


def test_an_absurd_expansion_is_refused_naming_its_first_predicate() -> None:
    # Given an AND of 12 ORs of 2 (4096 groups)
    expr = and_of_ors(12)
    # Then it is refused, and the error names where it starts
    with pytest.raises(FilterValidationError, match=re.escape("t.p0 == 0")):
        Filter.of(expr)


@pytest.mark.parametrize("n_ors", [12, 64])
def test_an_absurd_expansion_is_refused_before_expanding(
    n_ors: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an expansion to 2**n_ors groups, and a DNF expander that must not be reached
    expr = and_of_ors(n_ors)

    def never(_: object) -> list[tuple[Predicate, ...]]:
        raise AssertionError("the expression was expanded")

    monkeypatch.setattr(model, "_dnf", never)
    # Then it is refused from its size alone
    with pytest.raises(FilterValidationError, match="groups in disjunctive normal form"):
        Filter.of(expr)


def test_a_group_of_max_predicates_is_accepted() -> None:
    filt = Filter.of(all_of(*(P(f"t.p{i}") == i for i in range(MAX_PREDICATES_PER_GROUP))))
    assert len(filt.groups[0].predicates) == MAX_PREDICATES_PER_GROUP


def test_a_group_past_max_predicates_is_refused_naming_a_predicate() -> None:
    expr = all_of(*(P(f"t.p{i}") == i for i in range(MAX_PREDICATES_PER_GROUP + 1)))
    with pytest.raises(FilterValidationError, match=r"at most 64 are allowed \(first: t\.p0 == 0"):
        Filter.of(expr)


def test_a_long_chain_of_ors_is_refused_with_a_filter_error() -> None:
    # Given the natural way to OR many values: reduce(or_, ...)
    expr = any_of(*(P("t.A") == i for i in range(5000)))
    # Then it is refused as too many groups, not with a crash
    with pytest.raises(FilterValidationError, match="at most 128"):
        Filter.of(expr)


def test_a_long_chain_of_repeated_ands_normalises_to_one_predicate() -> None:
    filt = Filter.of(all_of(*([A] * 1000)))
    assert groups_of(filt) == {frozenset({str(A)})}
