"""Why a filter matches a message or not, by the reference semantics.

:func:`explain` evaluates every group of a filter with :func:`~messagebox.predicates.evaluate.
predicate_holds` (so it agrees with :meth:`Filter.matches <predicates.Filter.matches>`
by construction) and, for each group that fails, names the first predicate that fails,
the property's actual value and why it fails: absent, of another family, or a
comparison that is false.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from messagebox.predicates.evaluate import predicate_holds
from messagebox.predicates.model import Filter, Op, Predicate
from messagebox.predicates.text import format_value
from messagebox.properties import Family, Value, family

FAMILY_NAMES = {
    Family.STR: "a str",
    Family.NUM: "a number",
    Family.BOOL: "a bool",
    Family.DATETIME: "a datetime",
}


_NEGATION = {Op.EQ: "!=", Op.NE: "==", Op.GT: "<=", Op.GE: "<", Op.LT: ">=", Op.LE: ">"}
"""What holds instead when a comparison fails (within one family)."""


@dataclass(frozen=True)
class PredicateCheck:
    """One predicate tested against a message's properties."""

    predicate: Predicate
    holds: bool
    present: bool
    """Whether the message has the property."""
    actual: Value | None
    """The property's value (None when absent)."""
    why: str
    """Why it fails (empty when it holds), e.g. ``is absent``, ``"US" != "EU"``."""


@dataclass(frozen=True)
class GroupExplanation:
    """One AND-group: it matches when every predicate holds."""

    matched: bool
    failed: PredicateCheck | None
    """The first predicate of the group (in its order) that fails; None when it matches."""


@dataclass(frozen=True)
class FilterExplanation:
    """A filter against a message: it matches when any group matches."""

    matched: bool
    groups: tuple[GroupExplanation, ...]


def _show(value: Value | None) -> str:
    return "absent" if value is None else format_value(value)


def _why(pred: Predicate, present: bool, actual: Value | None) -> str:
    """Why a predicate that fails fails."""
    op = pred.op
    if op is Op.NOT_EXISTS:
        return f"is present ({_show(actual)})"
    if not present or actual is None:
        return "is absent"
    fam = family(actual)
    if op is Op.IN:
        return f"{_show(actual)} is not one of [{', '.join(_show(v) for v in pred.value)}]"
    if op is Op.BITWISE_AND:
        if type(actual) is not int:
            return f"{_show(actual)} is {FAMILY_NAMES[fam]}" + (
                ", not an int" if fam is Family.NUM else " (bitwise_and needs an int)"
            )
        return f"{_show(actual)} & {pred.value} == 0"
    if op is Op.PREFIX:
        if fam is not Family.STR:
            return f"{_show(actual)} is {FAMILY_NAMES[fam]} (prefix needs a str)"
        return f"{_show(actual)} does not start with {_show(pred.value)}"
    expected = family(pred.value)
    if fam is not expected:
        return (
            f"{_show(actual)} is {FAMILY_NAMES[fam]}, the predicate compares "
            f"{FAMILY_NAMES[expected]} (values of different families never compare)"
        )
    return f"{_show(actual)} {_NEGATION[op]} {_show(pred.value)}"


def check(pred: Predicate, properties: Mapping[str, Value]) -> PredicateCheck:
    """Test one predicate against normalised properties, and say why it fails."""
    holds = predicate_holds(pred, properties)
    present = pred.property in properties
    actual = properties.get(pred.property)
    return PredicateCheck(
        predicate=pred,
        holds=holds,
        present=present,
        actual=actual,
        why="" if holds else _why(pred, present, actual),
    )


def explain(filt: Filter, properties: Mapping[str, Value]) -> FilterExplanation:
    """Explain a filter against normalised properties (see
    :func:`~messagebox.predicates.evaluate.normalize_properties`)."""
    groups = []
    for group in filt.groups:
        failed = None
        for pred in group.predicates:
            result = check(pred, properties)
            if not result.holds:
                failed = result
                break
        groups.append(GroupExplanation(matched=failed is None, failed=failed))
    return FilterExplanation(matched=any(g.matched for g in groups), groups=tuple(groups))
