"""The filter model: an OR of AND-groups of predicates (disjunctive normal form).

A :class:`Filter` is what subscriptions store and every evaluator (Python, SQL, Spark)
reads. It serialises to JSON with typed values, so ``1``, ``1.0``, ``"1"`` and a
datetime stay distinct after a round trip. The ``&``/``|`` expression algebra that
builds filters and the reference evaluator are here too, so that the model imports
nothing above it (:mod:`messagebox.predicates.dsl` and
:mod:`messagebox.predicates.evaluate` name them).

Limits (checked when a filter is built):

- at most :data:`MAX_GROUPS` groups after normalisation to DNF;
- at most :data:`MAX_PREDICATES_PER_GROUP` predicates in one group;
- at most :data:`MAX_IN_VALUES` values in one ``in_`` predicate;
- at most :data:`MAX_NESTING` levels of nesting in an expression or filter text (``&``
  within ``|`` within ``&``…, or parentheses), refused before it is normalised.

Each limit counts after duplicates are removed. An expression that would expand to more
than :data:`PRE_DEDUP_FACTOR` times :data:`MAX_GROUPS` groups, or an ``in_`` given more
than :data:`MAX_IN_GIVEN` values, is refused from its size, before it is expanded or its
values compared. The work is linear in the input: an ``in_`` list is de-duplicated by
family and exact value, a group as it is expanded (and refused as soon as it holds too
many distinct predicates).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from messagebox.errors import FilterValidationError
from messagebox.properties import (
    Family,
    Value,
    canonical_name,
    decode_value,
    encode_value,
    family,
    normalize_value,
)

MAX_GROUPS = 128
MAX_PREDICATES_PER_GROUP = 64
MAX_IN_VALUES = 1000
MAX_NESTING = 100
PRE_DEDUP_FACTOR = 4
"""How many times a limit a filter may reach before its duplicates are removed."""
MAX_IN_GIVEN = PRE_DEDUP_FACTOR * MAX_IN_VALUES
"""Values an ``in_`` may be given, duplicates included."""


class Op(StrEnum):
    """Predicate operators (docs/concepts.md: Filters)."""

    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"
    EXISTS = "exists"
    NOT_EXISTS = "not_exists"
    BITWISE_AND = "bitwise_and"
    PREFIX = "prefix"
    IN = "in"


_OPS: dict[str, Op] = {op.value: op for op in Op}
RANGE_OPS = frozenset({Op.GT, Op.GE, Op.LT, Op.LE})
NO_VALUE_OPS = frozenset({Op.EXISTS, Op.NOT_EXISTS})
_SYMBOLS = {Op.EQ: "==", Op.NE: "!=", Op.GT: ">", Op.GE: ">=", Op.LT: "<", Op.LE: "<="}


def _decode_json_value(raw: Any) -> Any:
    """Decode the tagged ``[tag, value]`` JSON form of a value."""
    if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str):
        try:
            return decode_value(raw)
        except (ValueError, TypeError) as exc:
            raise FilterValidationError(f"malformed value {raw!r}: {exc}") from exc
    raise FilterValidationError(f"malformed value {raw!r}: expected [tag, value]")


class Predicate(BaseModel):
    """One test of one promoted property, e.g. ``orders.Total > 1000``."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    property: Any
    op: Op
    value: Any = None

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any, info: ValidationInfo) -> Any:
        """The canonical property name and the operand checked against its operator,
        before the fields are set (a JSON operand is decoded from its tagged form)."""
        if not isinstance(data, dict) or "property" not in data:
            return data  # the field validation reports what is missing
        raw_op = data.get("op")
        if not isinstance(raw_op, str) or raw_op not in Op._value2member_map_:
            return data  # the field validation names the operator
        op = Op(raw_op)
        value = data.get("value")
        if info.mode == "json" and value is not None:
            if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
                value = tuple(_decode_json_value(v) for v in value)
            else:
                value = _decode_json_value(value)
        try:
            name = canonical_name(data["property"])
            value = _check_operand(op, value)
        except ValueError as exc:
            raise FilterValidationError(
                f"predicate {_show(data['property'], op, _brief(value))}: {exc}"
            ) from exc
        return {**data, "property": name, "op": op, "value": value}

    @field_serializer("value")
    def _encode(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, tuple):
            return [encode_value(v) for v in value]
        return encode_value(value)

    # -- composition with the DSL (see predicates.dsl) --
    def __and__(self, other: object) -> Any:
        return And.of(self, other)

    def __or__(self, other: object) -> Any:
        return Or.of(self, other)

    def __bool__(self) -> bool:
        raise TypeError(_NO_TRUTH)

    def __str__(self) -> str:
        return _show(self.property, self.op, self.value)

    def __repr__(self) -> str:
        return f"Predicate({self})"

    def key(self) -> str:
        """A canonical text key: equal for predicates that always agree."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)

    def matches(self, properties: Mapping[str, object]) -> bool:
        """The reference evaluator: does a message with these properties satisfy this
        predicate? (Values are normalised first, as :meth:`Filter.matches` does.)"""
        return predicate_holds(self, normalize_properties(properties))


def _stored_value(raw: Any) -> Any:
    """A predicate's value from its stored, tagged JSON form."""
    if raw is None:
        return None
    if raw and isinstance(raw[0], list):
        return tuple(decode_value(v) for v in raw)
    return decode_value(raw)


