"""The limits ``bench.route`` measures beside publish, in the same run:

- **write limit**: the rows a publish writes (a spool row, a part and its link, one
  queue entry per match, a suspended entry with its report for a message that matched
  nothing, and the reference count) written with no routing at all, in
  batches of 1,000 messages, one transaction each, each batch right after publish wrote
  it (so both meet the disk in the same moment), through the store's own bulk path
  (Arrow ``INSERT … SELECT`` on DuckDB, ids as native UUIDs and the table read by a
  replacement scan; ``COPY`` on PostgreSQL), into a fresh database
  of the same schema. The Arrow tables and the COPY text are built before the clock
  starts: this is what the database can take, not what Python can make.
- **minimal write limit**: the same spool rows, parts and queue entries (no link,
  reference count or suspended entry), in the same batches and the same way, into
  tables with only their primary keys (``min_spool``, ``min_part``, ``min_queue``: the
  store's columns, none of its other indexes, no fillfactor): what the schema's own
  write costs, beside what the database takes at the least.
- **single-message raw insert**: one message's rows written in one transaction with
  parameterised ``INSERT … VALUES`` (on PostgreSQL in one round trip, as a pipeline),
  beside ``publish`` of one message. Each side first runs ``SINGLE_WARMUP`` untimed
  (its first statements of their kind, a connection's first use): of 200 timed ones,
  the p99 is the second slowest, and a single cold one made it 30 times the p50.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from bench.route_workload import HOSTS, Workload
from messagebox.engine import MessageBox
from messagebox.message import Message
from messagebox.models import ROUTING_FAILURE, Outcome
from messagebox.properties import encode_context
from messagebox.storage import schema
from messagebox.storage.dialects.duckdb import arrow_type, uuid_column

SINGLE_MESSAGES = 200
"""Single-message publishes (and raw inserts) timed."""
SINGLE_WARMUP = 20
"""Untimed ones before them (see above)."""


@dataclass(frozen=True)
class Limit:
    """The write limit and the single-message figures of one backend and N."""

    messages: int
    seconds: float
    raw_single_ms: list[float]
    publish_single_ms: list[float]
    minimal_seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def minimal_msgs_per_s(self) -> float:
        """The minimal write limit: into tables with only their primary keys."""
        return self.messages / self.minimal_seconds

    @property
    def raw_p50(self) -> float:
        return statistics.median(self.raw_single_ms)

    @property
    def publish_p50(self) -> float:
        return statistics.median(self.publish_single_ms)

    @property
    def publish_p99(self) -> float:
        return statistics.quantiles(self.publish_single_ms, n=100)[98]


Kept = tuple[str, tuple[int, ...]]
"""What the bench keeps of a publish result: its outcome (text) and its subscriptions.

