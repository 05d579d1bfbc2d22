"""PostgreSQL, for several processes and machines: ``postgresql+psycopg://user@host/db``.

``postgresql://`` URLs are given the psycopg 3 driver. A batch is staged as arrays and
unnested inside the routing statement (one round trip); bulk writes use ``COPY``.
Subscription changes take a transaction-scoped advisory lock so that shared
predicates are created and collected safely. JIT is off for every session.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from threading import Event
from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo

from messagebox import clock, sql
from messagebox.errors import AlreadyExists, BackendUnavailable, Conflict, MessageBoxError
from messagebox.storage import arrays, notify, schema
from messagebox.storage.capabilities import Capabilities
from messagebox.storage.dialects._ddl import ddl_script, run_script
from messagebox.storage.dialects.base import (
    Dialect,
    Prelude,
    RouteRow,
    Same,
    StagedBatch,
    distinct,
    route_rows,
)
from messagebox.storage.fence import Fence

log = logging.getLogger("messagebox.hosts")

NO_VERSIONS = 1 << 62
"""A version past any: the prelude of a store that routes in SQL reads none."""

IDLE_IN_TRANSACTION_SECONDS = 60
"""PostgreSQL ends a session of the store's that sits this long in a transaction with
nothing to do (``idle_in_transaction_session_timeout``; docs/howto-postgresql.md)."""

PING_AFTER_IDLE_SECONDS = 1.0
"""A pooled connection idle for longer is tested before use (``pool_pre_ping`` tests
every checkout: a round trip per transaction on the hot paths)."""

SESSION_SQL = (
    "SELECT set_config('jit', 'off', false),"
    " set_config('plan_cache_mode', 'force_custom_plan', false),"
    " set_config('idle_in_transaction_session_timeout',"
    f" '{IDLE_IN_TRANSACTION_SECONDS}s', false),"
    " pg_is_in_recovery()"
)
"""What each new connection sets for its session, in one round trip, and whether its
server is a standby. No JIT: the routing statement is costed high on small staged
batches, and JIT-compiling it took 2 s of a 2.3 s route. Custom plans: psycopg prepares
repeated statements, and a generic plan for routing is 3x slower. A transaction of ours
idle for ``IDLE_IN_TRANSACTION_SECONDS`` is a process frozen (SIGSTOP) or cut off
mid-transaction: the server ends it, so that the rows it holds (its heartbeat, its
leases) are not held for as long as its connection lives."""

LOST_STATES = frozenset({"57P01", "57P02", "57P03"})
"""SQLSTATEs besides class 08 (connection exception) that mean the server went or is
not there yet: shut down by an administrator, crashed, starting up."""


class Standby(psycopg.OperationalError):
    """A connection reached a standby in recovery: it was closed."""


def _checked_in(_dbapi_connection: Any, record: Any) -> None:
    record.info["idle_since"] = time.monotonic()


def _lost(exc: BaseException, orig: BaseException) -> bool:
    """Whether an error means the connection is gone or could not be made (rather
    than a statement failing on a working one)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if not isinstance(orig, psycopg.OperationalError):
        return False
    state = orig.sqlstate
    return state is None or state.startswith("08") or state in LOST_STATES


def _listening_again(host: str, seconds: float) -> None:
    log.info(
        "host %s: LISTEN connection back after %.1f s",
        host,
        seconds,
        extra={"event": "listen-back", "host": host, "outage_seconds": round(seconds, 3)},
    )


def _connect_args(url: sa.URL) -> dict[str, Any]:
    """What psycopg is given to connect by ``url`` (SQLAlchemy's reading of it)."""
    url = url.set(drivername="postgresql+psycopg")
    args, kwargs = url.get_dialect()().create_connect_args(url)
    assert not args, args  # the psycopg dialect passes keywords only
    return dict(kwargs)


def _target(url: sa.URL) -> tuple[set[tuple[str, str]], object, object]:
    """The servers ``url`` names, as (host, port) pairs, its database and ``options``."""
    found = _connect_args(url)
    hosts = str(found.get("host") or "").split(",")
    ports = str(found.get("port") or "5432").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    return set(zip(hosts, ports, strict=False)), found.get("dbname"), found.get("options")


@contextmanager
def _driver(conn: sa.Connection) -> Iterator[Any]:
    """The driver's connection under ``conn``. One that breaks under a statement is
    invalidated at once, so that the pool replaces it rather than roll it back (which
    fails, logged with a traceback)."""
    raw: Any = conn.connection.driver_connection
    try:
        yield raw
    except psycopg.Error as exc:
        if raw.broken:
            conn.invalidate(exc)
        raise