class _Brief:
    """A long list of values, shown by its first few and its length."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = values

    def __repr__(self) -> str:
        first = ", ".join(repr(v) for v in self.values[:3])
        return f"[{first}, … {len(self.values)} values]"


def _brief(value: Any) -> Any:
    """``value``, or a stand-in that shows a long list in a few characters."""
    if isinstance(value, list | tuple) and len(value) > 5:
        return _Brief(value)
    return value


def _show(name: object, op: Op, value: Any) -> str:
    """A predicate as text, e.g. ``orders.Total > 1000``."""
    if op in _SYMBOLS:
        return f"{name} {_SYMBOLS[op]} {value!r}"
    if op in NO_VALUE_OPS:
        return f"{name}.{op.value}()"
    return f"{name}.{op.value}({value!r})"


def _check_operand(op: Op, value: Any) -> Any:
    """Validate the value against its operator and return it normalised."""
    if op in NO_VALUE_OPS:
        if value is not None:
            raise ValueError(f"{op.value} takes no value")
        return None
    if op is Op.IN:
        return _in_members(value)
    if value is None:
        raise ValueError(f"{op.value} needs a value")
    normal = normalize_value(value)
    fam = family(normal)
    if op in RANGE_OPS and fam is Family.BOOL:
        raise ValueError(f"{_SYMBOLS[op]} cannot order a bool")
    if op is Op.BITWISE_AND:
        if fam is not Family.NUM or not isinstance(normal, int):
            raise ValueError(f"bitwise_and takes an int mask, not {type(normal).__name__}")
        if normal == 0:
            raise ValueError("bitwise_and with mask 0 can never match")
    if op is Op.PREFIX and fam is not Family.STR:
        raise ValueError(f"prefix takes a str, not {type(normal).__name__}")
    return normal


def in_list_too_long(given: int | None) -> str:
    """Why an ``in_`` given ``given`` values (None: more than it may be) is refused."""
    count = f"more than {MAX_IN_GIVEN}" if given is None else str(given)
    return (
        f"in_ takes at most {MAX_IN_GIVEN} values before duplicates are removed "
        f"({MAX_IN_VALUES} after); {count} given"
    )


def _in_members(value: Any) -> tuple[Value, ...]:
    """The distinct values of an ``in_`` list, in order (the first of equal ones kept),
    normalised; its length is checked first, and each value is looked up by its family
    and exact value (``1 == 1.0``, ``True`` apart from ``1``, ``2**53 + 1`` apart from
    ``2.0**53``), so that the work is linear in the list."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError("in_ takes a list of values")
    given = len(value) if isinstance(value, Sized) else None
    if given is not None and given > MAX_IN_GIVEN:
        raise ValueError(in_list_too_long(given))
    members: dict[tuple[Family, Value], Value] = {}
    for count, raw in enumerate(value, start=1):
        if count > MAX_IN_GIVEN:
            raise ValueError(in_list_too_long(None))
        member = normalize_value(raw)
        members.setdefault((family(member), member), member)
        if len(members) > MAX_IN_VALUES:
            of = "" if given is None else f" of the {given} given"
            raise ValueError(
                f"in_ takes at most {MAX_IN_VALUES} values after duplicates are removed; "
                f"more than {MAX_IN_VALUES}{of} are distinct"
            )
    if not members:
        raise ValueError("in_ needs at least one value")
    return tuple(members.values())


