"""Exact reasoning over filters: which groups can never match, which imply others.

Every operator tests one property, so a group is satisfiable when, for each property it
names, some value (or the property's absence) passes every test of that property. This
module decides that exactly by building, per property and comparison family, a finite
set of *witnesses* that is sure to contain a passing value if any exists, and trying
each with the reference evaluator (:func:`~messagebox.predicates.model.predicate_holds`):

- the truth of ``==``, ``!=``, ``in`` and the comparisons changes only at their
  constants, and a ``prefix`` test's only at the prefix and at the end of the block of
  strings that start with it; so one value inside each open stretch between two such
  *breakpoints* (and one beyond each end), plus the breakpoints themselves, decide every
  test but the bit masks;
- ``bitwise_and`` also depends on the bits of an int: in each stretch, the smallest int
  whose bits pass every mask test is computed directly (and a float stands for values
  that are not ints);
- the smallest value after a breakpoint exists in every family: ``s + "\\x01"`` for a
  string (NUL is refused), the next float or int for a number, one microsecond later
  for a datetime.

Strings are taken as unbounded in length: a group whose only matches are longer than
the 256 characters a promoted string may hold is reported satisfiable.

Implication is satisfiability of a negation: group ``A`` implies group ``B`` when ``A``
together with the negation of any one of ``B``'s predicates can never hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from messagebox.predicates.model import Filter, Group, Op, Predicate, predicate_holds
from messagebox.properties import INT64_MAX, INT64_MIN, Family, Value, family

_ABSENT = object()
"""The witness for a property that the message does not carry."""

_MICRO = timedelta(microseconds=1)
_DT_MIN = datetime.min.replace(tzinfo=UTC)
_DT_MAX = datetime.max.replace(tzinfo=UTC)
_MAX_CHAR = 0x10FFFF
_SIGN = 1 << 63
_WORD = (1 << 64) - 1


@dataclass(frozen=True)
class Literal:
    """A predicate, or its negation (``holds`` False)."""

    predicate: Predicate
    holds: bool = True

    def test(self, value: object) -> bool:
        props: dict[str, Value] = {} if value is _ABSENT else {self.predicate.property: value}  # type: ignore[dict-item]
        return predicate_holds(self.predicate, props) is self.holds


def witness(literals: Iterable[Literal | Predicate]) -> dict[str, Value] | None:
    """A message (its properties) that passes every literal, or None when none does."""
    by_property: dict[str, list[Literal]] = {}
    for item in literals:
        lit = item if isinstance(item, Literal) else Literal(item)
        by_property.setdefault(lit.predicate.property, []).append(lit)
    message: dict[str, Value] = {}
    for name, lits in by_property.items():
        found = _property_witness(lits)
        if found is None:
            return None
        if found is not _ABSENT:
            message[name] = found  # type: ignore[assignment]
    return message


def satisfiable(literals: Iterable[Literal | Predicate]) -> bool:
    """Whether some message passes every literal (a predicate, or a negated one)."""
    return witness(literals) is not None


def group_satisfiable(group: Group) -> bool:
    """Whether some message matches the group."""
    return satisfiable(group.predicates)


def implies(a: Group, b: Group) -> bool:
    """Whether every message matching ``a`` matches ``b``."""
    return all(not satisfiable([*a.predicates, Literal(p, False)]) for p in b.predicates)


def covered(group: Group, others: Sequence[Group], budget: int = 20_000) -> bool | None:
    """Whether every message matching ``group`` matches one of ``others`` (exact), or
    None when deciding it would try more than ``budget`` combinations."""
    tried = 0

    def search(chosen: list[Literal], rest: Sequence[Group]) -> bool | None:
        # true when some message matches `group` and none of `rest`
        nonlocal tried
        if not rest:
            return True
        for pred in rest[0].predicates:
            tried += 1
            if tried > budget:
                return None
            attempt = [*chosen, Literal(pred, False)]
            if satisfiable([*group.predicates, *attempt]):
                found = search(attempt, rest[1:])
                if found is not False:
                    return found
        return False

    if not group_satisfiable(group):
        return True
    escape = search([], others)
    return None if escape is None else not escape


def filter_implies(a: Filter, b: Filter) -> bool | None:
    """Whether every message matching ``a`` matches ``b`` (None: too costly to decide)."""
    answer: bool | None = True
    for group in a.groups:
        one = covered(group, b.groups)
        if one is False:
            return False
        if one is None:
            answer = None
    return answer


def equivalent(a: Filter, b: Filter) -> bool | None:
    """Whether ``a`` and ``b`` match the same messages (None: too costly to decide)."""
    forth = filter_implies(a, b)
    if forth is False:
        return False
    back = filter_implies(b, a)
    if back is False:
        return False
    return True if forth and back else None


# --- one property ---


def _property_witness(lits: Sequence[Literal]) -> object | None:
    """A value of one property (or :data:`_ABSENT`) that passes every literal."""
    for w in _candidates(lits):
        if all(lit.test(w) for lit in lits):
            return w
    return None


def _both_types(values: Iterable[Value]) -> list[object]:
    """The values, each number also as the other of int and float when it is one (they
    compare equal, but only an int passes ``bitwise_and``)."""
    out: list[object] = []
    for v in values:
        out.append(v)
        if isinstance(v, float) and v.is_integer() and INT64_MIN <= v <= INT64_MAX:
            out.append(int(v))
        elif isinstance(v, int) and not isinstance(v, bool) and float(v) == v:
            out.append(float(v))
    return out


_FAMILY_OPS = frozenset({Op.EQ, Op.NE, Op.GT, Op.GE, Op.LT, Op.LE})


def _candidates(lits: Sequence[Literal]) -> Iterable[object]:
    """The witnesses worth trying: a positive ``==`` or ``in`` allows only its values; a
    positive test of a value allows only that value's family; else every family's."""
    positive = [lit.predicate for lit in lits if lit.holds]
    for pred in positive:
        if pred.op is Op.EQ:
            return _both_types((pred.value,))
        if pred.op is Op.IN:
            return _both_types(pred.value)
    if any(p.op is Op.NOT_EXISTS for p in positive):
        return (_ABSENT,)
    families = set(Family)
    for pred in positive:
        if pred.op in _FAMILY_OPS:
            families &= {family(pred.value)}
        elif pred.op is Op.PREFIX:
            families &= {Family.STR}
        elif pred.op is Op.BITWISE_AND:
            families &= {Family.NUM}
    return _witnesses(lits, families, absent=not positive)


def _constants(lits: Sequence[Literal]) -> list[Value]:
    out: list[Value] = []
    for lit in lits:
        value = lit.predicate.value
        if isinstance(value, tuple):
            out.extend(value)
        elif value is not None:
            out.append(value)
    return out


def _witnesses(lits: Sequence[Literal], families: set[Family], absent: bool) -> Iterable[object]:
    if absent:
        yield _ABSENT
    constants = _constants(lits)
    if Family.BOOL in families:
        yield True
        yield False
    if Family.DATETIME in families:
        yield from _datetime_witnesses([c for c in constants if family(c) is Family.DATETIME])
    if Family.STR in families:
        yield from _string_witnesses(
            [c for c in constants if family(c) is Family.STR],
            [lit.predicate.value for lit in lits if lit.predicate.op is Op.PREFIX],
        )
    if Family.NUM in families:
        masks = [lit for lit in lits if lit.predicate.op is Op.BITWISE_AND]
        yield from _number_witnesses([c for c in constants if family(c) is Family.NUM], masks)


def _datetime_witnesses(constants: list[Any]) -> Iterable[object]:
    if not constants:
        yield datetime(2000, 1, 1, tzinfo=UTC)
    for c in constants:
        yield c
        if c > _DT_MIN:
            yield c - _MICRO
        if c < _DT_MAX:
            yield c + _MICRO


def _block_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (None: none)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code <= _MAX_CHAR:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _string_witnesses(constants: list[Any], prefixes: list[Any]) -> Iterable[object]:
    points = set(constants) | set(prefixes)
    points.update(e for e in map(_block_end, prefixes) if e is not None)
    yield ""
    for p in points:
        yield p
        yield p + "\x01"  # the smallest string after p


# numbers: ints of 64 bits and finite floats, compared exactly


def _next_float(x: int | float) -> float | None:
    """The smallest finite float above ``x``."""
    if isinstance(x, float):
        up = math.nextafter(x, math.inf)
    else:
        try:
            up = float(x)
        except OverflowError:
            return None
        if up <= x:
            up = math.nextafter(up, math.inf)
    return up if math.isfinite(up) else None


def _next_int(x: int | float) -> int:
    """The smallest int above ``x``."""
    return x + 1 if isinstance(x, int) else math.floor(x) + 1


def _number_witnesses(constants: list[Any], masks: list[Literal]) -> Iterable[object]:
    must = [lit.predicate.value & _WORD for lit in masks if lit.holds]
    never = 0
    for lit in masks:
        if not lit.holds:
            never |= lit.predicate.value & _WORD
    starts: list[int | float] = []
    yield -1.7976931348623157e308  # below every constant
    yield from _ints_from(INT64_MIN, must, never)
    for c in constants:
        starts.append(c)
        if (isinstance(c, int) or c.is_integer()) and INT64_MIN <= c <= INT64_MAX:
            yield int(c)
        if float(c) == c:
            yield float(c)
    for c in starts:
        up = _next_float(c)
        if up is not None:
            yield up
        low = _next_int(c)
        if low <= INT64_MAX:
            yield max(low, INT64_MIN)
            yield from _ints_from(max(low, INT64_MIN), must, never)


def _ints_from(low: int, must: list[int], never: int) -> Iterable[int]:
    """The smallest int64 at least ``low`` whose 64-bit pattern shares a bit with each
    of ``must`` and none with ``never`` (nothing when there is none)."""
    found = _smallest_pattern(low + _SIGN, must, never)
    if found is not None:
        yield found - _SIGN


def _pattern(u: int) -> int:
    """The two's-complement bits of the int64 ``u - 2**63`` (``u`` is order-preserving)."""
    return u ^ _SIGN