ONE_STATEMENT_ROWS = 2_000
"""Writes of at most this many rows in all go as one statement; more are copied (for a
batch of 1,000 messages at 10 matches, unnest was 30-40% slower than COPY here)."""


def _pg_type(column: sa.Column[Any]) -> str:
    """The PostgreSQL type name of a column (for casts of bound arrays)."""
    t = column.type
    for kind, name in (
        (sa.BigInteger, "bigint"),
        (sa.SmallInteger, "smallint"),
        (sa.Integer, "integer"),
        (sa.Boolean, "boolean"),
        (sa.Uuid, "uuid"),
        (sa.DateTime, "timestamptz"),
        (sa.LargeBinary, "bytea"),
        (sa.Double, "float8"),
        (sa.Float, "float8"),
    ):
        if isinstance(t, kind):
            return name
    return "text"


def _array(values: Sequence[Any], pg_type: str) -> Any:
    """A column's values as one array parameter: text, UUIDs, ints and bytes as the
    array's text literal (psycopg dumps a list item by item, escaping text and bytes
    with a regular expression: 200 JSON texts took 2.0 ms against 0.1), others as a
    list; text with a NUL, or a value not of the column's type, as a list too, for
    psycopg's own error."""
    if pg_type in _LITERAL_TYPES:
        return arrays.pg_array(values)
    if pg_type == "bytea":
        try:
            return arrays.bytea_literal(values)
        except TypeError:
            pass
    return values if isinstance(values, list) else list(values)


_LITERAL_TYPES = frozenset({"text", "uuid", "bigint", "integer", "smallint"})


_BINARY_TYPES: dict[str, frozenset[type]] = {
    "bigint": frozenset({int}),
    "smallint": frozenset({int}),
    "integer": frozenset({int}),
    "boolean": frozenset({bool}),
    "uuid": frozenset({uuid.UUID}),
    "timestamptz": frozenset({datetime}),
    "bytea": frozenset({bytes}),
    "float8": frozenset({float}),
    "text": frozenset({str}),
}
"""The Python types each column type is copied in binary from (None aside)."""


_INT_RANGES: dict[str, tuple[int, int]] = {
    "smallint": (-(1 << 15), (1 << 15) - 1),
    "integer": (-(1 << 31), (1 << 31) - 1),
    "bigint": (-(1 << 63), (1 << 63) - 1),
}
"""The values binary COPY can write to each integer type (its dumpers would wrap
others; text COPY lets the server refuse them, naming the column)."""


def _copy_columns(
    table: sa.Table, columns: Mapping[str, Sequence[Any]]
) -> tuple[list[str] | None, list[Sequence[Any]]]:
    """The values to ``COPY``, naive times made UTC (as on every other path), and the
    column types to copy them in binary format (3-4x faster than text for both sides):
    None when a column holds a value the binary dumper of its type does not take (or
    would misread: an integer out of its type's range, an id that is not a UUID); ids
    given as text are made UUIDs."""
    types: list[str] | None = []
    out: list[Sequence[Any]] = []
    for name, values in columns.items():
        pg_type = _pg_type(table.c[name])
        each = distinct(values)
        found = set(map(type, each))
        found.discard(type(None))
        if pg_type == "timestamptz" and any(
            isinstance(v, datetime) and v.tzinfo is None for v in each
        ):
            if isinstance(values, Same):
                values = Same(clock.utc(values.value), values.n)
            else:
                values = [clock.utc(v) if isinstance(v, datetime) else v for v in values]
        out.append(values)
        if types is None:
            continue
        if pg_type == "uuid" and str in found:
            try:
                out[-1] = [v if v is None or type(v) is uuid.UUID else uuid.UUID(v) for v in values]
            except (ValueError, TypeError):
                types = None
                continue
            found.discard(str)
        if not found <= _BINARY_TYPES[pg_type]:
            types = None
            continue
        bounds = _INT_RANGES.get(pg_type)
        if bounds is not None and found:
            ints = [v for v in each if v is not None]
            if min(ints) < bounds[0] or max(ints) > bounds[1]:
                types = None
                continue
        types.append(pg_type)
    return types, out


