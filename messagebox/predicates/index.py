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
:data:`NATIVE`). Each bucket of groups (one anchor value, prefix, mask or sorted range;
the ``exists`` and ``!=`` anchors; the unanchored) is compiled into one block of memory,
the groups one after another with their checks inline and typed
(:meth:`_Anchors.packed`); only the buckets a change touched are compiled again, at the
next match. A typed comparison is made only where it is exact (two doubles, two int64s,
an int64 within 2**53 beside a double), every other one by the values themselves, so
the semantics are Python's; this module's matcher is its fallback and its reference
(4-6x slower: 3.1 against 14 us a message at 10,000 subscriptions on the bench's
``orders`` workload, 3.6 against 21 at 100,000).

A :class:`FilterIndex` is not thread-safe: its owner serialises changes and matches.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
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
    if op is Op.IN or op is Op.EQ:
        keys = [_key(v) for v in (value if op is Op.IN else (value,))]
        # one value as itself: a tuple holding a dict stays tracked by the collector
        # (any dict may hold objects it must walk); several in a dict (of atoms)
        return (_MEMBER, name, keys[0] if len(keys) == 1 else dict.fromkeys(keys))
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
        key = ("bool", v) if type(v) is bool else v  # as _key(v)
        members = check[2]
        return key in members if type(members) is dict else key == members
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
    compiled: Any = None
    """The sorted groups compiled for the compiled matcher (None: compile again)."""

    def sort(self) -> None:
        pairs = sorted(self.by_group.values(), key=lambda item: item[0])
        self.values = [v for v, _ in pairs]
        self.groups = [g for _, g in pairs]
        self.dirty = False

    def compile(self) -> Any:
        if self.dirty:
            self.sort()
        if self.compiled is None:
            self.compiled = _native.compile(self.groups, self.values)
        return self.compiled


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
"""One property's anchors for the compiled matcher, each bucket compiled
(``_native.compile``): (equal, present or None, prefixes, prefix lengths, (mask, groups)
pairs, (family, code, groups with their sorted bounds) per range, the ``!=`` groups
(each with its anchor as its first check) or None)."""