A plain tuple of untracked values, which the garbage collector stops tracking (not a
named tuple: the collector untracks exact tuples only). Kept as ``Routed`` objects with
their ``uuid.UUID``, the 20,000 results of a run made the collector run a full pass over
the whole heap, most of it the bench's own workload, inside the timed publishes (7 µs a
message of a 40 µs publish on fanout1)."""


Columns = dict[str, list[Any]]


def _rows(
    messages: Sequence[Message], routed: Sequence[Kept], ids: Iterator[int], now: datetime
) -> dict[sa.Table, Columns]:
    """The rows publishing ``messages`` with these results writes, as columns."""
    out: dict[sa.Table, Columns] = {
        schema.spool: {
            k: [] for k in ("id", "context", "n_parts", "body_part", "published_at", "publisher")
        },
        schema.message_part: {k: [] for k in ("msg", "idx", "name", "part")},
        schema.part: {k: [] for k in ("id", "size", "n_fragments", "data")},
        schema.queue: {
            k: []
            for k in (
                "id",
                "msg",
                "sub",
                "host",
                "priority",
                "state",
                "attempts",
                "available_at",
                "enqueued_at",
                "instance_id",
                "ordered",
            )
        },
        schema.suspended: {
            k: []
            for k in (
                "id",
                "msg",
                "reason",
                "error",
                "report",
                "resumable",
                "attempts",
                "suspended_at",
            )
        },
        schema.ref_add: {"msg": [], "n": [], "logged_at": []},
    }
    spool, links, parts = out[schema.spool], out[schema.message_part], out[schema.part]
    queue, refs, suspended = out[schema.queue], out[schema.ref_add], out[schema.suspended]
    for message, result in zip(messages, routed, strict=True):
        msg, part = uuid.uuid4(), uuid.uuid4()
        body = message.parts[message.body_part]
        data = body.encode() if isinstance(body, str) else bytes(body)  # type: ignore[arg-type]
        for k, v in zip(
            spool,
            (msg, encode_context(message.promoted, {}), 1, message.body_part, now, "raw"),
            strict=True,
        ):
            spool[k].append(v)
        for k, v in zip(links, (msg, 0, message.body_part, part), strict=True):
            links[k].append(v)
        for k, v in zip(parts, (part, len(data), 1, data), strict=True):
            parts[k].append(v)
        outcome, subs = result
        for sub in subs:
            row = (next(ids), msg, sub, HOSTS[sub % len(HOSTS)], 0, "ready", 0, now, now)
            for k, v in zip(queue, (*row, None, False), strict=True):
                queue[k].append(v)
        n_refs = len(subs)
        if outcome == Outcome.SUSPENDED and not subs:  # no match
            # no report: as publish, it is read from the spool row
            failed = (next(ids), msg, ROUTING_FAILURE, "matched nothing", None, False, 0, now)
            for k, v in zip(suspended, failed, strict=True):
                suspended[k].append(v)
            n_refs = 1
        for k, v in zip(refs, (msg, n_refs, now), strict=True):
            refs[k].append(v)
    return out


def _copy_text(value: Any) -> str:
    """One value in PostgreSQL's text COPY format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


Prepared = list[tuple[str, Any]]
"""Per table, the statement and its payload: built before the clock starts."""


def _prepare(box: MessageBox, rows: dict[sa.Table, Columns]) -> Prepared:
    out: Prepared = []
    for table, columns in rows.items():
        if not columns["msg" if "msg" in columns else "id"]:
            continue
        names = ", ".join(columns)
        if box.backend == "postgresql":
            rows_ = zip(*columns.values(), strict=True)
            lines = ("\t".join(map(_copy_text, row)) + "\n" for row in rows_)
            out.append((f"COPY {table.name} ({names}) FROM STDIN", "".join(lines).encode()))
            continue
        arrays, exprs = [], []
        for name, values in columns.items():
            column = table.c[name]
            if isinstance(column.type, sa.Uuid):  # as the store does: native when it can
                array, expr = uuid_column(name, values)
                arrays.append(array)
                exprs.append(expr)
            else:
                exprs.append(name)
                arrays.append(pa.array(values, arrow_type(column)))
        data = pa.table(arrays, names=list(columns))
        select = f"SELECT {', '.join(exprs)} FROM mb_arrow_rows"
        out.append((f"INSERT INTO {table.name} ({names}) {select}", data))
    return out


def _write(box: MessageBox, prepared: Prepared) -> float:
    """Write prepared rows in one transaction; the seconds it took."""
    start = time.perf_counter()
    with box.store.engine.begin() as conn:
        raw: Any = conn.connection.driver_connection
        for statement, payload in prepared:
            if box.backend == "postgresql":
                with raw.cursor() as cursor, cursor.copy(statement) as copy:
                    copy.write(payload)
            else:  # the Arrow table as a local of this frame: no view to register
                mb_arrow_rows = payload  # noqa: F841 (read by DuckDB, by name)
                raw.execute(statement)
    return time.perf_counter() - start


def _write_one(box: MessageBox, rows: dict[sa.Table, Columns]) -> float:
    """One message's rows the fastest way a hand-written publisher has: an ``INSERT …
    VALUES`` with parameters per table, on PostgreSQL all in one round trip (a pipeline)."""
    statements = []
    for table, columns in rows.items():
        n = len(columns["msg" if "msg" in columns else "id"])
        if not n:
            continue
        names = list(columns)
        if box.backend == "postgresql":
            slots = ", ".join(["%s"] * len(names))
        else:
            slots = ", ".join(
                "CAST(? AS UUID)" if isinstance(table.c[c].type, sa.Uuid) else "?" for c in names
            )
        values = ", ".join([f"({slots})"] * n)
        params = [
            str(v) if box.backend == "duckdb" and isinstance(v, uuid.UUID) else v
            for i in range(n)
            for v in (columns[c][i] for c in names)
        ]
        insert = f"INSERT INTO {table.name} ({', '.join(names)}) VALUES {values}"
        statements.append((insert, params))
    start = time.perf_counter()
    with box.store.engine.begin() as conn:
        raw: Any = conn.connection.driver_connection
        if box.backend == "postgresql":
            with raw.pipeline(), raw.cursor() as cursor:
                for statement, params in statements:
                    cursor.execute(statement, params)
        else:
            for statement, params in statements:
                raw.execute(statement, params)
    return time.perf_counter() - start