class PostgreSQLDialect(Dialect):
    name: ClassVar[str] = "postgresql"
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)
    supports_skip_locked: ClassVar[bool] = True
    has_row_locks: ClassVar[bool] = True
    supports_notify: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(
        arrays_as_text=True, counts_host_by_index=True
    )
    prelude_sql: ClassVar[str] = sql.load("postgresql", "publish_prelude")
    fence_changes_sql: ClassVar[str] = sql.load("postgresql", "fence_changes")

    _url: sa.URL | None = None
    _lender: sa.Engine | None = None
    _lost_at: float = -math.inf
    """When (``time.monotonic()``) a connection of this store was last found lost or
    could not be made: the pool replaces every connection made before then."""

    def create_engine(self, url: sa.URL) -> sa.Engine:
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        self._url = url
        engine = sa.create_engine(url)
        sa.event.listen(engine, "connect", self._connected)
        sa.event.listen(engine, "checkout", self._checked_out)
        sa.event.listen(engine, "checkin", _checked_in)
        return engine

    def _connected(self, dbapi_connection: Any, record: Any) -> None:
        """Set up a new connection (:data:`SESSION_SQL`); one to a standby in recovery
        is closed and refused, naming the server: it could not take a write."""
        record.info["connected_at"] = time.monotonic()
        with dbapi_connection.cursor() as cursor:
            cursor.execute(SESSION_SQL)
            row = cursor.fetchone()
        dbapi_connection.commit()
        if row is not None and row[-1]:
            info = dbapi_connection.info
            raise Standby(
                f"the server at {info.host}:{info.port} is a standby in recovery (read-only): "
                "name the primary, or every server with target_session_attrs=read-write "
                "(docs/howto-postgresql.md, High availability)"
            )

    def _checked_out(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        """Test a pooled connection before use where it may be dead. One made before
        the store was last found lost (a failover, a restart: the pool's others are as
        dead) is replaced without a try; one back within :data:`PING_AFTER_IDLE_SECONDS`
        was working a moment ago: no round trip; one idle longer is tried first. The
        pool replaces a connection for which this raises ``DisconnectionError``."""
        if record.info.get("connected_at", math.inf) <= self._lost_at:
            raise sa.exc.DisconnectionError("made before the store was last found lost")
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            dbapi_connection.rollback()
        except psycopg.Error as exc:
            raise sa.exc.DisconnectionError(str(exc)) from exc

    def lock_schema(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql(sql.load(self.name, "lock_schema"))

    def create_schema(self, conn: sa.Connection, metadata: sa.MetaData) -> None:
        self.lock_schema(conn)
        statements = [ddl_script(conn.dialect, metadata, indexes=True)]
        statements += (
            sql.load(self.name, name)
            for name in (
                "run_lease_column",
                "run_lease_index",
                "claimable_function",
                "publish_prelude_function",
                "ordered_run_function",
                "ordered_heads_function",
                "instance_heads_function",
                "key_last_column",
                "key_lease_column",
                "key_lease_index",
                "keyed_runs_function",
            )
        )
        # room on each page for a claimed row's new version (see schema.QUEUE_FILLFACTOR)
        statements.append(f"ALTER TABLE mb_queue SET (fillfactor = {schema.QUEUE_FILLFACTOR})")
        statements += (  # vacuumed by dead rows, not by fraction
            f"ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0, "
            f"autovacuum_vacuum_threshold = {schema.CHURN_VACUUM_ROWS}, "
            "autovacuum_vacuum_insert_scale_factor = 0, "
            f"autovacuum_vacuum_insert_threshold = {schema.CHURN_VACUUM_ROWS})"
            for table in schema.CHURN_TABLES
        )
        run_script(conn, ";\n".join(statements))  # one round trip, not ~100

    def route(self, conn: sa.Connection, batch: StagedBatch) -> list[RouteRow]:
        params = {
            "n": batch.n,
            "msg": batch.msg,
            "name": batch.name,
            "fam": batch.fam,
            "v_str": batch.v_str,
            "hi": batch.hi,
            "lo": batch.lo,
            "v_int": batch.v_int,
        }
        rows = conn.exec_driver_sql(self.route_sql, params).fetchall()
        return route_rows(rows)

    def insert(
        self, conn: sa.Connection, table: sa.Table, columns: Mapping[str, Sequence[Any]]
    ) -> None:
        names = ", ".join(columns)
        types, values = _copy_columns(table, columns)
        if types is None:  # a value of another Python type: text, as the driver adapts it
            with (
                _driver(conn) as raw,
                raw.cursor() as cursor,
                cursor.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy,
            ):
                for row in zip(*values, strict=True):
                    copy.write_row(row)
            return
        with (
            _driver(conn) as raw,
            raw.cursor() as cursor,
            cursor.copy(f"COPY {table.name} ({names}) FROM STDIN (FORMAT binary)") as copy,
        ):
            copy.set_types(types)
            for row in zip(*values, strict=True):
                copy.write_row(row)

    def fetch(self, conn: sa.Connection, statement: str, params: Mapping[str, Any]) -> list[Any]:
        # on the driver's cursor: SQLAlchemy's result set-up cost more than the rows
        # (a fifth of a host instance's CPU at batch 100); psycopg prepares it. Binary
        # results: a timestamp or a UUID loads faster than its text
        with _driver(conn) as raw, raw.cursor() as cursor:
            cursor.execute(statement, params, binary=True)
            return list(cursor.fetchall())

    def fetch_messages(
        self, conn: sa.Connection, ids: Sequence[Any], share: int | None
    ) -> list[Any]:
        # the ids as one array literal: psycopg dumps a list item by item
        return self.fetch(
            conn, self.read_messages_sql, {"ids": arrays.pg_array(ids), "share": share}
        )

    def prelude(self, conn: sa.Connection, version: int | None) -> Prelude | None:
        asked = NO_VERSIONS if version is None else version
        row = conn.exec_driver_sql(self.prelude_sql, {"v": asked}).one()
        now, block, versions, subs, store, isolation = row
        changes = list(zip(versions, subs, strict=True))
        return Prelude(clock.utc(now), int(block), changes, store, isolation)

    def insert_many(
        self,
        conn: sa.Connection,
        writes: Sequence[tuple[sa.Table, Mapping[str, Sequence[Any]]]],
        *,
        wake: Sequence[str] = (),
    ) -> None:
        """Small writes as one statement (a data-modifying CTE per table, each inserting
        from unnested arrays), whose result sends the notifications: one round trip
        instead of a COPY per table and a notification statement. Larger ones are
        copied."""
        writes = [(t, c) for t, c in writes if len(next(iter(c.values()), ()))]
        if not writes or sum(len(next(iter(c.values()))) for _, c in writes) > ONE_STATEMENT_ROWS:
            for table, columns in writes:
                self.insert(conn, table, columns)
            self.notify(conn, wake)
            return
        parts: list[str] = []
        params: dict[str, Any] = {}
        for i, (table, columns) in enumerate(writes):
            arrays: list[str] = []
            select: list[str] = []
            for j, (name, values) in enumerate(columns.items()):
                key = f"p{i}_{j}"
                pg_type = _pg_type(table.c[name])
                if isinstance(values, Same):
                    params[key] = values.value
                    select.append(f"%({key})s::{pg_type}")
                else:
                    params[key] = _array(values, pg_type)
                    arrays.append(f"%({key})s::{pg_type}[]")
                    select.append(f"u.c{len(arrays) - 1}")
            names = ", ".join(f"c{k}" for k in range(len(arrays)))
            parts.append(
                f"w{i} AS (INSERT INTO {table.name} ({', '.join(columns)}) "
                f"SELECT {', '.join(select)} FROM unnest({', '.join(arrays)}) AS u({names}))"
            )
        hosts = sorted(set(wake))
        if hosts:  # the notify statement as this one's result (sent at the commit)
            notify.after_commit(conn, hosts)
            params["hosts"] = hosts
            last = f"SELECT count(*) FROM ({sql.load(self.name, 'notify')}) AS n"
        else:
            last = "SELECT 1"
        conn.exec_driver_sql("WITH " + ", ".join(parts) + " " + last, params)

    def claim_params(self, host: str, owner: str, n: int, lease_seconds: float) -> dict[str, Any]:
        return {"host": host, "owner": owner, "n": n, "lease": float(lease_seconds)}

    def now_plus(self, seconds: float | sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        secs = sa.literal(float(seconds)) if isinstance(seconds, float | int) else seconds
        return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.cast(secs, sa.Double))

    def notify_others(self, conn: sa.Connection, hosts: Sequence[str]) -> None:
        if hosts:
            conn.exec_driver_sql(sql.load(self.name, "notify"), {"hosts": sorted(set(hosts))})

    def try_lock_cleanup(self, conn: sa.Connection) -> bool:
        return bool(conn.exec_driver_sql(sql.load(self.name, "lock_cleanup")).scalar())

    def same_database(self, url: sa.URL, other: sa.URL) -> bool:
        """A server (host and port) in common, the same database and ``options`` (a
        schema): a URL naming the primary alone and one naming it and its standby
        are the same store."""
        if other.get_backend_name() != self.name:
            return False
        (servers, *rest), (others, *other_rest) = _target(url), _target(other)
        return bool(servers & others) and rest == other_rest

    def listen_dsn(self, url: sa.URL) -> str:
        """A libpq connection string for a LISTEN connection of its own: what the
        engine's connections are given (SQLAlchemy's reading of the URL), so that a URL
        naming several servers (``?host=a:5432&host=b:5432&target_session_attrs=...``)
        is ``host=a,b port=5432,5432 target_session_attrs=...`` here too."""
        return make_conninfo(**_connect_args(url))

    def listen(self, url: sa.URL, host: str, wake: Callable[[], None], stop: Event) -> None:
        """LISTEN on a connection of its own, reconnecting every second after a
        failure; the loss is logged once, and once more when it listens again, with how
        long it did not. ``wake`` also runs on each (re)connect, for what was published
        meanwhile."""
        dsn = self.listen_dsn(url)
        lost: float | None = None
        while not stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("LISTEN messagebox")
                    row = conn.execute("SELECT current_schema()").fetchone()
                    target = f"{row[0] if row else 'public'}/{host}"
                    if lost is not None:
                        _listening_again(host, time.monotonic() - lost)
                        lost = None
                    wake()
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == target:
                                wake()
            except psycopg.Error as exc:
                if lost is None:
                    lost = time.monotonic()
                    error = " ".join(str(exc).split())
                    log.warning(
                        "host %s: LISTEN connection lost (%s); polling until it is back",
                        host,
                        error,
                        extra={"event": "listen-lost", "host": host, "error": error},
                    )
                stop.wait(1.0)

    def warnings(self, conn: sa.Connection) -> list[str]:
        if conn.exec_driver_sql("SHOW autovacuum").scalar() == "on":
            return []
        return [
            "autovacuum is off on this PostgreSQL server: the queue's deleted rows are never "
            "removed, and claims slow down as they pile up (docs/howto-postgresql.md, "
            "Cleanup); turn it on, or VACUUM mb_queue, mb_ref_add and mb_ref_release often"
        ]

    @contextmanager
    def adopt(self, external: object) -> Iterator[sa.Connection]:
        """A SQLAlchemy connection (or a ``Session``'s) on psycopg 3 as it is; a
        psycopg 3 connection lent to an engine that leaves its transaction alone
        (:mod:`messagebox.storage.dialects.borrowed`). Each in a transaction its owner began."""
        from messagebox.storage.dialects import borrowed

        found = borrowed.usable(external, self.name)
        if isinstance(found, sa.Connection):
            yield found
            return
        if self._lender is None:
            assert self._url is not None, "adopt() before create_engine()"
            self._lender = borrowed.lender(self._url)
        with borrowed.lend(self._lender, found) as conn:
            yield conn

    def lock_subscriptions(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql(sql.load(self.name, "lock_subscriptions"))

    def lock_routing(self, conn: sa.Connection, fence: Fence) -> None:
        """A change takes the fence here; a transaction that routes, in its prelude
        (``mb_publish_prelude``), which it runs first."""
        if fence is Fence.CHANGES:
            conn.exec_driver_sql(self.fence_changes_sql)

    def translate(self, exc: BaseException, statement: str | None = None) -> MessageBoxError:
        """A lost connection, or one that could not be made, is
        :class:`BackendUnavailable` (and the pool replaces its other connections);
        unique violations, deadlocks and serialization failures are the errors of
        their kind; the rest :class:`StorageError`."""
        orig = getattr(exc, "orig", None) or exc
        connecting = isinstance(exc, sa.exc.OperationalError) and statement is None
        if isinstance(orig, Standby) or connecting or _lost(exc, orig):
            self._lost_at = time.monotonic()
            text = " ".join(str(orig).split())
            if isinstance(orig, Standby):
                return BackendUnavailable(f"postgresql: {text}")
            return BackendUnavailable(f"cannot reach PostgreSQL: {text}")
        if isinstance(orig, psycopg.errors.UniqueViolation):
            return AlreadyExists(f"postgresql: {str(orig).strip().splitlines()[0]}")
        if isinstance(orig, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure):
            return Conflict(f"postgresql: {str(orig).strip().splitlines()[0]}")
        return super().translate(exc, statement)
