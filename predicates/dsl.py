"""The Python filter language.

    (P("BTS.MessageType") == "PO") & (P("orders.Total") > 1000) | P("orders.Rush").exists()

``P(name)`` names a promoted property; its comparison operators and methods build
:class:`~predicates.model.Predicate` objects, which combine with ``&`` and ``|`` into an
expression tree of any depth. :func:`to_filter` normalises that tree to disjunctive normal
form (an OR of AND-groups), refusing one that expands past ``MAX_GROUPS`` groups, or
nests more than ``MAX_NESTING`` levels deep, before building it. As in Python, ``&``
binds tighter than ``|``: parenthesise comparisons.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from messagebox.errors import FilterValidationError
from predicates.model import MAX_GROUPS, MAX_NESTING, Filter, Group, Op, Predicate


class P:
    """A reference to a promoted property, e.g. ``P("orders.Total")``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise FilterValidationError(
                f"P({name!r}): a property name is a str such as 'orders.Total'"
            )
        self.name = name

    def _pred(self, op: Op, value: Any = None) -> Predicate:
        return Predicate(property=self.name, op=op, value=value)

    def __eq__(self, value: object) -> Predicate:  # type: ignore[override]
        return self._pred(Op.EQ, value)

    def __ne__(self, value: object) -> Predicate:  # type: ignore[override]
        return self._pred(Op.NE, value)

    def __gt__(self, value: object) -> Predicate:
        return self._pred(Op.GT, value)

    def __ge__(self, value: object) -> Predicate:
        return self._pred(Op.GE, value)

    def __lt__(self, value: object) -> Predicate:
        return self._pred(Op.LT, value)

    def __le__(self, value: object) -> Predicate:
        return self._pred(Op.LE, value)

    __hash__ = None  # type: ignore[assignment]

    def exists(self) -> Predicate:
        """The property is present, with any value."""
        return self._pred(Op.EXISTS)

    def not_exists(self) -> Predicate:
        """The property is absent."""
        return self._pred(Op.NOT_EXISTS)

    def bitwise_and(self, mask: int) -> Predicate:
        """The property is an int and ``value & mask != 0``."""
        return self._pred(Op.BITWISE_AND, mask)

    def prefix(self, prefix: str) -> Predicate:
        """The property is a str starting with ``prefix``."""
        return self._pred(Op.PREFIX, prefix)

    def in_(self, values: Iterable[object]) -> Predicate:
        """The property is present and equal to one of ``values``."""
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise FilterValidationError(
                f"predicate {self.name}.in_({values!r}): in_ takes a list of values"
            )
        return self._pred(Op.IN, tuple(values))

    def __repr__(self) -> str:
        return f"P({self.name!r})"

    def __bool__(self) -> bool:
        raise TypeError(
            f"{self!r} has no truth value: compare it (P(...) == v) and combine with & and |"
        )


Expr: TypeAlias = "Predicate | And | Or"


def _as_expr(value: object) -> Expr:
    if isinstance(value, Predicate | And | Or):
        return value
    if isinstance(value, Filter):
        return Or(tuple(And(g.predicates) for g in value.groups))
    raise FilterValidationError(
        f"cannot combine {value!r} into a filter: use predicates such as P('a.b') == 1"
    )


_NO_TRUTH = (
    "a filter expression has no truth value: combine with & and | (not 'and', 'or' or "
    "chained comparisons such as 1 < P('a.b') < 5)"
)


def _flatten(kind: type[And | Or], parts: tuple[object, ...]) -> tuple[Expr, ...]:
    """Parts of ``kind``, with nested nodes of the same kind spliced in (no deep trees)."""
    out: list[Expr] = []
    for part in parts:
        expr = _as_expr(part)
        if type(expr) is kind:
            out.extend(expr.parts)
        else:
            out.append(expr)
    return tuple(out)


@dataclass(frozen=True)
class And:
    """All parts hold."""

    parts: tuple[Expr, ...]

    @classmethod
    def of(cls, *parts: object) -> And:
        return cls(_flatten(cls, parts))

    def __bool__(self) -> bool:
        raise TypeError(_NO_TRUTH)

    def __and__(self, other: object) -> And:
        return And.of(self, other)

    def __or__(self, other: object) -> Or:
        return Or.of(self, other)


@dataclass(frozen=True)
class Or:
    """Any part holds."""

    parts: tuple[Expr, ...]

    @classmethod
    def of(cls, *parts: object) -> Or:
        return cls(_flatten(cls, parts))

    def __bool__(self) -> bool:
        raise TypeError(_NO_TRUTH)

    def __and__(self, other: object) -> And:
        return And.of(self, other)

    def __or__(self, other: object) -> Or:
        return Or.of(self, other)


def _too_deep(expr: Expr) -> bool:
    """Whether ``&`` and ``|`` nest more than ``MAX_NESTING`` levels deep in ``expr``
    (measured without recursion, so that a tree too deep to recurse into is refused, not
    crashed on)."""
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Predicate):
            continue
        if depth > MAX_NESTING:
            return True
        stack.extend((part, depth + 1) for part in node.parts)
    return False


def _count_groups(expr: Expr) -> int:
    """How many groups the DNF of ``expr`` has, before dedup (capped to stay cheap)."""
    if isinstance(expr, Predicate):
        return 1
    counts = [_count_groups(p) for p in expr.parts]
    if isinstance(expr, Or):
        return sum(counts)
    total = 1
    for c in counts:
        total = min(total * c, 10 * MAX_GROUPS)
    return total


def _dnf(expr: Expr) -> list[tuple[Predicate, ...]]:
    if isinstance(expr, Predicate):
        return [(expr,)]
    if isinstance(expr, Or):
        return [g for part in expr.parts for g in _dnf(part)]
    groups: list[tuple[Predicate, ...]] = [()]
    for part in expr.parts:
        groups = [g + h for g in groups for h in _dnf(part)]
    return groups


def to_filter(expr: object) -> Filter:
    """Normalise a predicate, an ``&``/``|`` expression or a filter to DNF."""
    if isinstance(expr, Filter):
        return expr
    tree = _as_expr(expr)
    if _too_deep(tree):
        raise FilterValidationError(
            f"filter expression is nested more than {MAX_NESTING} levels deep (& within | "
            f"within &…; it starts with {_first_predicate(tree)})"
        )
    size = _count_groups(tree)
    if size > MAX_GROUPS * 4:  # refuse before expanding; Filter checks the exact count
        raise FilterValidationError(
            f"filter expands to at least {min(size, 10 * MAX_GROUPS)} groups in disjunctive "
            f"normal form; at most {MAX_GROUPS} are allowed (it starts with "
            f"{_first_predicate(tree)})"
        )
    return Filter(groups=tuple(Group(predicates=g) for g in _dnf(tree)))


def _first_predicate(expr: Expr) -> Predicate:
    while not isinstance(expr, Predicate):
        expr = expr.parts[0]
    return expr