def _fits(u: int, must: list[int], never: int) -> bool:
    bits = _pattern(u)
    return bits & never == 0 and all(bits & m for m in must)


def _smallest_pattern(low: int, must: list[int], never: int) -> int | None:
    """The smallest u in [low, 2**64) with :func:`_fits` true."""
    if low > _WORD:
        return None
    if _fits(low, must, never):
        return low
    # above `low`: keep its bits over position i, set bit i (a 0 in `low`), complete the
    # bits below as small as possible; the lowest such i that can be completed wins
    for i in range(64):
        if low >> i & 1:
            continue
        head = (low >> (i + 1) << (i + 1)) | (1 << i)
        done = _complete(head, i, must, never)
        if done is not None:
            return done
    return None


def _complete(head: int, i: int, must: list[int], never: int) -> int | None:
    """The smallest u with ``head``'s bits from position i up and free bits below."""
    bits = _pattern(head)
    if bits & never:
        return None
    below = (1 << i) - 1
    allowed = below & ~never  # bits under i are the same in u and its pattern (i < 64)
    unmet = [m for m in must if not bits & m]
    if any(not m & allowed for m in unmet):
        return None
    u = head
    for j in range(i - 1, -1, -1):
        lower = allowed & ((1 << j) - 1)
        if all(m & lower for m in unmet):
            continue  # bit j can stay 0
        u |= 1 << j
        unmet = [m for m in unmet if not m >> j & 1]
    return u


__all__ = [
    "Literal",
    "covered",
    "equivalent",
    "filter_implies",
    "group_satisfiable",
    "implies",
    "satisfiable",
    "witness",
]
