"""The store's subscriptions held in process memory, compiled for routing.

The database stays the source of truth: every subscription change records a routing
version (``mb_routing_change``, see :func:`messagebox.storage.subscriptions.changed`), and a
publish first reads, inside its own transaction, the versions after the one this index
holds, then reloads the subscriptions they name. A publish therefore routes against one
committed set of subscriptions, never a mix, and never one older than its transaction
can see. The matching itself is :class:`messagebox.predicates.index.FilterIndex`; the SQL router
(``Dialect.route``) stays as the other way to route the same rows
(``MessageBox(router="sql")``), and the two are held equal by the routing tests.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Mapping, MutableSequence, Sequence
from operator import itemgetter
from sys import intern
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from messagebox.models import QueueState, State
from messagebox.predicates.index import FilterIndex
from messagebox.predicates.model import Filter
from messagebox.properties import Value
from messagebox.storage import schema
from messagebox.storage.dialects import Same, Target

if TYPE_CHECKING:
    from messagebox.storage.database_local import DatabaseLocal

_KEY = "mb_routing_index"
"""``conn.info`` key: the store's :class:`RoutingIndex` (set by ``Store.transaction``)."""

_PREFETCHED = "mb_routing_prefetched"
"""``conn.info`` key: (version asked about, changes after it), read by a prelude."""

_CHANGED = "mb_routing_changed"
"""``conn.info`` key: set when the transaction records a routing version."""

_UNENLISTED = State.UNENLISTED.value
_STOPPED = State.STOPPED.value
_HELD = QueueState.HELD.value
_READY = QueueState.READY.value

_COMMON: dict[str, Any] = {
    "priority": 0,
    "state": _READY,
    "instance_id": None,
    "ordered": False,
    "ordered_by": None,
}
"""Queue columns whose value is nearly always this one: while no subscription of the
index holds another, a batch's column is that value repeated (:class:`Same`), written
without a value per entry."""

QUEUE_COLUMNS = ("sub", "host", "priority", "state", "instance_id", "ordered")
"""The queue entry's columns a match gives (``state`` the entry's: held for a stopped
subscription, else ready)."""

MATCH_COLUMNS = (*QUEUE_COLUMNS, "ordered_by")
"""A match's columns: the queue's, and the property its entry's key is the value of
(``ordered_by``; None nearly always), from which a publish makes ``order_key``."""


class Matches(NamedTuple):
    """A batch's matches as a publish queues them: how many each message has, and the
    entries' :data:`MATCH_COLUMNS`, message by message, each message's in
    subscription-id order."""

    counts: list[int]
    columns: Mapping[str, Sequence[Any]]

    @classmethod
    def of(cls, per_message: Sequence[Sequence[Target]]) -> Matches:
        """From each message's targets (the SQL router's, or after correlation)."""
        targets = [t for rows in per_message for t in rows]
        if not targets:
            return cls([0] * len(per_message), dict.fromkeys(MATCH_COLUMNS, ()))
        columns = zip(*map(_queued, targets), strict=True)
        return cls(
            [len(rows) for rows in per_message], dict(zip(MATCH_COLUMNS, columns, strict=True))
        )


_CORRELATION = Target._fields.index("correlation")


def _queued(target: Target) -> tuple[Any, ...]:
    """A target's :data:`MATCH_COLUMNS` values."""
    held = target.state == _STOPPED
    return (
        target.sub,
        target.host,
        target.priority,
        _HELD if held else _READY,
        target.instance_id,
        target.ordered,
        target.ordered_by,
    )


def begin(conn: sa.Connection, index: RoutingIndex | None) -> None:
    """Make ``index`` the one this transaction routes with (None: the SQL router)."""
    conn.info[_KEY] = index
    conn.info.pop(_PREFETCHED, None)


def prefetched(conn: sa.Connection, asked: int | None, changes: list[tuple[int, int]]) -> None:
    """The routing versions after ``asked``, read by this transaction's prelude."""
    if asked is not None:
        conn.info[_PREFETCHED] = (asked, changes)


def mark_changed(conn: sa.Connection) -> None:
    """Note that this transaction records a routing version."""
    conn.info[_CHANGED] = True


def take_changed(conn: sa.Connection) -> bool:
    """Whether the transaction recorded a routing version (and forget it)."""
    return bool(conn.info.pop(_CHANGED, False))


def of(conn: sa.Connection) -> RoutingIndex | None:
    """The routing index of the transaction on ``conn``, if it has one."""
    found: RoutingIndex | None = conn.info.get(_KEY)
    return found


