"""The Python filter language.

    (P("BTS.MessageType") == "PO") & (P("orders.Total") > 1000) | P("orders.Rush").exists()

``P(name)`` names a promoted property; its comparison operators and methods build
:class:`~messagebox.predicates.model.Predicate` objects, which combine with ``&`` and ``|`` into an
expression tree of any depth. :func:`to_filter` normalises that tree to disjunctive normal
form (an OR of AND-groups), refusing one that expands past ``MAX_GROUPS`` groups, or
nests more than ``MAX_NESTING`` levels deep, before building it. As in Python, ``&``
binds tighter than ``|``: parenthesise comparisons. The ``&``/``|`` nodes and
:func:`to_filter` live in :mod:`messagebox.predicates.model` (predicates combine with them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from messagebox.errors import FilterValidationError
from messagebox.predicates.model import And, Expr, Op, Or, Predicate, to_filter

__all__ = ["And", "Expr", "Or", "P", "to_filter"]


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
        """The property is present and equal to one of ``values`` (read only as far as
        the limits allow: an endless iterator is refused, not exhausted)."""
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise FilterValidationError(
                f"predicate {self.name}.in_({values!r}): in_ takes a list of values"
            )
        return self._pred(Op.IN, values)

    def __repr__(self) -> str:
        return f"P({self.name!r})"

    def __bool__(self) -> bool:
        raise TypeError(
            f"{self!r} has no truth value: compare it (P(...) == v) and combine with & and |"
        )
