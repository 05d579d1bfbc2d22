"""The pure-Python reference evaluator: the oracle every other evaluator must agree with.

Semantics (DESIGN.md §3): an absent property satisfies only ``not_exists``; comparisons
need both sides in one family (str, number, bool, datetime); numbers compare exactly,
strings by code point, datetimes chronologically.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from messagebox.properties import Value, canonical_name, family, normalize_value
from predicates.model import Filter, Op, Predicate

_COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
    Op.LT: operator.lt,
    Op.LE: operator.le,
}


def normalize_properties(properties: Mapping[str, object]) -> dict[str, Value]:
    """Canonical names and normalised values (raises ``ValueError`` on bad input)."""
    out: dict[str, Value] = {}
    for name, value in properties.items():
        canon = canonical_name(name)
        if canon in out:
            raise ValueError(f"property {name!r} is given twice (as {canon!r})")
        out[canon] = normalize_value(value)
    return out


def predicate_holds(pred: Predicate, properties: Mapping[str, Value]) -> bool:
    """Does one predicate hold for normalised properties?"""
    if pred.op is Op.NOT_EXISTS:
        return pred.property not in properties
    if pred.property not in properties:
        return False
    value = properties[pred.property]
    op = pred.op
    if op is Op.EXISTS:
        return True
    if op is Op.IN:
        fam = family(value)
        return any(family(v) == fam and v == value for v in pred.value)
    if op is Op.BITWISE_AND:
        return type(value) is int and value & pred.value != 0
    if op is Op.PREFIX:
        return isinstance(value, str) and value.startswith(pred.value)
    if family(value) != family(pred.value):
        return False
    return _COMPARE[op](value, pred.value)


def filter_matches(filt: Filter, properties: Mapping[str, Value]) -> bool:
    """Does any group of the filter have all its predicates true?"""
    return any(
        all(predicate_holds(p, properties) for p in group.predicates) for group in filt.groups
    )