class RoutingIndex:
    """One store's enlisted and stopped subscriptions, matched in memory.

    Each held subscription has a *slot*, the key its filter is indexed under, and its
    queue columns are lists by slot: a batch's entries are gathered from them in C
    (``itemgetter``), not read field by field from a tuple per match (at 100,000
    subscriptions those lie far apart in memory). A subscription keeps its slot while
    the index lives; slots ascend with subscription ids unless a lower id came later.

    Thread-safe: a batch is matched under a lock (matching holds the interpreter lock,
    so threads gain nothing from running it at once)."""

    def __init__(self, local: DatabaseLocal | None = None) -> None:
        self._local = local
        """The database's state in this process where every change is made in this
        process (DuckDB): the index then asks the database only after such a change
        committed here (:attr:`DatabaseLocal.routing_changes`)."""
        self._local_seen = -1
        self._lock = threading.Lock()
        self._filters: FilterIndex[int] = FilterIndex()
        self._slots: dict[int, int] = {}
        """Subscription id -> slot."""
        self._targets: list[tuple[Any, ...] | None] = []
        """By slot: the subscription's target, as a plain tuple (None once it is gone):
        the garbage collector stops tracking a plain tuple of plain values, not a
        Target, and would walk 100,000 of them in every full collection."""
        self._columns: dict[str, MutableSequence[Any]] = _no_columns()
        """By slot: the subscription's queue columns."""
        self._uncommon: dict[str, int] = dict.fromkeys(_COMMON, 0)
        """Per column of :data:`_COMMON`, how many slots hold another value (a gone
        subscription's slot still counts until it is reused)."""
        self._free: list[int] = []
        """Slots of subscriptions gone, for new ones."""
        self._shared: dict[int, int] = {}
        """Each priority once, as the targets' (and so the columns') one object."""
        self._ascending = True
        """Whether slots ascend with subscription ids."""
        self._correlated = 0
        """How many held subscriptions have a correlation."""
        self._version: int | None = None
        self.loads = 0
        """How many times the whole set was loaded (once, unless versions were pruned)."""

    @property
    def version(self) -> int | None:
        """The routing version the index holds (None before its first use)."""
        return self._version

    def route(
        self, conn: sa.Connection, promoted: Sequence[Mapping[str, Value]]
    ) -> tuple[list[list[Target]], bool]:
        """The matches of each message of a batch, in subscription-id order, and whether
        any of them has a correlation (the SQL router's form: a :class:`Target` per
        match; a publish takes :meth:`route_columns`)."""
        with self._lock:
            flat, counts = self._match(conn, promoted)
            return self._per_message(flat, counts), self._any_correlated(flat)

    def route_columns(
        self, conn: sa.Connection, promoted: Sequence[Mapping[str, Value]]
    ) -> Matches | list[list[Target]]:
        """A batch's matches as columns; as each message's targets (as :meth:`route`)
        when one of them has a correlation, which the router resolves per match."""
        with self._lock:
            flat, counts = self._match(conn, promoted)
            if self._any_correlated(flat):
                return self._per_message(flat, counts)
            if not flat:
                return Matches(counts, dict.fromkeys(MATCH_COLUMNS, ()))
            n = len(flat)
            take = (lambda v: (v[flat[0]],)) if n == 1 else itemgetter(*flat)
            uncommon = self._uncommon
            columns: dict[str, Sequence[Any]] = {
                k: take(v) if uncommon.get(k, 1) else Same(_COMMON[k], n)
                for k, v in self._columns.items()
            }
            return Matches(counts, columns)

    def _match(
        self, conn: sa.Connection, promoted: Sequence[Mapping[str, Value]]
    ) -> tuple[list[int], list[int]]:
        """Every match's slot, message by message, and how many each message has."""
        self._catch_up(conn)
        if self._ascending:  # slots in id order: matches sorted by slot are in id order
            return self._filters.matching_all(promoted)
        match = self._filters.matching
        order = self._columns["sub"].__getitem__
        flat: list[int] = []
        counts: list[int] = []
        for props in promoted:
            found = match(props)
            counts.append(len(found))
            if found:
                flat.extend(sorted(found, key=order))
        return flat, counts

    def _per_message(self, flat: list[int], counts: list[int]) -> list[list[Target]]:
        targets = self._targets.__getitem__
        make = Target._make
        out: list[list[Target]] = []
        start = 0
        for n in counts:
            out.append([make(targets(slot)) for slot in flat[start : start + n]])  # type: ignore[arg-type]
            start += n
        return out

    def _any_correlated(self, flat: list[int]) -> bool:
        if not self._correlated:
            return False
        targets = self._targets
        return any(targets[slot][_CORRELATION] for slot in flat)  # type: ignore[index]

    def _catch_up(self, conn: sa.Connection) -> None:
        """Bring the index to the newest routing version this transaction sees."""
        if self._local is not None:
            seen = self._local.routing_changes
            if seen == self._local_seen and self._version is not None:
                return  # no change committed since the last look
            self._local_seen = seen  # read before the query: a later change looks again
        if self._version is None:
            self._load_all(conn)
            return
        changes: Sequence[tuple[int, int]]
        early = conn.info.pop(_PREFETCHED, None)
        if early is not None and early[0] == self._version:
            changes = early[1]
        else:
            rc = schema.routing_change
            changes = [
                (int(v), int(sub))
                for v, sub in conn.execute(
                    sa.select(rc.c.version, rc.c.sub)
                    .where(rc.c.version > self._version)
                    .order_by(rc.c.version)
                )
            ]
        if not changes:
            return
        if changes[0][0] != self._version + 1:  # versions were pruned: start over
            self._load_all(conn)
            return
        self._reload(conn, sorted({sub for _, sub in changes}))
        self._version = changes[-1][0]

    def _load_all(self, conn: sa.Connection) -> None:
        rc = schema.routing_change
        # the version first: a change committed after it is applied again next time
        version = int(conn.execute(sa.select(sa.func.max(rc.c.version))).scalar_one() or 0)
        if self._version is not None and version < self._version:
            return  # this transaction sees less than the index already holds
        self._filters = FilterIndex()
        self._slots = {}
        self._targets = []
        self._columns = _no_columns()
        self._uncommon = dict.fromkeys(_COMMON, 0)
        self._free = []
        self._ascending = True
        self._correlated = 0
        for row in conn.execute(_select().order_by(schema.subscription.c.id)):
            self._add(row)
        self._version = version
        self.loads += 1

    def _reload(self, conn: sa.Connection, subs: list[int]) -> None:
        for sub in subs:
            slot = self._slots.get(sub)
            if slot is None:
                continue
            self._filters.remove(slot)
            gone = self._targets[slot]
            self._targets[slot] = None
            if gone is not None and gone[_CORRELATION]:
                self._correlated -= 1
        s = schema.subscription
        for start in range(0, len(subs), 1000):
            for row in conn.execute(_select().where(s.c.id.in_(subs[start : start + 1000]))):
                self._add(row)  # a subscription still held keeps its slot
        for sub in subs:
            slot = self._slots.get(sub)
            if slot is not None and self._targets[slot] is None:  # gone: free its slot
                del self._slots[sub]
                self._free.append(slot)

    def _add(self, row: Any) -> None:
        if row.state == _UNENLISTED:
            return
        filt = Filter.from_stored_json(row.filter)
        target = Target(
            row.id,
            # one object per host and priority, not one per subscription: a batch's
            # columns touch (count, reference) each entry's; at 100,000 subscriptions
            # objects of their own cost a cache miss each, 8 us a message
            intern(row.host),
            self._shared.setdefault(row.priority, row.priority),
            row.state,
            row.kind,
            row.instance_id,
            bool(row.ordered),
            row.service,
            row.correlation,
            row.ordered_by,
        )
        slot = self._slots.get(row.id)
        if slot is None:  # a new subscription: a gone one's slot, or a new one
            if self._free:
                slot = self._free.pop()
                self._ascending = False
            else:
                slot = len(self._targets)
                if self._targets and row.id < self._columns["sub"][-1]:
                    self._ascending = False
                self._targets.append(None)
                for name, column in self._columns.items():
                    column.append(_COMMON.get(name, 0))  # a placeholder, set below
            self._slots[row.id] = slot
        self._targets[slot] = tuple(target)
        for name, value in zip(MATCH_COLUMNS, _queued(target), strict=True):
            column = self._columns[name]
            if name in _COMMON:
                common = _COMMON[name]
                self._uncommon[name] += (value != common) - (column[slot] != common)
            column[slot] = value
        self._filters.add(slot, filt)
        if row.correlation:
            self._correlated += 1


def _no_columns() -> dict[str, MutableSequence[Any]]:
    """Empty queue columns by slot. Ids are kept as machine integers: a batch's are
    made anew, side by side, when gathered, instead of read from int objects spread
    over the whole index (at 100,000 subscriptions, a cache miss each)."""
    columns: dict[str, MutableSequence[Any]] = {name: [] for name in MATCH_COLUMNS}
    columns["sub"] = array("q")
    return columns


def _select() -> sa.Select[Any]:
    s = schema.subscription
    return sa.select(
        s.c.id,
        s.c.filter,
        s.c.host,
        s.c.priority,
        s.c.state,
        s.c.kind,
        s.c.instance_id,
        s.c.ordered,
        s.c.service,
        s.c.correlation,
        s.c.ordered_by,
    )