class LimitRun:
    """The write limit measured beside a publish run, in a fresh database at ``url``:
    after each published batch, the rows that batch wrote are written here the fastest
    way (:func:`_write`), so the two share the machine's moment (the disk's fsync times
    vary by 2x over a minute here; measured a run apart, the ratio did too)."""

    def __init__(self, url: str, work: Workload) -> None:
        self._work = work
        self._now = datetime.now(UTC)
        self._ids = iter(range(1, 1 << 62))
        self._box = MessageBox(url, publisher="bench.route.limit")
        self._minimal = _minimal_tables(self._box)
        self.messages = 0
        self.seconds = 0.0
        self.minimal_seconds = 0.0

    def write(self, messages: Sequence[Message], routed: Sequence[Kept]) -> None:
        """Write the rows of one published batch into the store's tables, then into the
        minimal ones; each prepared before its clock starts."""
        rows = _rows(messages, routed, self._ids, self._now)
        self.seconds += _write(self._box, _prepare(self._box, rows))
        minimal = {mini: rows[table] for table, mini in self._minimal.items()}
        self.minimal_seconds += _write(self._box, _prepare(self._box, minimal))
        self.messages += len(messages)

    def result(self, routed: Sequence[Kept], publish_single_ms: list[float]) -> Limit:
        """The limit, with the single-message raw inserts (of the first messages)."""
        messages = self._work.messages
        timed = min(SINGLE_MESSAGES, len(routed))
        for i in _warmup(timed, len(routed)):
            _write_one(self._box, _rows([messages[i]], [routed[i]], self._ids, self._now))
        single = [
            _write_one(self._box, _rows([messages[i]], [routed[i]], self._ids, self._now)) * 1000
            for i in range(timed)
        ]
        return Limit(self.messages, self.seconds, single, publish_single_ms, self.minimal_seconds)

    def close(self) -> None:
        self._box.close()


def _minimal_tables(box: MessageBox) -> dict[sa.Table, sa.Table]:
    """Tables with the store's spool, part and queue columns and only their primary
    keys, created in ``box``'s database; by the store's table they stand for."""
    metadata = sa.MetaData()
    out = {}
    for table in (schema.spool, schema.part, schema.queue):
        columns = [
            sa.Column(
                c.name,
                c.type,
                primary_key=c.primary_key,
                nullable=c.nullable,
                autoincrement=False,
                server_default=getattr(c.server_default, "arg", None),
            )
            for c in table.columns
            if c.computed is None
        ]
        out[table] = sa.Table(f"min_{table.name.removeprefix('mb_')}", metadata, *columns)
    with box.store.engine.begin() as conn:
        metadata.create_all(conn, checkfirst=False)  # (no reflection: DuckDB's is broken)
    return out


def timed_singles(box: MessageBox, messages: Sequence[Message]) -> list[float]:
    """``publish`` of one message at a time, in ms each, after ``SINGLE_WARMUP``
    untimed."""
    for i in _warmup(min(SINGLE_MESSAGES, len(messages)), len(messages)):
        box.publish([messages[i]])
    out = []
    for message in messages[:SINGLE_MESSAGES]:
        start = time.perf_counter()
        box.publish([message])
        out.append((time.perf_counter() - start) * 1000)
    return out


def _warmup(timed: int, available: int) -> range:
    """The messages to warm up with: the next ``SINGLE_WARMUP`` after the timed ones
    (the first ones again where there are too few)."""
    if available - timed >= SINGLE_WARMUP:
        return range(timed, timed + SINGLE_WARMUP)
    return range(min(SINGLE_WARMUP, available))