_EQUAL, _PREFIXES, _MASKS = range(3)


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
    # the compiled buckets, kept up to date by packed(): only what changed is compiled
    compiled: tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]] = field(
        default_factory=lambda: ({}, {}, {})
    )
    """The equal, prefix and mask buckets compiled, by key."""
    stale: set[tuple[int, Any]] = field(default_factory=set)
    """(table, key) of the buckets changed since they were compiled."""
    stale_present: bool = True
    stale_not_equal: bool = True
    compiled_present: Any = None
    compiled_not_equal: Any = None
    native: bool = False
    """Whether the compiled matcher reads these anchors: else nothing is compiled and
    no change is recorded."""

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
                if self.native:
                    self.stale.add((_EQUAL, _key(v)))
        elif op is Op.PREFIX:
            _file(self.prefixes, value, gid, group)
            self.prefix_lengths = sorted({len(p) for p in self.prefixes})
            if self.native:
                self.stale.add((_PREFIXES, value))
        elif op in (Op.GT, Op.GE, Op.LT, Op.LE):
            bounds = self.bounds.setdefault((_family(value), op), _Bounds())
            if group is not None:
                bounds.by_group[gid] = (value, group)
            else:
                bounds.by_group.pop(gid, None)
            bounds.dirty = True
            bounds.compiled = None
        elif op is Op.BITWISE_AND:
            _file(self.masks, int(value), gid, group)
            if self.native:
                self.stale.add((_MASKS, int(value)))
        elif op is Op.EXISTS:
            if group is not None:
                self.present[gid] = group
            else:
                self.present.pop(gid, None)
            self.stale_present = True
        elif op is Op.NE:
            if group is not None:
                self.not_equal[gid] = (_family(value), value, group)
            else:
                self.not_equal.pop(gid, None)
            self.stale_not_equal = True

    def packed(self, name: str) -> Packed:
        """These anchors, on property ``name``, as the compiled matcher reads them: the
        buckets compiled (again only where they changed), the bounds sorted."""
        tables = (self.equal, self.prefixes, self.masks)
        for table, key in self.stale:
            bucket = tables[table].get(key)
            if bucket:
                self.compiled[table][key] = _native.compile(tuple(bucket.values()))
            else:
                self.compiled[table].pop(key, None)
        self.stale.clear()
        if self.stale_present:
            self.compiled_present = (
                _native.compile(tuple(self.present.values())) if self.present else None
            )
            self.stale_present = False
        if self.stale_not_equal:
            self.compiled_not_equal = (
                _native.compile(
                    [  # the anchor is the group's first check
                        (key, anchor, ((_NE, name, fam, value), *checks))
                        for fam, value, (key, anchor, checks) in self.not_equal.values()
                    ]
                )
                if self.not_equal
                else None
            )
            self.stale_not_equal = False
        ranges = tuple(
            (fam, _COMPARE_CODE[op], bounds.compile())
            for (fam, op), bounds in self.bounds.items()
            if bounds.by_group
        )
        equal, prefixes, masks = self.compiled
        return (
            equal,
            self.compiled_present,
            prefixes,
            tuple(self.prefix_lengths),
            tuple(masks.items()),
            ranges,
            self.compiled_not_equal,
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
        self._native = NATIVE if native is None else native
        self._packed: dict[str, Packed] = {}
        """Per property, its anchors packed for the compiled matcher."""
        self._repack: set[str] = set()
        """The properties whose anchors changed since they were packed."""
        self._compiled_unanchored: Any = None
        self._stale_unanchored = False
        self._groups: dict[int, _Group] = {}
        self._by_key: dict[K, tuple[int, ...]] = {}
        self._anchors: dict[str, _Anchors] = {}
        self._unanchored: Bucket = {}
        self._next = 0

    @property
    def native(self) -> bool:
        """Whether this index matches with the compiled matcher."""
        return self._native

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def add(self, key: K, filt: Filter) -> None:
        """Index ``filt`` under ``key`` (replacing what the key held)."""
        self.remove(key)
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
                self._stale_unanchored = True
            else:
                value = tuple(anchor.value) if anchor.op is Op.IN else anchor.value
                filed = (key, (anchor.property, anchor.op.value, value), checks)
                self._groups[gid] = filed
                self._anchors.setdefault(anchor.property, _Anchors(native=self._native)).file(
                    anchor.op, value, gid, filed
                )
                self._repack.add(anchor.property)
            gids.append(gid)
        self._by_key[key] = tuple(gids)

    def remove(self, key: K) -> None:
        """Forget the filter under ``key`` (nothing if there is none)."""
        for gid in self._by_key.pop(key, ()):
            anchor = self._groups.pop(gid)[1]
            if anchor is None:
                self._unanchored.pop(gid, None)
                self._stale_unanchored = True
                continue
            prop, op, value = anchor
            anchors = self._anchors[prop]
            anchors.file(Op(op), value, gid, None)
            self._repack.add(prop)
            if not anchors:
                del self._anchors[prop]

    def update(self, filters: Iterable[tuple[K, Filter]]) -> None:
        for key, filt in filters:
            self.add(key, filt)

    def match(self, properties: Mapping[str, Value]) -> set[K]:
        """The keys of the filters that normalised ``properties`` match."""
        if self._native and type(properties) is dict:
            return set(self.matching(properties))
        return self._match(properties)

    def matching(self, properties: Mapping[str, Value]) -> list[K]:
        """:meth:`match` as a list (each key once, in no particular order): what the
        compiled matcher makes, with no set to build."""
        if not (self._native and type(properties) is dict):
            return list(self._match(properties))
        if self._repack or self._stale_unanchored:
            self._pack()
        return _native.match(self._packed, self._compiled_unanchored, properties)

    def matching_all(self, batch: Sequence[Mapping[str, Value]]) -> tuple[list[K], list[int]]:
        """:meth:`matching` of each message in turn, in one call: every message's keys,
        sorted, one after another, and how many each message has."""
        if self._native and type(batch) is list and all(type(p) is dict for p in batch):
            if self._repack or self._stale_unanchored:
                self._pack()
            return _native.match_all(self._packed, self._compiled_unanchored, batch)
        flat: list[K] = []
        counts: list[int] = []
        for properties in batch:
            found = sorted(self.matching(properties))  # type: ignore[type-var]
            counts.append(len(found))
            flat.extend(found)
        return flat, counts

    def _pack(self) -> None:
        """Compile what changed since the last match, for the compiled matcher."""
        for name in self._repack:
            anchors = self._anchors.get(name)
            if anchors is None:
                self._packed.pop(name, None)
            else:
                self._packed[name] = anchors.packed(name)
        self._repack.clear()
        if self._stale_unanchored:
            unanchored = tuple(self._unanchored.values())
            self._compiled_unanchored = _native.compile(unanchored) if unanchored else None
            self._stale_unanchored = False

    def _match(self, properties: Mapping[str, Value]) -> set[K]:
        """The pure-Python matcher."""
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
