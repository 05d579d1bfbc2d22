"""The store's subscriptions held in process memory, compiled for routing.

The database stays the source of truth: every subscription change records a routing
version (``mb_routing_change``, see :func:`messagebox.subscriptions.changed`), and a
publish first reads, inside its own transaction, the versions after the one this index
holds, then reloads the subscriptions they name. A publish therefore routes against one
committed set of subscriptions, never a mix, and never one older than its transaction
can see. The matching itself is :class:`messagebox.predicates.index.FilterIndex`; the SQL router
(``Dialect.route``) stays as the other way to route the same rows
(``MessageBox(router="sql")``), and the two are held equal by the routing tests.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from messagebox import schema
from messagebox.dialects import Target
from messagebox.models import State
from messagebox.predicates.index import FilterIndex
from messagebox.predicates.model import Filter
from messagebox.properties import Value

_KEY = "mb_routing_index"
"""``conn.info`` key: the store's :class:`RoutingIndex` (set by ``Store.transaction``)."""

_PREFETCHED = "mb_routing_prefetched"
"""``conn.info`` key: (version asked about, changes after it), read by a prelude."""

_CHANGED = "mb_routing_changed"
"""``conn.info`` key: set when the transaction records a routing version."""

_LOCAL: dict[str, int] = {}
"""Per database only this process opens (DuckDB): how many transactions that changed
routing have committed here, so an index skips its query while nothing changed."""
_LOCAL_GUARD = threading.Lock()

_UNENLISTED = State.UNENLISTED.value


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


def committed_change(database: str) -> None:
    """A transaction that changed routing committed on ``database`` (one-process
    backends: ``Store.transaction`` calls it after the commit)."""
    with _LOCAL_GUARD:
        _LOCAL[database] = _LOCAL.get(database, 0) + 1


def of(conn: sa.Connection) -> RoutingIndex | None:
    """The routing index of the transaction on ``conn``, if it has one."""
    found: RoutingIndex | None = conn.info.get(_KEY)
    return found


class RoutingIndex:
    """One store's enlisted and stopped subscriptions, matched in memory.

    Thread-safe: a batch is matched under a lock (matching is pure Python, so threads
    gain nothing from running it at once)."""

    def __init__(self, local: str | None = None) -> None:
        self._local = local
        """The database key where every change is made in this process (DuckDB): the
        index then asks the database only after such a change committed here."""
        self._local_seen = -1
        self._lock = threading.Lock()
        self._filters: FilterIndex[int] = FilterIndex()
        self._targets: dict[int, Target] = {}
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
        any of them has a correlation. A subscription's :class:`Target` is one shared
        tuple: a batch allocates a list per message, nothing per match."""
        out: list[list[Target]] = []
        correlated = False
        with self._lock:
            self._catch_up(conn)
            match, target = self._filters.match, self._targets.__getitem__
            for props in promoted:
                found = match(props)
                if not found:
                    out.append([])
                    continue
                rows = list(map(target, sorted(found)))
                if not correlated and self._correlated:
                    correlated = any(row.correlation for row in rows)
                out.append(rows)
        return out, correlated

    def _catch_up(self, conn: sa.Connection) -> None:
        """Bring the index to the newest routing version this transaction sees."""
        if self._local is not None:
            seen = _LOCAL.get(self._local, 0)
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
        self._targets = {}
        self._correlated = 0
        for row in conn.execute(_select()):
            self._add(row)
        self._version = version
        self.loads += 1

    def _reload(self, conn: sa.Connection, subs: list[int]) -> None:
        for sub in subs:
            self._filters.remove(sub)
            gone = self._targets.pop(sub, None)
            if gone is not None and gone.correlation:
                self._correlated -= 1
        s = schema.subscription
        for start in range(0, len(subs), 1000):
            for row in conn.execute(_select().where(s.c.id.in_(subs[start : start + 1000]))):
                self._add(row)

    def _add(self, row: Any) -> None:
        if row.state == _UNENLISTED:
            return
        self._filters.add(row.id, Filter.from_stored_json(row.filter))
        if row.correlation:
            self._correlated += 1
        self._targets[row.id] = Target(
            row.id,
            row.host,
            row.priority,
            row.state,
            row.kind,
            row.instance_id,
            bool(row.ordered),
            row.service,
            row.correlation,
        )


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
    )
