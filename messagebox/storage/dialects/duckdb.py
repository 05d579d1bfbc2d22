"""DuckDB, the embedded default: ``duckdb:///path/to/file.duckdb``.

One OS process owns the file; host instances are threads in it. Bulk writes and the
staged batch go through Arrow tables registered on the connection (about 100× faster
than ``executemany``). DuckDB has no row locks (``FOR UPDATE`` compiles to nothing), so
whatever must be serialised is serialised in-process, per database file (the write
lock and routing fence of :class:`messagebox.storage.database_local.DatabaseLocal`). Secondary
indexes are not created: DuckDB joins by hashing and they would only slow inserts.
"""

from __future__ import annotations

import os
import uuid as uuid_mod
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

import duckdb
import duckdb_engine
import sqlalchemy as sa
from sqlalchemy.engine.interfaces import IsolationLevel

from messagebox import clock, sql
from messagebox.errors import (
    AlreadyExists,
    BackendUnavailable,
    Conflict,
    MessageBoxError,
    ValidationError,
)
from messagebox.storage.capabilities import Capabilities
from messagebox.storage.dialects._ddl import create_all
from messagebox.storage.dialects.base import (
    Dialect,
    Indexed,
    RouteRow,
    Same,
    StagedBatch,
    Uuids,
    route_rows,
)
from messagebox.storage.ids import uuid_bytes


class _CachingDriver(duckdb_engine.Dialect):
    """duckdb_engine's SQLAlchemy dialect with the compiled-statement cache on. The
    driver leaves it off, so every statement was compiled anew (0.3-1 ms each, a tenth
    of an orchestration step batch); its compiler is PostgreSQL's, which caches."""

    supports_statement_cache = True
    returns_native_bytes = True
    """DuckDB gives a BLOB as ``bytes``: no copy of each value (``bytes(value)``) in
    SQLAlchemy's result processing."""

    # Whether the connection has a transaction open, kept from the calls that open and
    # end one: the pool rolls back every connection it takes back, and on DuckDB a
    # rollback with nothing open fails (0.4 ms, caught by duckdb_engine), after every
    # committed transaction. Unknown (never begun or ended here) counts as open.
    def do_begin(self, dbapi_connection: Any) -> None:
        driver = _driver(dbapi_connection)
        if not getattr(driver, "mb_autocommit", False):
            super().do_begin(dbapi_connection)
            driver.mb_open = True

    def do_commit(self, dbapi_connection: Any) -> None:
        driver = _driver(dbapi_connection)
        if getattr(driver, "mb_open", True):
            super().do_commit(dbapi_connection)  # type: ignore[no-untyped-call]
            driver.mb_open = False

    def do_rollback(self, dbapi_connection: Any) -> None:
        driver = _driver(dbapi_connection)
        if getattr(driver, "mb_open", True):
            super().do_rollback(dbapi_connection)
            driver.mb_open = False

    # ``isolation_level="AUTOCOMMIT"`` (:meth:`Store.transaction` with
    # ``autocommit=True``): no BEGIN and COMMIT, each statement commits alone, as the
    # driver does outside a transaction. A BEGIN and a COMMIT cost a statement each.
    def get_isolation_level_values(self, dbapi_connection: Any) -> list[IsolationLevel]:
        return ["SERIALIZABLE", "AUTOCOMMIT"]

    def get_default_isolation_level(self, dbapi_connection: Any) -> IsolationLevel:  # type: ignore[override]
        return "SERIALIZABLE"  # DuckDB's only level

    def get_isolation_level(self, dbapi_connection: Any) -> IsolationLevel:
        return (
            "AUTOCOMMIT"
            if getattr(_driver(dbapi_connection), "mb_autocommit", False)
            else "SERIALIZABLE"
        )

    def set_isolation_level(self, dbapi_connection: Any, level: IsolationLevel) -> None:
        _driver(dbapi_connection).mb_autocommit = level == "AUTOCOMMIT"


def _driver(conn: Any) -> Any:
    """duckdb_engine's connection behind a pool's proxy (or itself)."""
    return getattr(conn, "dbapi_connection", None) or conn


