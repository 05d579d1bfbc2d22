"""A filter compiled to a test of a stored context's promoted properties as they are
read from its JSON (``{"orders.Total": ["f", 5000.0], …}``: each a ``[tag, value]``
pair, :func:`messagebox.properties.encode_context`), without decoding them first: the
test a search runs on every message it goes through (:mod:`messagebox.ops.search`).

It agrees with the reference evaluator (:func:`~messagebox.predicates.model.filter_matches`
on the decoded properties) on every filter and context: the tag is the family (``i`` and
``f`` numbers, ``s`` text, ``b`` bool, ``d`` a datetime, read only when a predicate
compares it); Python compares an int with a float exactly, as the evaluator does; ``in``
looks a value up in one set per family (equal numbers hash alike, ``1`` and ``1.0``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from messagebox.predicates.model import COMPARISONS, Filter, Op, Predicate
from messagebox.properties import Family, Value, family

Pairs = Mapping[str, Any]
"""A stored context's promoted properties as JSON gives them: name to ``[tag, value]``."""
Test = Callable[[Pairs], bool]

_TAGS: dict[Family, frozenset[str]] = {
    Family.NUM: frozenset("if"),
    Family.STR: frozenset("s"),
    Family.BOOL: frozenset("b"),
    Family.DATETIME: frozenset("d"),
}


def _value(pair: Any) -> Value:
    """A stored pair's value: a datetime read from its text, any other as it is."""
    tag, raw = pair
    if tag == "d":
        return datetime.fromisoformat(raw)
    if tag == "f":
        return float(raw)
    return raw  # type: ignore[no-any-return]


def _compare(name: str, op: Op, operand: Value) -> Test:
    tags, compare = _TAGS[family(operand)], COMPARISONS[op]

    def test(pairs: Pairs) -> bool:
        pair = pairs.get(name)
        return pair is not None and pair[0] in tags and compare(_value(pair), operand)

    return test


def _one_of(name: str, values: tuple[Value, ...]) -> Test:
    by_tag: dict[str, set[Value]] = {}
    for v in values:
        for tag in _TAGS[family(v)]:
            by_tag.setdefault(tag, set()).add(v)

    def test(pairs: Pairs) -> bool:
        pair = pairs.get(name)
        if pair is None or pair[0] not in by_tag:
            return False
        return _value(pair) in by_tag[pair[0]]

    return test


def _predicate(pred: Predicate) -> Test:
    name, op, operand = pred.property, pred.op, pred.value
    if op is Op.EXISTS:
        return lambda pairs: name in pairs
    if op is Op.NOT_EXISTS:
        return lambda pairs: name not in pairs
    if op is Op.IN:
        return _one_of(name, operand)
    if op is Op.PREFIX:

        def prefix(pairs: Pairs) -> bool:
            pair = pairs.get(name)
            return pair is not None and pair[0] == "s" and pair[1].startswith(operand)

        return prefix
    if op is Op.BITWISE_AND:

        def masked(pairs: Pairs) -> bool:
            pair = pairs.get(name)
            return pair is not None and pair[0] == "i" and pair[1] & operand != 0

        return masked
    return _compare(name, op, operand)


def compile_stored(filt: Filter) -> Test:
    """A test of stored promoted pairs that holds when ``filt`` matches them."""
    groups = [[_predicate(p) for p in g.predicates] for g in filt.groups]
    if len(groups) == 1 and len(groups[0]) == 1:
        return groups[0][0]
    return lambda pairs: any(all(t(pairs) for t in group) for group in groups)
