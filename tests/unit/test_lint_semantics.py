"""The satisfiability and implication checker (messagebox.predicates.lint) agrees with
brute force over small value domains, on random groups of every operator."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox.predicates import Group, P, Predicate, predicate_holds, to_filter
from messagebox.predicates.lint import (
    Literal,
    equivalent,
    group_satisfiable,
    implies,
    satisfiable,
)

_D0 = datetime(2024, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

# the constants filters draw from, and a domain rich enough to hold a witness for any
# satisfiable mix of them: a value in every stretch between two constants (quarters for
# numbers, "\x01" and "c" around the strings' letters, every microsecond around the
# datetimes), ints past each constant far enough for any three-bit mask pattern
INTS = [-3, -1, 0, 1, 2, 3]
FLOATS = [-0.5, 0.5, 1.5, 2.0]
STRS = ["", "a", "b", "ab", "ba", "aa"]
DATES = [_D0, _D0 + 2 * _US]
MASKS = [1, 2, 3, 4, 6, -1, -2]

DOMAIN: list[Any] = [
    *(q / 4 for q in range(-64, 65)),
    *range(-20, 21),
    *("".join(t) for n in range(4) for t in itertools.product("\x01abc", repeat=n)),
    True,
    False,
    *(_D0 + k * _US for k in range(-2, 5)),
]

NAMES = ["t.x", "t.y"]
constants = st.sampled_from([*INTS, *FLOATS, *STRS, *DATES, True, False])
orderable = st.sampled_from([*INTS, *FLOATS, *STRS, *DATES])


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    p = P(draw(st.sampled_from(NAMES)))
    op = draw(
        st.sampled_from(["eq", "ne", "gt", "ge", "lt", "le", "ex", "nex", "mask", "pre", "in"])
    )
    if op == "eq":
        return p == draw(constants)
    if op == "ne":
        return p != draw(constants)
    if op in ("gt", "ge", "lt", "le"):
        value = draw(orderable)
        return {"gt": p > value, "ge": p >= value, "lt": p < value, "le": p <= value}[op]
    if op == "ex":
        return p.exists()
    if op == "nex":
        return p.not_exists()
    if op == "mask":
        return p.bitwise_and(draw(st.sampled_from(MASKS)))
    if op == "pre":
        return p.prefix(draw(st.sampled_from(STRS)))
    return p.in_(draw(st.lists(constants, min_size=1, max_size=3)))


groups = st.lists(predicates(), min_size=1, max_size=5).map(lambda ps: Group(predicates=ps))


def _brute(literals: list[Literal]) -> bool:
    names = sorted({lit.predicate.property for lit in literals})
    options: list[Any] = [None, *DOMAIN]
    for name in names:
        mine = [lit for lit in literals if lit.predicate.property == name]
        if not any(
            all(
                predicate_holds(lit.predicate, {} if v is None else {name: v}) is lit.holds
                for lit in mine
            )
            for v in options
        ):
            return False
    return True


_SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(groups)
def test_satisfiable_agrees_with_brute_force(group: Group) -> None:
    assert group_satisfiable(group) == _brute([Literal(p) for p in group.predicates])


@_SETTINGS
@given(groups, st.lists(st.booleans(), min_size=5, max_size=5))
def test_negated_literals_agree_with_brute_force(group: Group, signs: list[bool]) -> None:
    lits = [Literal(p, s) for p, s in zip(group.predicates, signs, strict=False)]
    assert satisfiable(lits) == _brute(lits)


def _brute_implies(a: Group, b: Group) -> bool:
    return all(
        not _brute([*(Literal(p) for p in a.predicates), Literal(q, False)]) for q in b.predicates
    )


@_SETTINGS
@given(groups, groups)
def test_implies_agrees_with_brute_force(a: Group, b: Group) -> None:
    assert implies(a, b) == _brute_implies(a, b)


@pytest.mark.parametrize(
    ("group", "sat"),
    [
        ((P("t.x") > 5) & (P("t.x") < 3), False),
        ((P("t.x") == "a") & (P("t.x") == "b"), False),
        ((P("t.x") == 1) & (P("t.x") == "1"), False),  # two families
        ((P("t.x") != 1) & (P("t.x") != "1"), False),  # != keeps its family too
        (P("t.x").exists() & P("t.x").not_exists(), False),
        ((P("t.x") > 1) & (P("t.x") < 1.0000000000000002), False),  # no float between
        ((P("t.x") > 1) & (P("t.x") < 1.0000000000000004), True),
        ((P("t.x") > 2**62) & (P("t.x") < 2**62 + 2), True),  # the int 2**62 + 1
        (P("t.x").bitwise_and(1) & P("t.x").bitwise_and(2) & (P("t.x") < 3), True),  # -1
        (
            P("t.x").bitwise_and(1) & P("t.x").bitwise_and(2) & (P("t.x") >= 0) & (P("t.x") < 3),
            False,
        ),
        (
            P("t.x").bitwise_and(1) & P("t.x").bitwise_and(2) & (P("t.x") >= 0) & (P("t.x") <= 3),
            True,
        ),
        (P("t.x").bitwise_and(-(2**63)) & (P("t.x") >= 0), False),  # the sign bit
        (P("t.x").prefix("ab") & (P("t.x") < "ab"), False),
        (P("t.x").prefix("ab") & (P("t.x") < "ab\x01"), True),  # "ab" itself
        (P("t.x").prefix("ab") & (P("t.x") > "ab") & (P("t.x") < "ab\x01"), False),
        (P("t.x").prefix("a") & P("t.x").prefix("b"), False),
        ((P("t.x") >= _D0) & (P("t.x") < _D0 + _US) & (P("t.x") != _D0), False),
        ((P("t.x") == True) & (P("t.x") != True), False),  # noqa: E712
        (P("t.x").in_([1, "a"]) & P("t.x").prefix("a"), True),
        ((P("t.x") == 2.0) & P("t.x").bitwise_and(2), True),  # the int 2 equals 2.0
    ],
)
def test_known_cases(group: Any, sat: bool) -> None:
    [g] = to_filter(group).groups
    assert group_satisfiable(g) is sat


def test_a_float_constant_does_not_imply_a_mask() -> None:
    # -3.0 equals -3 and is no int: x == -3 does not imply x.bitwise_and(1)
    [a] = to_filter(P("t.x") == -3).groups
    [b] = to_filter(P("t.x").bitwise_and(1)).groups
    assert not implies(a, b)


def test_equivalent_filters() -> None:
    a = to_filter((P("t.x") >= 1) & (P("t.x") <= 3))
    b = to_filter(((P("t.x") >= 1) & (P("t.x") < 2)) | ((P("t.x") >= 2) & (P("t.x") <= 3)))
    assert equivalent(a, b) is True
    c = to_filter(((P("t.x") >= 1) & (P("t.x") < 2)) | ((P("t.x") > 2) & (P("t.x") <= 3)))
    assert equivalent(a, c) is False  # 2 itself