class Group(BaseModel):
    """An AND of predicates: holds when every predicate holds."""

    model_config = ConfigDict(frozen=True)

    predicates: tuple[Predicate, ...]

    @field_validator("predicates")
    @classmethod
    def _unique(cls, predicates: tuple[Predicate, ...]) -> tuple[Predicate, ...]:
        """Each predicate once, and not too many."""
        if not predicates:
            raise FilterValidationError("a filter group needs at least one predicate")
        unique = tuple({p.key(): p for p in predicates}.values())
        if len(unique) > MAX_PREDICATES_PER_GROUP:
            raise FilterValidationError(
                f"a filter group has {len(unique)} predicates; "
                f"at most {MAX_PREDICATES_PER_GROUP} are allowed (first: {unique[0]})"
            )
        return unique

    def __str__(self) -> str:
        return " & ".join(f"({p})" for p in self.predicates)


class Filter(BaseModel):
    """An OR of AND-groups: a message matches when any group holds."""

    model_config = ConfigDict(frozen=True)

    groups: tuple[Group, ...]

    @field_validator("groups")
    @classmethod
    def _unique(cls, groups: tuple[Group, ...]) -> tuple[Group, ...]:
        """Each group once, and not too many."""
        if not groups:
            raise FilterValidationError("a filter needs at least one group (empty filter)")
        unique: dict[frozenset[str], Group] = {}
        for group in groups:
            unique.setdefault(frozenset(p.key() for p in group.predicates), group)
        if len(unique) > MAX_GROUPS:
            first = next(iter(unique.values())).predicates[0]
            raise FilterValidationError(
                f"filter has {len(unique)} groups in disjunctive normal form; "
                f"at most {MAX_GROUPS} are allowed (it starts with {first})"
            )
        return tuple(unique.values())

    def __and__(self, other: object) -> Any:
        return And.of(self, other)

    def __or__(self, other: object) -> Any:
        return Or.of(self, other)

    @classmethod
    def of(cls, expr: object) -> Filter:
        """Normalise a DSL expression, predicate or filter to a filter in DNF."""
        return to_filter(expr)

    def matches(self, properties: Mapping[str, object]) -> bool:
        """The reference evaluator: does a message with these properties match?"""
        return filter_matches(self, normalize_properties(properties))

    def to_json(self) -> str:
        """Serialise to JSON (values tagged with their types)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Filter:
        """Parse JSON made by :meth:`to_json`; errors are :class:`FilterValidationError`."""
        from pydantic import ValidationError as PydanticError

        try:
            return cls.model_validate_json(text)
        except PydanticError as exc:
            raise FilterValidationError(f"malformed filter JSON: {exc}") from exc

    @classmethod
    def from_stored_json(cls, text: str | bytes) -> Filter:
        """Rebuild a filter from JSON that :meth:`to_json` wrote for a filter already
        validated (a subscription's stored filter), without validating it again: about
        ten times faster, for loading many at once. Anything else goes through
        :meth:`from_json`."""
        data = json.loads(text)
        return cls.model_construct(
            groups=tuple(
                Group.model_construct(
                    predicates=tuple(
                        Predicate.model_construct(
                            property=p["property"],
                            op=_OPS[p["op"]],
                            value=_stored_value(p["value"]),
                        )
                        for p in group["predicates"]
                    )
                )
                for group in data["groups"]
            )
        )

    @property
    def properties(self) -> frozenset[str]:
        """Every property name the filter tests."""
        return frozenset(p.property for g in self.groups for p in g.predicates)

    def __str__(self) -> str:
        return " | ".join(f"[{g}]" for g in self.groups)


# --- the expression algebra: & and | trees, normalised to DNF (see predicates.dsl) ---


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


def _flatten(kind: type[_Node], parts: tuple[object, ...]) -> tuple[Expr, ...]:
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
class _Node:
    """An ``&`` or ``|`` node of an expression tree."""

    parts: tuple[Expr, ...]

    @classmethod
    def of(cls, *parts: object) -> Self:
        return cls(_flatten(cls, parts))

    def __bool__(self) -> bool:
        raise TypeError(_NO_TRUTH)

    def __and__(self, other: object) -> And:
        return And.of(self, other)

    def __or__(self, other: object) -> Or:
        return Or.of(self, other)


@dataclass(frozen=True)
class And(_Node):
    """All parts hold."""


@dataclass(frozen=True)
class Or(_Node):
    """Any part holds."""


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


def _dnf(expr: Expr, keys: dict[int, str] | None = None) -> list[dict[str, Predicate]]:
    """The groups of the DNF of ``expr``, each its predicates by :meth:`Predicate.key`
    (``keys`` caches them by object), duplicates dropped as the groups are made: a long
    ``&`` of repeats costs time linear in its length. A group of more than
    ``MAX_PREDICATES_PER_GROUP`` distinct predicates is refused as soon as it appears."""
    keys = {} if keys is None else keys
    if isinstance(expr, Predicate):
        key = keys.get(id(expr))
        if key is None:
            key = keys[id(expr)] = expr.key()
        return [{key: expr}]
    if isinstance(expr, Or):
        return [g for part in expr.parts for g in _dnf(part, keys)]
    groups: list[dict[str, Predicate]] = [{}]
    for part in expr.parts:
        more = _dnf(part, keys)
        if len(more) == 1:  # each group once: grown in place
            for g in groups:
                g.update(more[0])
        else:
            groups = [{**g, **h} for g in groups for h in more]
        for g in groups:
            if len(g) > MAX_PREDICATES_PER_GROUP:
                raise FilterValidationError(
                    f"a filter group has more than {MAX_PREDICATES_PER_GROUP} distinct "
                    f"predicates; at most {MAX_PREDICATES_PER_GROUP} are allowed "
                    f"(first: {next(iter(g.values()))})"
                )
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
    if size > MAX_GROUPS * PRE_DEDUP_FACTOR:  # before expanding; Filter checks the exact count
        raise FilterValidationError(
            f"filter expands to at least {min(size, 10 * MAX_GROUPS)} groups in disjunctive "
            f"normal form; at most {MAX_GROUPS} are allowed (it starts with "
            f"{_first_predicate(tree)})"
        )
    return Filter(groups=tuple(Group(predicates=tuple(g.values())) for g in _dnf(tree)))


def _first_predicate(expr: Expr) -> Predicate:
    while not isinstance(expr, Predicate):
        expr = expr.parts[0]
    return expr


# --- the reference evaluator (see predicates.evaluate) ---


COMPARISONS: dict[Op, Callable[[Any, Any], bool]] = {
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
    return COMPARISONS[op](value, pred.value)


def filter_matches(filt: Filter, properties: Mapping[str, Value]) -> bool:
    """Does any group of the filter have all its predicates true?"""
    return any(
        all(predicate_holds(p, properties) for p in group.predicates) for group in filt.groups
    )
