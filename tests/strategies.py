"""Hypothesis strategies for filters and messages: every operator, nesting, absent
properties, cross-family values ("1" vs 1 vs True), unicode and empty strings, 64-bit
edge ints, floats and datetimes in several time zones. Shared by every evaluator's test.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from messagebox.predicates import Filter, P, Predicate, to_filter

NAMES = ["t.a", "t.b", "t.c", "BTS.kind"]
ZONES = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]

EDGE_INTS = [0, 1, -1, 2, 7, 255, 2**31, 2**53, 2**53 + 1, 2**63 - 1, -(2**63), -(2**53) - 1]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, -1.5, float(2**53), 1e300, -1e-300, 2.5]
EDGE_STRS = ["", "1", "a", "A", "Z", "a ", "é", "e\u0301", "😀", "PO", "P", "ab", "abc"]
_BASE = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)
EDGE_DATES = [_BASE, _BASE + timedelta(microseconds=1), _BASE - timedelta(days=1)]

ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))
floats = st.one_of(
    st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=False, allow_infinity=False, width=64)
)
strs = st.one_of(
    st.sampled_from(EDGE_STRS),
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=4,
    ),
)
dates = st.one_of(
    st.sampled_from(EDGE_DATES),
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=st.sampled_from(ZONES),
    ),
)
bools = st.booleans()

values = st.one_of(ints, floats, strs, bools, dates)
orderable = st.one_of(ints, floats, strs, dates)


def _pred(name: str, op: str, value: Any = None) -> Predicate:
    p = P(name)
    return {
        "eq": lambda: p == value,
        "ne": lambda: p != value,
        "gt": lambda: p > value,
        "ge": lambda: p >= value,
        "lt": lambda: p < value,
        "le": lambda: p <= value,
        "exists": p.exists,
        "not_exists": p.not_exists,
        "bitwise_and": lambda: p.bitwise_and(value),
        "prefix": lambda: p.prefix(value),
        "in": lambda: p.in_(value),
    }[op]()


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    name = draw(st.sampled_from(NAMES))
    op = draw(
        st.sampled_from(
            [
                "eq",
                "ne",
                "gt",
                "ge",
                "lt",
                "le",
                "exists",
                "not_exists",
                "bitwise_and",
                "prefix",
                "in",
            ]
        )
    )
    if op in ("exists", "not_exists"):
        return _pred(name, op)
    if op in ("gt", "ge", "lt", "le"):
        return _pred(name, op, draw(orderable))
    if op == "bitwise_and":
        return _pred(name, op, draw(ints.filter(lambda v: v != 0)))
    if op == "prefix":
        return _pred(name, op, draw(strs))
    if op == "in":
        return _pred(name, op, draw(st.lists(values, min_size=1, max_size=4)))
    return _pred(name, op, draw(values))


expressions = st.recursive(
    predicates(),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: t[0] & t[1]),
        st.tuples(inner, inner).map(lambda t: t[0] | t[1]),
    ),
    max_leaves=6,
)
filters: st.SearchStrategy[Filter] = expressions.map(to_filter)

messages = st.dictionaries(st.sampled_from(NAMES), values, max_size=len(NAMES))
