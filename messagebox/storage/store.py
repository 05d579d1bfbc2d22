"""The store: opens a database from a URL, creates the schema and runs transactions.

It executes statements and nothing else; every query belongs to the modules that own a
concept (``subscriptions``, ``router``, ``spool``). Driver errors are translated here,
at the boundary, with the original chained.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

from messagebox import defaults
from messagebox.errors import (
    BackendUnavailable,
    MessageBoxError,
    NoSchema,
    StorageError,
    ValidationError,
)
from messagebox.storage import (
    database_local,
    expiry,
    handover,
    ids,
    notify,
    outage,
    recent,
    rollup,
    routing_index,
    schema,
    sharing,
    store_clock,
    tracking,
    upgrades,
)
from messagebox.storage.dialects import Dialect, dialect_for, parse_url
from messagebox.storage.fence import Fence

log = logging.getLogger("messagebox.store")

DEFAULT_URL = defaults.DEFAULT_URL

ROUTERS = ("index", "sql")
"""How a publish finds its subscriptions: ``index``, the in-memory routing index (the
default), or ``sql``, the set-based routing statement in the database."""

STORE_ID = "store_id"
"""``mb_meta``'s key of the store's id."""
_OWNER = "mb_owner"
"""``conn.info`` key: the store whose ``box.transaction()`` the connection is."""

URL = sa.URL
StoreURL = str | sa.URL
"""Where a store is: a URL string (``duckdb:///path``, ``postgresql://…``) or a parsed URL."""


DRIVER_ERRORS: tuple[type[BaseException], ...] = (sa.exc.SQLAlchemyError,)
"""What a failing statement raises: SQLAlchemy's errors, and the driver errors of every
dialect a store of this process uses (added as each opens; a DuckDB store imports no
PostgreSQL driver)."""


def _driver_errors_of(dialect: Dialect) -> None:
    global DRIVER_ERRORS
    missing = tuple(e for e in dialect.driver_errors if e not in DRIVER_ERRORS)
    if missing:
        DRIVER_ERRORS = (*DRIVER_ERRORS, *missing)


class Store:
    """One database, opened from a URL; the schema is created on first open.

    With ``create=False`` nothing is created or upgraded: a database without this
    schema version (or a DuckDB file that does not exist) is refused with
    :class:`~messagebox.errors.NoSchema`.
    """

    def __init__(
        self, url: str | sa.URL | None = None, *, create: bool = True, router: str = "index"
    ) -> None:
        if router not in ROUTERS:
            raise ValidationError(f"router {router!r} is not one of {', '.join(ROUTERS)}")
        self.url = parse_url(url or DEFAULT_URL)
        self.dialect: Dialect = dialect_for(self.url)
        _driver_errors_of(self.dialect)
        shown = self.url.render_as_string(hide_password=True)
        if not create and not self.dialect.database_exists(self.url):
            raise NoSchema(f"no database at {shown}")
        self.engine = self.dialect.create_engine(self.url)
        self.tally = rollup.Tally()
        """This process's per-minute counts, written every few seconds."""
        self.count_hooks: list[Callable[[Any], None]] = []
        """Called after each commit that tracked events, with their counts (the
        metrics subscribe here: the store does not call up into them)."""
        self.tracking = tracking.SettingsCache()
        """This process's view of the store's tracking settings (re-read every few s)."""
        self.host_ttls = expiry.HostTtls()
        """The hosts' ``message_ttl_seconds``, as publishes read them."""
        self.key = self.dialect.database_key(self.url)
        """Names this database within the process."""
        one_process = self.dialect.one_process
        self._released = False
        self.local = database_local.opened(
            self.key, one_process=one_process, private=self.dialect.private_database(self.url)
        )
        """What this process keeps about the database, shared with its other stores
        (locks, wake-ups, id block, kept messages: :mod:`messagebox.storage.database_local`)."""
        self.groups = sharing.Groups(self.local.serial)
        """This store's transaction groups (:mod:`messagebox.storage.sharing`)."""
        self.routing = (
            routing_index.RoutingIndex(self.local if one_process else None)
            if router == "index"
            else None
        )
        """This process's in-memory routing index (None: publishes route in SQL)."""
        self.id: str | None = None
        """The store's id (``mb_meta``), read when it opens."""
        self.recent = self.local.recent
        """Messages this process published or read lately (:mod:`messagebox.storage.recent`);
        None once the store closes."""
        self.outage: outage.Outage | None = None
        """Whether the store answers, as this process sees it (logged), once open."""
        try:
            self._open(create, shown)
        except BaseException:
            self._release()
            raise
        self.outage = outage.Outage(shown)

    def _open(self, create: bool, shown: str) -> None:
        """Check the schema, or create or upgrade it (see the class)."""
        if self._current():
            return  # no DDL: its table locks would contend with running hosts
        if not create:
            try:
                with self.transaction() as conn:  # unreachable or locked: say so
                    conn.exec_driver_sql("SELECT 1")
            finally:
                self.engine.dispose()
            raise NoSchema(f"{shown} has no messagebox schema of version {schema.SCHEMA_VERSION}")
        try:
            with self.transaction(serial=True) as conn:
                self.dialect.lock_schema(conn)
                conn.execute(CreateTable(schema.meta, if_not_exists=True))
                version = conn.execute(
                    sa.select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
                ).scalar()
                if version is not None and version != schema.SCHEMA_VERSION:
                    self._upgrade(conn, version)  # before the tables: their indexes
                else:  # may name the columns an upgrade adds
                    self.dialect.create_schema(conn, schema.metadata)
                if version is None:
                    conn.execute(
                        schema.meta.insert().values(
                            key="schema_version", value=schema.SCHEMA_VERSION
                        )
                    )
                self.id = _identify(conn)
        except BaseException:
            self.engine.dispose()  # no pooled connection outlives a refused open
            raise

    def _current(self) -> bool:
        """Whether the database already has this schema version (read only; any error
        means "no", and the full open path reports it)."""
        try:
            with self.engine.connect() as conn:
                found = dict(
                    conn.execute(
                        sa.select(schema.meta.c.key, schema.meta.c.value).where(
                            schema.meta.c.key.in_(["schema_version", STORE_ID])
                        )
                    ).all()
                )
                conn.rollback()
        except DRIVER_ERRORS:
            return False
        self.id = found.get(STORE_ID)
        return found.get("schema_version") == schema.SCHEMA_VERSION and self.id is not None

    def _upgrade(self, conn: sa.Connection, version: str) -> None:
        """Upgrade a database of an older schema version in place: every step's
        statements, then the missing tables, indexes and functions."""
        start = version
        while version != schema.SCHEMA_VERSION:
            step = upgrades.UPGRADES.get(version)
            if step is None:
                raise StorageError(
                    f"database schema version {start} is not the {schema.SCHEMA_VERSION} "
                    "this messagebox uses, and cannot be upgraded to it"
                )
            version, statements = step
            for statement in statements:
                conn.exec_driver_sql(statement)
        self.dialect.create_schema(conn, schema.metadata)
        conn.execute(
            schema.meta.update()
            .where(schema.meta.c.key == "schema_version")
            .values(value=schema.SCHEMA_VERSION)
        )

    @contextmanager
    def transaction(
        self,
        *,
        serial: bool = False,
        autocommit: bool = False,
        fence: Fence | None = None,
        owned: bool = False,
    ) -> Iterator[sa.Connection]:
        """One transaction; committed on success, rolled back on any error.

        ``serial=True`` also holds the dialect's in-process lock (DuckDB), for work that
        must not interleave with other such work. ``autocommit=True``: no transaction
        around the work, each statement commits alone (no BEGIN and COMMIT round trips),
        for work that is one statement. ``fence``: the transaction routes (its first
        statement must be ``router.prelude``) or changes subscriptions, and holds the
        routing fence so (:mod:`messagebox.storage.fence`). ``owned``: the caller's own work
        runs in it too (``box.transaction()``), and :meth:`joined` takes it as it is.
        """
        done: _Done | None = None  # once taken: entries handed over, kept if it fails
        with (
            self.local.hold_routing(fence) if fence is not None else nullcontext(),
            self.local.serial() if serial else nullcontext(),
        ):
            try:
                with self._begin(autocommit) as conn:
                    if fence is not None:
                        self.dialect.lock_routing(conn, fence)
                    self._started(conn)
                    if self.dialect.one_process and not autocommit:  # its commit is heard
                        handover.begin(conn, self.local.takers)
                    if owned:
                        conn.info[_OWNER] = self
                    try:
                        yield conn
                    except BaseException:
                        _forget(conn)
                        raise
                    finally:
                        if owned:
                            _disown(conn)
                    done = self._ending(conn)  # read now: the commit follows
            except MessageBoxError:
                _cancel(done)
                raise
            except DRIVER_ERRORS as exc:
                _cancel(done)
                error = self.dialect.translate(exc, getattr(exc, "statement", None))
                if isinstance(error, BackendUnavailable) and self.outage is not None:
                    self.outage.failed(error)
                raise error from exc
            except BaseException:
                _cancel(done)
                raise
            assert done is not None  # the body ran (else it raised)
            if done.changed and self.dialect.one_process:  # before the routing fence goes:
                self.local.routing_changed()  # the next publish sees the change
        if self.outage is not None:
            self.outage.answered()
        self._committed(done)

    @contextmanager
    def joined(self, external: object) -> Iterator[sa.Connection]:
        """The transaction of a connection the caller owns (``publish(connection=)``),
        as one of this store's: nothing here begins, commits, rolls back or closes it.
        A connection of :meth:`transaction` with ``owned=True`` (``box.transaction()``)
        is taken as it is; otherwise the dialect says which connections it can join
        (PostgreSQL: SQLAlchemy's and psycopg's, in a transaction; DuckDB: none).
        Where nothing can hear of the caller's commit, the wake-ups go with it as
        ``NOTIFY`` (other processes, and this one's listeners) and the counts are
        counted at once."""
        if isinstance(external, sa.Connection) and external.info.get(_OWNER) is self:
            yield external
            return
        try:
            with self.dialect.adopt(external) as conn:
                self._started(conn)
                try:
                    yield conn
                except BaseException:
                    _forget(conn)
                    raise
                done = self._ending(conn)
        except MessageBoxError:
            raise
        except DRIVER_ERRORS as exc:
            raise self.dialect.translate(exc, getattr(exc, "statement", None)) from exc
        self._committed(done._replace(wakes=set(), kept=[], gone=[], handed=[]))

    def _started(self, conn: sa.Connection) -> None:
        """What a transaction of this store's keeps on its connection, made new."""
        notify.take(conn)  # nothing left over from an earlier transaction
        handover.begin(conn, None)  # hands over only where the commit is heard (transaction)
        tracking.begin(conn, self.tracking)
        expiry.begin(conn, self.host_ttls)
        routing_index.begin(conn, self.routing)
        ids.begin(conn, self.local.blocks)
        store_clock.begin(conn, same_machine=self.dialect.one_process)
        recent.begin(conn, self.recent)

    def _ending(self, conn: sa.Connection) -> _Done:
        """What the transaction leaves to do once it commits, taken off its connection."""
        store_clock.end(conn)
        counts = tracking.committed(conn)
        wakes = notify.take(conn)
        changed = routing_index.take_changed(conn)
        kept, gone = recent.take(conn)
        return _Done(counts, wakes, changed, kept, gone, handover.take(conn))

    def _committed(self, done: _Done) -> None:
        """After a commit: the messages held in memory, counts, wake-ups."""
        if self.recent is not None and (done.kept or done.gone):
            self.recent.put(done.kept)
            self.recent.forget(done.gone)
        if done.counts:
            for hook in self.count_hooks:
                hook(done.counts)  # committed: count it
            self.tally.add(done.counts)
        if done.handed:  # before the wake-ups: a woken thread finds them
            handover.accept(done.handed)
        if done.wakes:  # through the database's: its other stores' watchers too
            self.local.wakes.signal(done.wakes)
        if self.tally.due():
            self.write_tally()

    def write_tally(self) -> None:
        """Write this process's per-minute counts (:mod:`messagebox.storage.rollup`); kept for
        the next try when the store cannot take them."""
        taken = self.tally.take()
        if not taken:
            return
        try:
            with self.transaction() as conn:
                rollup.write(conn, self.tally.source, taken)
        except Exception as exc:  # the caller's own transaction has committed: never fail it
            self.tally.put_back(taken)
            log.debug("per-minute counts not written: %s", exc)

    @contextmanager
    def _begin(self, autocommit: bool) -> Iterator[sa.Connection]:
        if not autocommit:
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def names(self, url: str) -> bool:
        """Whether ``url`` names this store's database (by the dialect's reading: on
        PostgreSQL, a server in common, the same database and ``options``)."""
        try:
            other = sa.make_url(url)
        except sa.exc.ArgumentError:
            return False
        return self.dialect.same_database(self.url, other)

    def tracking_off(self) -> bool:
        """Whether tracking is known to be off (its settings were read recently)."""
        settings = self.tracking.known()
        return settings is not None and not settings.enabled

    def close(self) -> None:
        """Write the last per-minute counts, then close every pooled connection."""
        with suppress(Exception):  # closing goes on whatever the store says
            self.write_tally()
        self._release()
        self.engine.dispose()

    def _release(self) -> None:
        """Give back the database's state (once): the last store of it to close drops
        its id block and kept messages."""
        if not self._released:
            self._released = True
            self.recent = None
            self.local.closed()


class _Done(NamedTuple):
    """What a transaction leaves to do once it commits."""

    counts: Any
    wakes: set[str]
    changed: bool
    kept: list[Any]
    gone: list[Any]
    handed: list[handover.Handed]


def _cancel(done: _Done | None) -> None:
    """The commit failed: the entries it leased to host instances were never stored."""
    if done is not None and done.handed:
        handover.cancel(done.handed)


def _identify(conn: sa.Connection) -> str:
    """The store's id (``mb_meta``), made on first open: what a connection the caller
    owns must find to be taken as one of this store's (``publish(connection=)``)."""
    m = schema.meta
    found = conn.execute(sa.select(m.c.value).where(m.c.key == STORE_ID)).scalar()
    if found is None:
        found = str(uuid.uuid4())
        conn.execute(m.insert().values(key=STORE_ID, value=found))
    return str(found)


def _disown(conn: sa.Connection) -> None:
    """The connection is no longer a ``box.transaction()``'s (one that lost its server
    refuses even this, and is replaced)."""
    with suppress(sa.exc.PendingRollbackError, sa.exc.ResourceClosedError):
        conn.info.pop(_OWNER, None)


def _forget(conn: sa.Connection) -> None:
    """Drop what a failed transaction kept on its connection. A connection that lost its
    server (invalidated) refuses even this, and keeps nothing: the pool replaces it."""
    with suppress(sa.exc.PendingRollbackError, sa.exc.ResourceClosedError):
        tracking.discard(conn)
        notify.take(conn)
        handover.cancel(handover.take(conn))
        routing_index.take_changed(conn)
        recent.take(conn)
        store_clock.end(conn)
