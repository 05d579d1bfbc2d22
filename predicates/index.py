"""The in-memory evaluator: many filters compiled into one index, matched per message.

The counting algorithm with anchors, as the SQL and Spark routers run it, in process
memory: each group of each filter gets an *anchor*, its most selective predicate
(equality first, then ``in``, prefix, range, mask, exists, ``!=``; a group of only
``not_exists`` has none), filed under its property in a structure that finds, for one
value, every anchor that holds without looking at the others:

- ``==`` and each ``in`` member: a hash table keyed by the value (a bool keyed apart
  from the number it equals in Python);
- ``prefix``: a hash table of prefixes, probed with the value's first ``n`` characters
  for each prefix length present;
- ``> >= < <=``: per family and operator, the bounds in sorted order, so the anchors a
  value satisfies are one slice found by bisection;
- ``bitwise_and`` by mask, ``exists`` and ``!=`` by property.

A group is filed under its anchor itself (not an id to look up), so a message's
candidates are the groups its values reach, each once, with no set to build: at
100,000 subscriptions matching took 21 us a message instead of 27.

A message's candidate groups are the ones whose anchor holds; each is then verified by
its remaining predicates, kept as tuples of plain values (the garbage collector then
has nothing to walk in an index of any size) and evaluated with the reference semantics
(:func:`messagebox.predicates.evaluate.predicate_holds`; :func:`compile_predicate` makes
the same test a closure, for one filter at a time): an absent property satisfies only
``not_exists``, values of different families never meet, numbers compare exactly,
strings by code point. The cost follows the anchors that hold, not the number of
filters.

The same match runs in C where ``predicates/_native.c`` was built at install time (see
:data:`NATIVE`): it walks these very structures, packed per property
(:meth:`_Anchors.packed`), and leaves every comparison to the values themselves, so the
semantics are Python's; this module's matcher is its fallback and its reference (2-3x
slower: 10 against 23 us a message at 10,000 subscriptions on the bench's workload).

A :class:`FilterIndex` is not thread-safe: its owner serialises changes and matches.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from messagebox.predicates.model import Filter, Op, Predicate
from messagebox.predicates.sql import anchor_rank
from messagebox.properties import Family, Value, family

try:  # the compiled matcher, built at install time where a C compiler is found
    from messagebox.predicates import _native
except ImportError:  # pragma: no cover (an install without a compiler)
    _native = None  # type: ignore[assignment]

BUILT = _native is not None
"""Whether the compiled matcher was built at install time."""

NATIVE = BUILT and os.environ.get("MESSAGEBOX_NATIVE", "1") != "0"
"""Whether indexes match with the compiled matcher by default (``MESSAGEBOX_NATIVE=0``
turns it off: the pure-Python matcher gives the same results, slower)."""

K = TypeVar("K", bound=Hashable)

Check = Callable[[Mapping[str, Value]], bool]

_FAMILY: dict[type, int] = {  # plain ints: an enum member is tracked by the collector
    str: int(Family.STR),
    int: int(Family.NUM),
    float: int(Family.NUM),
    bool: int(Family.BOOL),
    datetime: int(Family.DATETIME),
}
_MISSING = object()


def _family(value: Value) -> int:
    fam = _FAMILY.get(type(value))
    return int(family(value)) if fam is None else fam


def _key(value: Value) -> Hashable:
    """A hash key that equals another value's key exactly when the reference evaluator
    calls them equal: ``True == 1`` in Python, but a bool and a number never meet."""
    return ("bool", value) if type(value) is bool else value


def _anchor(group: tuple[Predicate, ...]) -> Predicate | None:
    """The group's most selective predicate, as every router picks it (None for a group
    of only ``not_exists``)."""
    best: tuple[int, int] | None = None
    found: Predicate | None = None
    for i, pred in enumerate(group):
        rank = anchor_rank(pred)
        if rank is not None and (best is None or (rank, i) < best):
            best, found = (rank, i), pred
    return found


_GT, _GE, _LT, _LE, _NE, _MEMBER, _EXISTS, _NOT_EXISTS, _MASK, _PREFIX = range(10)
_COMPARE_CODE: dict[Op, int] = {Op.GT: _GT, Op.GE: _GE, Op.LT: _LT, Op.LE: _LE, Op.NE: _NE}

if _native is not None:  # what the compiled matcher takes from here
    _native.setup(
        _FAMILY,
        _family,
        _key(True),
        _key(False),
        (_GT, _GE, _LT, _LE, _NE, _MEMBER, _EXISTS, _NOT_EXISTS, _MASK, _PREFIX),
    )

CheckData = tuple[Any, ...]
"""One predicate as plain values, ``(code, property, operand...)``, evaluated by
:func:`_holds`: unlike a closure, a tuple of atoms is not tracked by the garbage
collector, so a large index costs a full collection nothing (at 100,000 subscriptions
closures made some 700,000 objects a collection walked, 1 s and more)."""


def _check_data(pred: Predicate) -> CheckData:
    name, op, value = pred.property, pred.op, pred.value
    if op is Op.NOT_EXISTS:
        return (_NOT_EXISTS, name)
    if op is Op.EXISTS:
        return (_EXISTS, name)
    if op is Op.IN or op is Op.EQ:  # a dict of atoms is untracked too, unlike a set
        return (_MEMBER, name, dict.fromkeys(_key(v) for v in (value if op is Op.IN else (value,))))
    if op is Op.BITWISE_AND:
        return (_MASK, name, int(value))
    if op is Op.PREFIX:
        return (_PREFIX, name, str(value))
    return (_COMPARE_CODE[op], name, _family(value), value)


def _holds(check: CheckData, props: Mapping[str, Value]) -> bool:
    """:func:`compile_predicate`'s semantics, for a predicate as data. Comparisons, the
    most frequent checks, are tested first and without a call."""
    code = check[0]
    v: Any = props.get(check[1], _MISSING)
    if v is _MISSING:
        return code == _NOT_EXISTS  # type: ignore[no-any-return]
    if code <= _NE:
        fam = _FAMILY.get(type(v))
        if (_family(v) if fam is None else fam) != check[2]:
            return False  # values of different families never meet
        bound = check[3]
        if code == _GT:
            return v > bound  # type: ignore[no-any-return]
        if code == _GE:
            return v >= bound  # type: ignore[no-any-return]
        if code == _LT:
            return v < bound  # type: ignore[no-any-return]
        if code == _LE:
            return v <= bound  # type: ignore[no-any-return]
        return v != bound  # type: ignore[no-any-return]
    if code == _MEMBER:
        return (("bool", v) if type(v) is bool else v) in check[2]  # as _key(v)
    if code == _EXISTS:
        return True
    if code == _MASK:
        return type(v) is int and v & check[2] != 0
    if code == _PREFIX:
        return type(v) is str and v.startswith(check[2])
    return False  # _NOT_EXISTS of a present property


def compile_predicate(pred: Predicate) -> Check:
    """A closure with the reference semantics of one predicate over normalised
    properties (for one filter at a time; the index keeps the data form)."""
    data = _check_data(pred)
    return lambda props: _holds(data, props)


_Group = tuple[Any, "tuple[str, str, Any] | None", "tuple[CheckData, ...]"]
"""A filed group: its filter's key, its anchor as (property, operator, value) or None,
and its other predicates. A plain tuple, not a named one: the collector untracks only
exact tuples of untracked values."""


Bucket = dict[int, _Group]
"""Groups by id: a group is filed under one anchor value, so a message finds it at most
once and matching needs no set of candidates (removal stays O(1))."""


@dataclass
class _Bounds:
    """The range anchors of one (property, family, operator), sorted by bound on demand."""

    by_group: dict[int, tuple[Value, _Group]] = field(default_factory=dict)
    values: list[Value] = field(default_factory=list)
    groups: list[_Group] = field(default_factory=list)
    dirty: bool = False

    def sort(self) -> None:
        pairs = sorted(self.by_group.values(), key=lambda item: item[0])
        self.values = [v for v, _ in pairs]
        self.groups = [g for _, g in pairs]
        self.dirty = False


def _file(table: dict[Any, Bucket], key: Any, gid: int, group: _Group | None) -> None:
    """Put ``group`` in ``table[key]`` under ``gid``, or with None take it out."""
    if group is not None:
        table.setdefault(key, {})[gid] = group
        return
    members = table.get(key)
    if members is not None:
        members.pop(gid, None)
        if not members:
            del table[key]


Packed = tuple[Any, ...]
"""One property's anchors for the compiled matcher: (equal, present, prefixes, prefix
lengths, (mask, bucket) pairs, (family, code, sorted bounds, their groups) per range,
the ``!=`` entries)."""


@dataclass
class _Anchors:
    """Every anchor on one property."""

    equal: dict[Hashable, Bucket] = field(default_factory=dict)
    prefixes: dict[str, Bucket] = field(default_factory=dict)
    prefix_lengths: list[int] = field(default_factory=list)
    bounds: dict[tuple[int, Op], _Bounds] = field(default_factory=dict)
    masks: dict[int, Bucket] = field(default_factory=dict)
    present: Bucket = field(default_factory=dict)
    not_equal: dict[int, tuple[int, Value, _Group]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(
            self.equal
            or self.prefixes
            or any(b.by_group for b in self.bounds.values())
            or self.masks
            or self.present
            or self.not_equal
        )

    def file(self, op: Op, value: Any, gid: int, group: _Group | None) -> None:
        """File ``group`` as ``gid`` under its anchor ``op value`` (with None, remove
        it)."""
        if op is Op.EQ or op is Op.IN:
            for v in value if op is Op.IN else (value,):
                _file(self.equal, _key(v), gid, group)
        elif op is Op.PREFIX:
            _file(self.prefixes, value, gid, group)
            self.prefix_lengths = sorted({len(p) for p in self.prefixes})
        elif op in (Op.GT, Op.GE, Op.LT, Op.LE):
            bounds = self.bounds.setdefault((_family(value), op), _Bounds())
            if group is not None:
                bounds.by_group[gid] = (value, group)
            else:
                bounds.by_group.pop(gid, None)
            bounds.dirty = True
        elif op is Op.BITWISE_AND:
            _file(self.masks, int(value), gid, group)
        elif op is Op.EXISTS:
            if group is not None:
                self.present[gid] = group
            else:
                self.present.pop(gid, None)
        elif op is Op.NE:
            if group is not None:
                self.not_equal[gid] = (_family(value), value, group)
            else:
                self.not_equal.pop(gid, None)

    def packed(self) -> Packed:
        """These anchors as the compiled matcher reads them: the live buckets, the
        bounds sorted."""
        ranges = []
        for (fam, op), bounds in self.bounds.items():
            if bounds.by_group:
                if bounds.dirty:
                    bounds.sort()
                ranges.append((fam, _COMPARE_CODE[op], bounds.values, bounds.groups))
        return (
            self.equal,
            self.present,
            self.prefixes,
            tuple(self.prefix_lengths),
            tuple(self.masks.items()),
            tuple(ranges),
            tuple(self.not_equal.values()),
        )

    def holding(self, v: Value, out: list[_Group]) -> None:
        """Append to ``out`` every group whose anchor on this property holds for ``v``."""
        found = self.equal.get(("bool", v) if type(v) is bool else v)  # _key(v)
        if found:
            out.extend(found.values())
        if self.present:
            out.extend(self.present.values())
        if self.prefixes and type(v) is str:
            n = len(v)
            for length in self.prefix_lengths:
                if length > n:
                    break
                found = self.prefixes.get(v[:length])
                if found:
                    out.extend(found.values())
        if self.masks and type(v) is int:
            for mask, masked in self.masks.items():
                if v & mask:
                    out.extend(masked.values())
        if self.bounds:
            fam = _family(v)
            for (bound_fam, op), bounds in self.bounds.items():
                if bound_fam != fam or not bounds.by_group:
                    continue
                if bounds.dirty:
                    bounds.sort()
                values, groups = bounds.values, bounds.groups
                if op is Op.GT:  # bound < v
                    out.extend(groups[: bisect_left(values, v)])
                elif op is Op.GE:  # bound <= v
                    out.extend(groups[: bisect_right(values, v)])
                elif op is Op.LT:  # bound > v
                    out.extend(groups[bisect_right(values, v) :])
                else:  # bound >= v
                    out.extend(groups[bisect_left(values, v) :])
        if self.not_equal:
            fam = _family(v)
            for bound_fam, value, group in self.not_equal.values():
                if bound_fam == fam and v != value:
                    out.append(group)


class FilterIndex(Generic[K]):
    """Many filters, each under a key, matched against messages together.

    ``native``: match with the compiled matcher (the default where it was built, see
    :data:`NATIVE`) or in pure Python; the results are the same."""

    def __init__(self, *, native: bool | None = None) -> None:
        if native and _native is None:
            raise RuntimeError(
                "the compiled matcher (messagebox.predicates._native) was not built: "
                "reinstall with a C compiler and Python's headers"
            )
        self.native = NATIVE if native is None else native
        self._packed: dict[str, Packed] | None = None
        """Per property, its anchors packed for the compiled matcher (None: pack again)."""
        self._groups: dict[int, _Group] = {}
        self._by_key: dict[K, tuple[int, ...]] = {}
        self._anchors: dict[str, _Anchors] = {}
        self._unanchored: Bucket = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def add(self, key: K, filt: Filter) -> None:
        """Index ``filt`` under ``key`` (replacing what the key held)."""
        self.remove(key)
        self._packed = None
        gids: list[int] = []
        for group in filt.groups:
            anchor = _anchor(group.predicates)
            gid = self._next
            self._next += 1
            checks = tuple(_check_data(p) for p in group.predicates if p is not anchor)
            filed: _Group
            if anchor is None:
                filed = self._groups[gid] = (key, None, checks)
                self._unanchored[gid] = filed
            else:
                value = tuple(anchor.value) if anchor.op is Op.IN else anchor.value
                filed = (key, (anchor.property, anchor.op.value, value), checks)
                self._groups[gid] = filed
                self._anchors.setdefault(anchor.property, _Anchors()).file(
                    anchor.op, value, gid, filed
                )
            gids.append(gid)
        self._by_key[key] = tuple(gids)

    def remove(self, key: K) -> None:
        """Forget the filter under ``key`` (nothing if there is none)."""
        self._packed = None
        for gid in self._by_key.pop(key, ()):
            anchor = self._groups.pop(gid)[1]
            if anchor is None:
                self._unanchored.pop(gid, None)
                continue
            prop, op, value = anchor
            anchors = self._anchors[prop]
            anchors.file(Op(op), value, gid, None)
            if not anchors:
                del self._anchors[prop]

    def update(self, filters: Iterable[tuple[K, Filter]]) -> None:
        for key, filt in filters:
            self.add(key, filt)

    def match(self, properties: Mapping[str, Value]) -> set[K]:
        """The keys of the filters that normalised ``properties`` match."""
        if self.native and type(properties) is dict:
            packed = self._packed
            if packed is None:
                packed = self._packed = {k: a.packed() for k, a in self._anchors.items()}
            return _native.match(packed, self._unanchored, properties)
        candidates = list(self._unanchored.values()) if self._unanchored else []
        anchors = self._anchors
        for name, value in properties.items():
            found = anchors.get(name)
            if found is not None:
                found.holding(value, candidates)
        matched: set[K] = set()
        for key, _anchor, checks in candidates:
            if key in matched:
                continue
            for check in checks:
                if not _holds(check, properties):
                    break
            else:
                matched.add(key)
        return matched