sa.dialects.registry.register("duckdb.messagebox", __name__, "_CachingDriver")

if TYPE_CHECKING:
    import pyarrow as pa


def arrow_type(column: sa.Column[Any]) -> pa.DataType:
    import pyarrow as pa  # imported on the first insert: a command that only reads starts faster

    t = column.type
    if isinstance(t, sa.BigInteger):
        return pa.int64()
    if isinstance(t, sa.SmallInteger):
        return pa.int16()
    if isinstance(t, sa.Integer):
        return pa.int32()
    if isinstance(t, sa.Double | sa.Float):
        return pa.float64()
    if isinstance(t, sa.Boolean):
        return pa.bool_()
    if isinstance(t, sa.DateTime):
        return pa.timestamp("us", tz="UTC")
    if isinstance(t, sa.LargeBinary):
        return pa.large_binary()
    return pa.string()  # Text, and Uuid as its text form (cast on insert)


def _uuid_texts(values: Sequence[Any]) -> list[str | None]:
    """UUIDs (or their text) as text, converting each object once: a message's id
    repeats across its queue entries."""
    memo: dict[int, str] = {}
    out: list[str | None] = []
    append = out.append
    for v in values:
        if v is None or type(v) is str:
            append(v)
            continue
        text = memo.get(id(v))
        if text is None:
            text = memo[id(v)] = str(v)
        append(text)
    return out


@cache
def _native_uuids() -> bool:
    """Whether this pyarrow and DuckDB pass UUIDs as Arrow's ``arrow.uuid`` type (16
    bytes each, read by DuckDB as UUID): about 3x cheaper than text per entry."""
    import pyarrow as pa

    if not hasattr(pa, "uuid"):  # pyarrow < 18
        return False
    probe = pa.table([pa.array([uuid_mod.UUID(int=1)], pa.uuid())], names=["u"])
    con = duckdb.connect()
    try:
        con.register("mb_uuid_probe", probe)
        found = con.execute("SELECT typeof(u) FROM mb_uuid_probe").fetchone()
    except duckdb.Error:
        return False
    finally:
        con.close()
    return found is not None and found[0] == "UUID"


def uuid_column(name: str, values: Sequence[Any]) -> tuple[pa.Array, str]:
    """A UUID column's Arrow array and its select expression: native UUIDs when every
    value is a ``uuid.UUID`` (or None) and the libraries allow, else text cast in SQL."""
    array, text = _uuid_array(values)
    return array, f"CAST({name} AS UUID)" if text else name


def _uuid_array(values: Sequence[Any]) -> tuple[pa.Array, bool]:
    """:func:`uuid_column`'s array, and whether it is text (to cast in SQL)."""
    import pyarrow as pa

    if _native_uuids():
        # each UUID's 16 bytes joined into the array's buffer: 3x faster than
        # pa.array(values, pa.uuid()), which reads them through .bytes one by one
        data = uuid_bytes(values)
        if data is not None:  # else some values are text, or None
            storage = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(16), len(values), [None, pa.py_buffer(data)]
            )
            return pa.ExtensionArray.from_storage(pa.uuid(), storage), False
        try:
            return pa.array(values, pa.uuid()), False
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # some values are text
    return pa.array(_uuid_texts(values), pa.string()), True


SMALL_INSERT = 12
"""Inserts of at most this many rows bind parameters instead of an Arrow table."""


@cache
def _staged_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("msg", pa.int32()),
            ("name", pa.string()),
            ("fam", pa.int16()),
            ("v_str", pa.string()),
            ("hi", pa.float64()),
            ("lo", pa.float64()),
            ("v_int", pa.int64()),
        ]
    )


_PICK = frozenset(("host", "n", "first_kind"))
"""The parameters of a claim's pick (DuckDB refuses a parameter a statement lacks)."""


def _by_key(row: Any) -> tuple[Any, ...]:
    """A claim row's subscription, key and id."""
    return (row[2], row[13], row[0])


def _by_claim_order(row: Any) -> tuple[Any, ...]:
    """A claim row's priority (highest first) and id."""
    return (-row[4], row[0])


