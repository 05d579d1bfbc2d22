"""The interface every backend implements, and the types routing exchanges with it
(see :mod:`messagebox.storage.dialects`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from threading import Event
from typing import Any, ClassVar, NamedTuple, TypeVar, overload

import sqlalchemy as sa

from messagebox import sql
from messagebox.errors import BackendUnavailable, MessageBoxError, StorageError, ValidationError
from messagebox.storage import arrays, capabilities, notify
from messagebox.storage.capabilities import Capabilities
from messagebox.storage.fence import Fence

T = TypeVar("T")


class _Column(Sequence[T]):
    """A column for :meth:`Dialect.insert` in a compact form, read as a sequence."""

    __slots__ = ()

    def _at(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._at(i)


class Same(_Column[T]):
    """A column of one value repeated ``n`` times: a dialect may write it without a
    value per row (DuckDB repeats one Arrow scalar)."""

    __slots__ = ("n", "value")

    def __init__(self, value: T, n: int) -> None:
        self.value = value
        self.n = n

    def __len__(self) -> int:
        return self.n

    def _at(self, i: int) -> T:
        return self.value

    def __iter__(self) -> Iterator[T]:
        return repeat(self.value, self.n)


class Indexed(_Column[T]):
    """A column given as its distinct ``values`` and, per row, the position of the row's
    value in them (Arrow's dictionary form): a message's id repeats over its queue
    entries, and a dialect may convert each distinct value once (DuckDB takes the rows
    from one small Arrow array)."""

    __slots__ = ("positions", "values")

    def __init__(self, values: Sequence[T], positions: Sequence[int]) -> None:
        self.values = values
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    def _at(self, i: int) -> T:
        return self.values[self.positions[i]]

    def __iter__(self) -> Iterator[T]:
        return map(self.values.__getitem__, self.positions)


class Uuids(_Column[T]):
    """A column of ids (UUIDs) written to several tables of one publish, converted for
    the database once: a dialect keeps its converted form in :attr:`converted`. On
    DuckDB, reading a batch's 1,000 id objects (scattered in memory) to make their bytes
    cost ~0.2 ms a column, five times a publish; the insert's own work was less."""

    __slots__ = ("converted", "values")

    def __init__(self, values: Sequence[T]) -> None:
        self.values = values
        self.converted: dict[str, Any] = {}
        """The column as a dialect converted it, by dialect name (set by the dialect)."""

    def __len__(self) -> int:
        return len(self.values)

    def _at(self, i: int) -> T:
        return self.values[i]

    def __iter__(self) -> Iterator[T]:
        return iter(self.values)


def distinct(column: Sequence[T]) -> Sequence[T]:
    """The values a column holds, each at least once (a :class:`Same` or
    :class:`Indexed` column's without a pass over its rows)."""
    if isinstance(column, Same):
        return (column.value,)
    if isinstance(column, Indexed):
        return column.values
    return column


@dataclass
class StagedBatch:
    """A batch's promoted properties, one row per (message, property), as columns."""

    n: int
    msg: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    fam: list[int] = field(default_factory=list)
    v_str: list[str | None] = field(default_factory=list)
    hi: list[float | None] = field(default_factory=list)
    lo: list[float | None] = field(default_factory=list)
    v_int: list[int | None] = field(default_factory=list)


class Prelude(NamedTuple):
    """What :meth:`Dialect.prelude` reads."""

    now: datetime
    block: int
    """A sequence value: the block of ids ``block * ID_BLOCK`` and on."""
    changes: list[tuple[int, int]]
    """(version, subscription) of the routing versions after the one asked about."""
    store: str | None = None
    """The id of the store the connection sees (``mb_meta``)."""
    isolation: str = "read committed"
    """The transaction's isolation level."""


class Target(NamedTuple):
    """A subscription a message reaches, with what queueing it needs: a match as the
    router hands it on, one list of them per message. The in-memory routing index shares
    one per subscription between every message it routes there."""

    sub: int
    """The subscription's id."""
    host: str
    priority: int
    state: str
    """The subscription's state (a :class:`~messagebox.models.State` value)."""
    kind: str
    """The subscription's kind (a :class:`~messagebox.models.Kind` value)."""
    instance_id: str | None
    """The subscription's instance, or for an activation subscription with a
    correlation the convoy's, set by the router."""
    ordered: bool
    service: str
    correlation: str | None
    """The subscription's correlation: its property names as JSON, or None."""
    ordered_by: str | None = None
    """The property whose value orders the subscription's entries per key, or None."""


class RouteRow(NamedTuple):
    """A match of the routing query: a message of the batch and a subscription it reaches
    (the fields of :class:`Target` after ``msg``). A tuple in the query's column order (a
    dialect makes them from driver rows with :func:`route_rows`)."""

    msg: int
    """The message's number in the batch."""
    sub: int
    host: str
    priority: int
    state: str
    kind: str
    instance_id: str | None
    ordered: bool
    service: str
    correlation: str | None
    ordered_by: str | None


def route_rows(rows: Iterable[Iterable[Any]]) -> list[RouteRow]:
    """The routing query's driver rows as :class:`RouteRow`, in one pass: what
    ``RouteRow._make`` does, without its per-row method call and length check."""
    new = tuple.__new__
    return [new(RouteRow, row) for row in rows]


class Dialect:
    """What a backend must provide."""

    name: ClassVar[str]
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    """The driver's own exceptions (not wrapped by SQLAlchemy), translated by the store."""
    supports_skip_locked: ClassVar[bool] = False
    has_row_locks: ClassVar[bool] = False
    """True when ``FOR UPDATE``/``FOR SHARE`` lock rows (else the store's in-process
    write lock stands in for them)."""
    supports_notify: ClassVar[bool] = False
    one_process: ClassVar[bool] = False
    """True when only one OS process may open the database (host instances are threads):
    the transactions that must not interleave, and those that route or change
    subscriptions, are then serialised in this process, by the write lock and routing
    fence of :class:`messagebox.storage.database_local.DatabaseLocal`."""
    claims_mixed: ClassVar[bool] = False
    """True when the dialect claims instance heads and other entries in one statement
    (``claim_mixed``)."""
    claims_keyed_with_plain: ClassVar[bool] = False
    """True when the dialect claims keyed runs and plain entries in one statement
    (:meth:`lease_keyed` with ``plain``)."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    """What code holding only a connection may ask (:mod:`messagebox.storage.capabilities`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        capabilities.register(cls.name, cls.capabilities)

    def __init__(self) -> None:
        route = sql.load(self.name, "route")
        route = route.replace("{str_holds}", sql.load(self.name, "str_holds"))
        route = route.replace("{num_holds}", sql.load(self.name, "num_holds"))
        self.route_sql = "WITH " + sql.load(self.name, "staged") + ",\n" + route
        self.claim_sql = sql.load(self.name, "claim")
        self.read_messages_sql = sql.load(self.name, "read_messages")
        self.load_instances_sql = sql.load(self.name, "load_instances")
        self.find_convoys_sql = sql.load(self.name, "find_convoys")
        self.create_convoys_sql = sql.load(self.name, "create_convoys")
        self.claim_ordered_sql = sql.load(self.name, "claim_ordered")
        self.claim_mixed_sql: str | None = None
        """``claim`` and ``claim_instance`` in one statement, where a dialect has it
        (then it has no ``claim_instance`` of its own)."""
        self.claim_instance_sql = ""
        if self.claims_mixed:
            self.claim_mixed_sql = sql.load(self.name, "claim_mixed")
        else:
            self.claim_instance_sql = sql.load(self.name, "claim_instance")
        self.claim_keyed_sql = sql.load(self.name, "claim_keyed")
        """The runs of free keys of subscriptions ordered by a property; each row has
        the entry's key after the columns of the other claims."""
        self.complete_claim_sql: str | None = None
        """Completions and a plain ``claim`` in one statement, where a dialect has it."""
        self.complete_claim_keyed_sql: str | None = None
        """``complete_claim`` that claims keyed runs first, where a dialect has it."""
        with suppress(KeyError):
            self.complete_claim_sql = sql.load(self.name, "complete_claim")
            self.complete_claim_keyed_sql = sql.load(self.name, "complete_claim_keyed")

    @classmethod
    def check_url(cls, url: sa.URL) -> None:
        """Refuse a URL this backend would misread (ValidationError, saying how to write
        it); before anything is opened."""

    def create_engine(self, url: sa.URL) -> sa.Engine:
        raise NotImplementedError

    def database_key(self, url: sa.URL) -> str:
        """What names this database within the process (the URL, without a password)."""
        return url.render_as_string(hide_password=True)

    def private_database(self, url: sa.URL) -> bool:
        """Whether every open of ``url`` makes a database of its own (DuckDB's
        ``:memory:``): two stores of it share nothing in the process."""
        return False

    def same_database(self, url: sa.URL, other: sa.URL) -> bool:
        """Whether two URLs name one database (the same :meth:`database_key`)."""
        return self.database_key(url) == self.database_key(other)

    def database_exists(self, url: sa.URL) -> bool:
        """Whether the database itself exists, checked without creating it (a DuckDB
        file); a server's database is taken to exist (connecting tells)."""
        return True

    def create_schema(self, conn: sa.Connection, metadata: sa.MetaData) -> None:
        raise NotImplementedError

    def route(self, conn: sa.Connection, batch: StagedBatch) -> list[RouteRow]:
        """Run the set-based routing query over a staged batch."""
        raise NotImplementedError

    def insert(
        self, conn: sa.Connection, table: sa.Table, columns: Mapping[str, Sequence[Any]]
    ) -> None:
        """Bulk-insert rows given as equal-length columns."""
        raise NotImplementedError

    def fetch(self, conn: sa.Connection, statement: str, params: Mapping[str, Any]) -> list[Any]:
        """The rows of a hot statement in the dialect's own SQL (tuples by position)."""
        return list(conn.exec_driver_sql(statement, params).fetchall())

    def fetch_messages(
        self, conn: sa.Connection, ids: Sequence[Any], share: int | None
    ) -> list[Any]:
        """The rows of ``read_messages`` (see :func:`messagebox.storage.spool.read_messages`) for
        these message ids, each part's bytes only within ``share``."""
        return self.fetch(conn, self.read_messages_sql, {"ids": list(ids), "share": share})

    def lease(self, conn: sa.Connection, statement: str, params: Mapping[str, Any]) -> list[Any]:
        """Run a claim statement (``claim``, ``claim_mixed``, ``claim_ordered``): the
        rows of the entries it leased, as they are once leased."""
        return self.fetch(conn, statement, params)

    def lease_keyed(self, conn: sa.Connection, params: Mapping[str, Any]) -> list[Any]:
        """Run ``claim_keyed`` (``per_key`` among the parameters; ``plain``, where
        :attr:`claims_keyed_with_plain`): the rows of the entries it leased, each with
        its key last (None for a plain entry)."""
        return self.lease(conn, self.claim_keyed_sql, params)

    def lease_run(self, conn: sa.Connection, params: Mapping[str, Any]) -> list[Any]:
        """Run ``claim_ordered``: the rows of the ordered run it leased."""
        return self.lease(conn, self.claim_ordered_sql, params)

    def prelude(self, conn: sa.Connection, version: int | None) -> Prelude | None:
        """What a publish reads before it routes, in one round trip where that saves any
        (None: the dialect reads each when needed)."""
        return None

    def insert_many(
        self,
        conn: sa.Connection,
        writes: Sequence[tuple[sa.Table, Mapping[str, Sequence[Any]]]],
        *,
        wake: Sequence[str] = (),
    ) -> None:
        """Bulk-insert into several tables, in order (a dialect may use one statement),
        then :meth:`notify` the hosts ``wake`` (a dialect may do it in that statement)."""
        for table, columns in writes:
            if len(next(iter(columns.values()), ())):
                self.insert(conn, table, columns)
        self.notify(conn, wake)

    def find_convoys(self, conn: sa.Connection, pairs: Sequence[tuple[str, str]]) -> list[Any]:
        """The convoys of these (service, key) pairs that exist: rows of (service, key,
        instance id)."""
        return self.fetch(
            conn,
            self.find_convoys_sql,
            {
                "services": arrays.array_param(conn, [s for s, _ in pairs]),
                "keys": arrays.array_param(conn, [k for _, k in pairs]),
            },
        )

    def create_convoys(
        self,
        conn: sa.Connection,
        pairs: Sequence[tuple[str, str]],
        instance_ids: Sequence[str],
        now: datetime,
    ) -> int:
        """Make a convoy for each (service, key) pair that has none yet, with the
        instance id in the same place of ``instance_ids``; returns how many it made. A
        pair a concurrent transaction makes meanwhile is skipped once that commits, or
        raises :class:`~messagebox.errors.Conflict` where the dialect cannot wait for it."""
        params = {
            "services": arrays.array_param(conn, [s for s, _ in pairs]),
            "keys": arrays.array_param(conn, [k for _, k in pairs]),
            "ids": arrays.array_param(conn, list(instance_ids)),
            "now": now,
        }
        return int(conn.exec_driver_sql(self.create_convoys_sql, params).rowcount)

    def warnings(self, conn: sa.Connection) -> list[str]:
        """What about the server would hurt a host instance (read when one starts)."""
        return []

    def lock_subscriptions(self, conn: sa.Connection) -> None:
        """Serialise subscription changes across processes for the rest of the transaction."""

    def lock_schema(self, conn: sa.Connection) -> None:
        """Serialise schema creation and upgrades across processes for the rest of the
        transaction."""

    def adopt(self, external: object) -> AbstractContextManager[sa.Connection]:
        """A connection the caller owns, in its open transaction, as a SQLAlchemy
        connection to run this package's statements on (``publish(connection=)``);
        :class:`ValidationError` where the dialect cannot take it."""
        raise ValidationError(
            f"connection=: a {self.name} store takes only the connections of its own "
            "box.transaction() (one process holds the file: publish in that transaction)"
        )

    def lock_routing(self, conn: sa.Connection, fence: Fence) -> None:
        """Take the routing fence as the transaction's first statement, where it is the
        database's (:mod:`messagebox.storage.fence`)."""

    def claim_params(self, host: str, owner: str, n: int, lease_seconds: float) -> dict[str, Any]:
        """Parameters of the ``claim`` statements."""
        raise NotImplementedError

    def now_plus(self, seconds: float | sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """The database clock plus ``seconds`` (negative for the past)."""
        raise NotImplementedError

    def notify(self, conn: sa.Connection, hosts: Sequence[str]) -> None:
        """Wake the idle instances of these hosts when the transaction commits: this
        process's (the store signals them after the commit) and, where the dialect can,
        other processes' (:meth:`notify_others`)."""
        if hosts:
            notify.after_commit(conn, hosts)
            self.notify_others(conn, hosts)

    def notify_others(self, conn: sa.Connection, hosts: Sequence[str]) -> None:
        """Wake other processes' idle instances of these hosts when the transaction commits."""

    def listen(self, url: sa.URL, host: str, wake: Callable[[], None], stop: Event) -> None:
        """Call ``wake`` on each wake-up of ``host`` from another process until ``stop``
        is set (only where :attr:`supports_notify`)."""
        raise NotImplementedError

    def try_lock_cleanup(self, conn: sa.Connection) -> bool:
        """Take the cleanup lock for this transaction, or say another cleaner holds it."""
        return True

    def translate(self, exc: BaseException, statement: str | None = None) -> MessageBoxError:
        """A driver error as a messagebox error (the caller chains the original)."""
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return BackendUnavailable(f"{self.name}: connection lost: {exc.orig}")
        text = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return StorageError(f"{self.name}: {text}", statement=statement)