class DuckDBDialect(Dialect):
    name: ClassVar[str] = "duckdb"
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (duckdb.Error,)
    one_process: ClassVar[bool] = True
    claims_mixed: ClassVar[bool] = True
    claims_keyed_with_plain: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(times_as_epoch=True, uuids_as_bytes=True)

    def __init__(self) -> None:
        super().__init__()
        self.lease_sql = sql.load(self.name, "lease")
        self.run_cut_sql = sql.load(self.name, "run_cut")
        self.blocked_heads_sql = sql.load(self.name, "blocked_heads")
        self.claim_keyed_plain_sql = sql.load(self.name, "claim_keyed_plain")

    @classmethod
    def check_url(cls, url: sa.URL) -> None:
        """A file's URL has three slashes and no host (``duckdb://file.duckdb`` reads
        ``file.duckdb`` as a host, which DuckDB's driver cannot take)."""
        if url.host or url.port or url.username or url.password:
            given = url.render_as_string(hide_password=True)
            raise ValidationError(
                f"{given} names a host; a DuckDB URL names a file: duckdb:///relative.duckdb "
                "(three slashes: relative to the working directory) or "
                "duckdb:////absolute/path.duckdb (four)"
            )

    def create_engine(self, url: sa.URL) -> sa.Engine:
        if url.drivername == "duckdb":
            url = url.set(drivername="duckdb+messagebox")
        return sa.create_engine(url)

    def database_key(self, url: sa.URL) -> str:
        """The file's absolute path (one file, however its URL spells it)."""
        database = url.database or ""
        return (
            super().database_key(url) if database in ("", ":memory:") else os.path.abspath(database)
        )

    def private_database(self, url: sa.URL) -> bool:
        """``:memory:`` (or no file): every open makes a database of its own."""
        return (url.database or "") in ("", ":memory:")

    def database_exists(self, url: sa.URL) -> bool:
        database = url.database or ""
        return database in ("", ":memory:") or os.path.exists(database)

    def create_schema(self, conn: sa.Connection, metadata: sa.MetaData) -> None:
        create_all(conn, metadata, indexes=False)

    @staticmethod
    def _over_arrow(
        conn: sa.Connection, rows: pa.Table, sql: str, params: Mapping[str, Any] | None = None
    ) -> Any:
        """Run ``sql`` (with ``params``), in which ``mb_arrow_rows`` names ``rows``, on
        the transaction's DuckDB connection. DuckDB finds the Arrow table as a local of
        this frame (a replacement scan): registering and unregistering it as a view cost
        0.6 ms more per statement, several times a publish."""
        mb_arrow_rows = rows  # noqa: F841 (read by DuckDB, by name)
        raw: Any = conn.connection.driver_connection
        return raw.execute(sql, params)

    def route(self, conn: sa.Connection, batch: StagedBatch) -> list[RouteRow]:
        import pyarrow as pa

        staged = pa.table(
            [
                pa.array(batch.msg, pa.int32()),
                pa.array(batch.name, pa.string()),
                pa.array(batch.fam, pa.int16()),
                pa.array(batch.v_str, pa.string()),
                pa.array(batch.hi, pa.float64()),
                pa.array(batch.lo, pa.float64()),
                pa.array(batch.v_int, pa.int64()),
            ],
            schema=_staged_schema(),
        )
        found = self._over_arrow(conn, staged, self.route_sql, {"n": batch.n})
        return route_rows(found.fetchall())

    def fetch_messages(
        self, conn: sa.Connection, ids: Sequence[Any], share: int | None
    ) -> list[Any]:
        # the ids as an Arrow column (16 bytes each), not a list parameter: DuckDB turns
        # each UUID of a list into text and back (a read of 533 messages: 1.5 ms more)
        import pyarrow as pa

        array, _ = _uuid_array(ids)  # text where they are: the statement casts them
        return list(
            self._over_arrow(
                conn, pa.table([array], names=["id"]), self.read_messages_sql, {"share": share}
            ).fetchall()
        )

    def insert(
        self, conn: sa.Connection, table: sa.Table, columns: Mapping[str, Sequence[Any]]
    ) -> None:
        rows = len(next(iter(columns.values()), ()))
        if rows <= SMALL_INSERT:
            self._insert_values(conn, table, columns, rows)
            return
        import pyarrow as pa

        arrays = []
        exprs = []
        for col_name, values in columns.items():
            column = table.c[col_name]
            uuid = isinstance(column.type, sa.Uuid)
            if isinstance(values, Same):
                exprs.append(f"CAST({col_name} AS UUID)" if uuid else col_name)
                value = str(values.value) if uuid and values.value is not None else values.value
                arrays.append(pa.repeat(pa.scalar(value, arrow_type(column)), len(values)))
            else:
                each = values.values if isinstance(values, Indexed) else values
                if uuid and isinstance(each, Uuids):  # converted once for every table
                    array, cast = each.converted.get(self.name) or each.converted.setdefault(
                        self.name, _uuid_array(each.values)
                    )
                    expr = f"CAST({col_name} AS UUID)" if cast else col_name
                elif uuid:
                    array, expr = uuid_column(col_name, each)
                else:
                    array, expr = pa.array(each, arrow_type(column)), col_name
                if isinstance(values, Indexed):  # each distinct value converted once
                    array = array.take(pa.array(values.positions, pa.int32()))
                arrays.append(array)
                exprs.append(expr)
        self._over_arrow(
            conn,
            pa.table(arrays, names=list(columns)),
            f"INSERT INTO {table.name} ({', '.join(columns)}) "
            f"SELECT {', '.join(exprs)} FROM mb_arrow_rows",
        )

    @staticmethod
    def _insert_values(
        conn: sa.Connection, table: sa.Table, columns: Mapping[str, Sequence[Any]], rows: int
    ) -> None:
        """A few rows as one ``INSERT ... VALUES`` with parameters: registering an Arrow
        table costs more than the insert itself below about a dozen rows."""
        if not rows:
            return
        slots: list[str] = []
        cols: list[list[Any]] = []
        for col_name, values in columns.items():
            t = table.c[col_name].type
            if isinstance(t, sa.Uuid):
                slots.append("CAST(? AS UUID)")
                cols.append([None if v is None else str(v) for v in values])
            elif isinstance(t, sa.DateTime):  # naive is UTC, as in the Arrow path
                slots.append("?")
                cols.append([clock.utc(v) if isinstance(v, datetime) else v for v in values])
            else:
                slots.append("?")
                cols.append(list(values))
        row = f"({', '.join(slots)})"
        params = tuple(v for i in range(rows) for v in (c[i] for c in cols))
        conn.exec_driver_sql(
            f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES " + ", ".join([row] * rows),
            params,
        )

    def claim_params(self, host: str, owner: str, n: int, lease_seconds: float) -> dict[str, Any]:
        return {"host": host, "owner": owner, "n": n, "lease_us": int(lease_seconds * 1e6)}

    def lease(self, conn: sa.Connection, statement: str, params: Mapping[str, Any]) -> list[Any]:
        """Pick the entries (the claim statement, a SELECT of their values once leased),
        then lease them by id: DuckDB's ``UPDATE ... RETURNING`` took 25 ms for 800 rows,
        against 3 without ``RETURNING`` (see ``lease`` in duckdb.sql)."""
        picked = self.fetch(conn, statement, {k: v for k, v in params.items() if k in _PICK})
        return self._leased(conn, params, picked)

    def _leased(
        self, conn: sa.Connection, params: Mapping[str, Any], picked: list[Any]
    ) -> list[Any]:
        """Lease the entries a claim picked (``lease``); returns them."""
        if picked:
            conn.exec_driver_sql(
                self.lease_sql,
                {
                    "owner": params["owner"],
                    "lease_us": params["lease_us"],
                    "ids": [r[0] for r in picked],
                },
            )
        return picked

    def lease_keyed(self, conn: sa.Connection, params: Mapping[str, Any]) -> list[Any]:
        """Pick keyed runs (``claim_keyed``: each key's a prefix of its run), keep at
        most ``per_key`` of each key's, oldest first, and lease those; with ``plain``
        (a number) in one statement with a plain claim (``claim_keyed_plain``), then
        keeping plain entries up to ``plain`` less the keyed ones kept."""
        pick = {"host": params["host"], "n": params["n"]}
        plain = params.get("plain", 0)
        if plain:
            picked = self.fetch(conn, self.claim_keyed_plain_sql, {**pick, "plain": plain})
        else:
            picked = self.fetch(conn, self.claim_keyed_sql, pick)
        keyed = sorted((r for r in picked if r[13] is not None), key=_by_key)
        kept: list[Any] = []
        taken, last = 0, None
        for r in keyed:
            taken = taken + 1 if (r[2], r[13]) == last else 1
            last = (r[2], r[13])
            if taken <= params["per_key"]:
                kept.append(r)
        others = sorted((r for r in picked if r[13] is None), key=_by_claim_order)
        kept.extend(others[: max(0, plain - len(kept))])
        return self._leased(conn, params, kept)

    def lease_run(self, conn: sa.Connection, params: Mapping[str, Any]) -> list[Any]:
        """Pick the ordered run, end it before an entry whose instance is busy elsewhere
        (``run_cut``, only for a run that holds instances' entries), then lease it. If
        that leaves nothing (the head waits for its instance), pick again without every
        subscription whose head waits (``blocked_heads``)."""
        host = params["host"]
        picked = self._cut_run(conn, host, self._pick_run(conn, host, params["n"], []))
        if picked == []:
            blocked = [r[0] for r in self.fetch(conn, self.blocked_heads_sql, {"host": host})]
            if blocked:
                picked = self._cut_run(conn, host, self._pick_run(conn, host, params["n"], blocked))
        return self._leased(conn, params, picked or [])

    def _pick_run(self, conn: sa.Connection, host: str, n: int, skip: list[int]) -> list[Any]:
        return self.fetch(conn, self.claim_ordered_sql, {"host": host, "n": n, "skip": skip})

    def _cut_run(self, conn: sa.Connection, host: str, picked: list[Any]) -> list[Any] | None:
        """The run up to its first entry whose instance is busy elsewhere; [] when that
        is its first (None: nothing was picked)."""
        if not picked:
            return None
        mine = [(r[0], r[5]) for r in picked if r[5] is not None]  # (id, instance)
        if not mine:
            return picked
        cut = conn.exec_driver_sql(
            self.run_cut_sql,
            {
                "host": host,
                "sub": picked[0][2],
                "ids": [i for i, _ in mine],
                "instances": [instance for _, instance in mine],
            },
        ).scalar()
        return picked if cut is None else [r for r in picked if r[0] < cut]

    def now_plus(self, seconds: float | sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        secs = sa.literal(float(seconds)) if isinstance(seconds, float | int) else seconds
        return sa.func.now() + sa.func.to_microseconds(sa.cast(secs * 1_000_000, sa.BigInteger))

    def create_convoys(
        self,
        conn: sa.Connection,
        pairs: Sequence[tuple[str, str]],
        instance_ids: Sequence[str],
        now: datetime,
    ) -> int:
        try:
            return super().create_convoys(conn, pairs, instance_ids, now)
        except sa.exc.DBAPIError as exc:
            # a concurrent transaction committed the same key after this one began, so
            # ON CONFLICT cannot see it: the caller's transaction must start again
            if "Duplicate key" in str(exc.orig):
                raise Conflict(f"duckdb: mb_convoy written concurrently: {exc.orig}") from exc
            raise

    def translate(self, exc: BaseException, statement: str | None = None) -> MessageBoxError:
        text = str(getattr(exc, "orig", None) or exc)
        if "Could not set lock on file" in text or "Conflicting lock" in text:
            return BackendUnavailable(
                "the DuckDB file is open in another process; DuckDB allows one process per "
                "file (run host instances as threads, or use PostgreSQL for several "
                f"processes): {text.splitlines()[0]}"
            )
        if "Failed to commit" in text or "Conflict on" in text:
            return Conflict(f"duckdb: {text.strip().splitlines()[0]}")
        if "Duplicate key" in text:
            return AlreadyExists(f"duckdb: {text.strip().splitlines()[0]}")
        return super().translate(exc, statement)
