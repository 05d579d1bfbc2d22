"""Bulk publish from Spark into the MessageBox, idempotently (docs/howto-spark.md).

    from messagebox.pipelines.spark_publish import publish_dataframe

    orders = spark.read.parquet("orders/2026-11-24/")   # a key + one column per property
    report = publish_dataframe(
        orders, "postgresql://…/box", job="orders-2026-11-24", key="order_id",
        body="payload",
    )
    print(report)            # published, skipped, routed, suspended, dropped, batches, s

Every row of the frame becomes one message, published and routed exactly as
:meth:`MessageBox.publish <messagebox.engine.MessageBox.publish>` publishes it. The frame
is in the *wide* layout of :mod:`messagebox.pipelines.spark`: a key column, one column per
promoted property named ``namespace.Name`` (or picked and renamed with
``properties={"column": "ns.Name"}``; by default every column but the key and the body),
a null being an absent property. Property columns may be strings, integers, floats,
decimals, booleans and timestamps (instants); ``timestamp_ntz``, dates, binary and
nested types are refused naming the column. ``body`` names a binary or string column
(a string is stored as UTF-8); a null body, or no ``body``, is an empty body.

**Message ids and idempotency.** A job has a name, ``job``; its rows are published
under the receipt location ``spark:<job>``. A row's message id is derived from the job
and its key: ``uuid5(NAMESPACE, "spark:<job>" + "\\0" + str(key))`` (see
:func:`message_id`), and each message is published with a receipt
``("spark:<job>", str(key))`` in the publish's own transaction. Before a batch is
published the keys already recorded are taken out of it (counted as ``skipped``); a key
recorded in the meantime (a concurrent run of the job, a speculative or retried Spark
task) makes the publish store nothing and is taken out in turn. So:

- re-running a job with the same ``job`` name publishes only the rows no earlier run
  published: after a failure, fix the data (or the database) and run the same job again
  until it succeeds; no message is ever stored twice;
- a key is published once per job: a re-run does not publish a row again because its
  data changed. Use a new job name for new data (``orders-2026-11-25``);
- the guarantee lasts as long as the receipts: cleanup trims them after 7 days
  (:data:`messagebox.delivery.cleanup.RECEIPT_RETENTION_SECONDS`). Re-running a job later than that
  publishes again the rows whose messages cleanup removed, and fails on a message still
  stored (its id exists).

Keys must be unique and non-null: a first pass over the frame checks it (and names the
culprit) before anything is published; ``validate=False`` skips that pass (a duplicate
key's later rows are then counted as skipped). Key columns are strings or integers.

**Batches and failures.** Rows are published ``batch_size`` at a time, each batch in one
transaction. A message the engine refuses (a promoted string over 256 characters, a
NaN, an integral decimal beyond 64 bits, a routing failure under ``policy="raise"``)
fails its batch with nothing of it stored, and stops its partition; batches published
before stay published. The error raised names the job, the partition and the message
key, and says how many messages were published; run the job again after fixing the
cause. Bad input found before publishing (a missing, null or duplicate key, a column of
an unsupported type, a column name that is no property name, a reserved ``messagebox.``
/ ``BTS.`` property without ``trusted=True``) stores nothing.

**Where it runs.**

- *PostgreSQL*: the partitions publish in parallel on the executors, each opening its
  own connection to ``url`` (reachable from them), in a Python that imports messagebox
  (:mod:`messagebox.pipelines.spark_session`). A partition that fails does not stop the
  others; the first failure is raised once all have finished.
- *DuckDB* (one process per file): the rows come to the driver a partition at a time
  (``toLocalIterator``; the executors run no Python) and are published from there; the
  first failure stops the job. ``parallel=False`` does the same on PostgreSQL.

Progress is logged on the ``messagebox.spark`` logger: a line per partition (on the
driver; on the executors a partition also logs its batches at DEBUG level) and one for
the job. The frame is read twice when ``validate`` is on: cache it if computing it is
costly or not repeatable.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import groupby, islice
from typing import TYPE_CHECKING, Any

from messagebox import errors
from messagebox.engine import MessageBox
from messagebox.errors import (
    AlreadyExists,
    AlreadyReceived,
    MessageBoxError,
    MessageValidationError,
    ValidationError,
)
from messagebox.message import Message
from messagebox.models import RoutingPolicy
from messagebox.pipelines.spark import column, property_columns, typed_value
from messagebox.pipelines.spark_report import Counts, PartitionOutcome, describe
from messagebox.pipelines.spark_report import PartitionReport as PartitionReport  # its API
from messagebox.pipelines.spark_report import PublishReport as PublishReport
from messagebox.pipelines.spark_session import python_on_executors
from messagebox.properties import is_reserved

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

NAMESPACE = uuid.UUID("4b20b22e-4598-46e2-b37d-e9db3ddd6907")
"""The UUID namespace of the message ids a Spark publish derives."""

LOCATION_PREFIX = "spark:"
"""A job's receipts are recorded under the location ``spark:<job>``."""

MAX_JOB_NAME = 200
MAX_BATCH_SIZE = 100_000

logger = logging.getLogger("messagebox.spark")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def location(job: str) -> str:
    """The receipt location of a job's messages."""
    return LOCATION_PREFIX + job


def key_text(key: object) -> str:
    """A key as its receipt records it (and its message id is derived from)."""
    return key if isinstance(key, str) else str(key)


def message_id(job: str, key: object) -> uuid.UUID:
    """The id of the message a job publishes for a key."""
    return uuid.uuid5(NAMESPACE, f"{location(job)}\x00{key_text(key)}")


# --- the plan: what the executors need, picklable ---


@dataclass(frozen=True)
class _Plan:
    url: str
    job: str
    names: tuple[str, ...]
    """The property name of each property column, in row order (after key and body)."""
    timestamps: frozenset[int]
    """Property columns (by position) that arrive as epoch microseconds."""
    has_body: bool
    batch_size: int
    policy: RoutingPolicy
    trusted: bool
    times: tuple[str, ...] = ()
    """``deliver_at``, ``expires_at``: the times each row gives (epoch microseconds, in
    this order after key and body)."""

    @property
    def location(self) -> str:
        return location(self.job)

    def message(self, key: str, row: Sequence[Any]) -> Message:
        first = (2 if self.has_body else 1) + len(self.times)
        body = row[1] if self.has_body and row[1] is not None else b""
        at = first - len(self.times)
        times = {
            name: None if row[at + i] is None else _EPOCH + timedelta(microseconds=row[at + i])
            for i, name in enumerate(self.times)
        }
        deliver_at, expires_at = times.get("deliver_at"), times.get("expires_at")
        promoted = {}
        for i, name in enumerate(self.names):
            value = row[first + i]
            if value is None:
                continue
            if i in self.timestamps:
                value = _EPOCH + timedelta(microseconds=value)
            promoted[name] = value
        if "\x00" in key:
            raise MessageValidationError("the key contains a NUL character")
        return Message(
            body,
            promoted=promoted,
            id=message_id(self.job, key),
            deliver_at=deliver_at,
            expires_at=expires_at,
        )


# --- one partition ---


def _error(cls: type[MessageBoxError], text: str) -> MessageBoxError:
    """An error of class ``cls`` (or the root, if ``cls`` needs more arguments)."""
    try:
        return cls(text)
    except TypeError:
        return MessageBoxError(text)


def _renamed(exc: MessageBoxError, text: str) -> MessageBoxError:
    return _error(type(exc), text)


def _publish_batch(box: MessageBox, plan: _Plan, rows: Sequence[Any], counts: Counts) -> None:
    """Publish one batch in one transaction, leaving out the keys already recorded."""
    keys = [key_text(r[0]) for r in rows]
    recorded = box.receipts(plan.location, keys)
    todo: list[tuple[str, Any, Message]] = []  # (key text, key, message)
    for text, row in zip(keys, rows, strict=True):
        if text in recorded:
            continue
        try:
            todo.append((text, row[0], plan.message(text, row)))
        except MessageBoxError as exc:
            raise _renamed(exc, f"message key {row[0]!r}: {exc}") from exc
    counts.skipped += len(rows) - len(todo)
    while todo:
        try:
            results = box.publish(
                [m for _, _, m in todo],
                policy=plan.policy,
                trusted=plan.trusted,
                receipts=[(plan.location, t, [i]) for i, (t, _, _) in enumerate(todo)],
            )
        except (AlreadyReceived, AlreadyExists) as exc:
            # recorded since the check (a concurrent run, a speculative task): take out
            # what is recorded now and publish the rest; nothing of the attempt was stored
            now = box.receipts(plan.location, [t for t, _, _ in todo])
            if not now:
                raise _renamed(
                    exc,
                    f"keys {todo[0][1]!r}…{todo[-1][1]!r}: {exc} (no receipt names these "
                    "keys, yet a message id of the batch is stored already: receipts are "
                    "trimmed after 7 days, and this job ran earlier than that)",
                ) from exc
            todo = [x for x in todo if x[0] not in now]
            counts.skipped += len(now)
            continue
        except MessageBoxError as exc:
            text = str(exc)
            named = [k for _, k, m in todo if str(m.id) in text]
            where = f"message key {named[0]!r}" if named else f"keys {todo[0][1]!r}…{todo[-1][1]!r}"
            raise _renamed(exc, f"{where}: {text}") from exc
        counts.add(results)
        return


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def _publish_partition(
    plan: _Plan, index: int, rows: Iterable[Any], box: MessageBox | None = None
) -> PartitionOutcome:
    """Publish a partition's rows batch by batch; stop at the first refused batch.

    Opens (and closes) its own MessageBox unless given one."""
    start = time.monotonic()
    counts = Counts()
    own = box is None
    error: tuple[str, str] | None = None
    try:
        if box is None:
            publisher = f"{location(plan.job)} ({socket.gethostname()}:{os.getpid()})"
            box = MessageBox(plan.url, publisher=publisher)
        for batch in _chunks(rows, plan.batch_size):
            counts.rows += len(batch)
            _publish_batch(box, plan, batch, counts)
            logger.debug(
                "job %r partition %d: %d rows read, %d published",
                plan.job,
                index,
                counts.rows,
                counts.published,
            )
    except MessageBoxError as exc:
        # returned, not raised: the driver raises it with the job's report, and Spark
        # does not retry a task that would fail the same way
        error = (type(exc).__name__, f"partition {index}, {exc}")
    finally:
        if own and box is not None:
            box.close()
    report = counts.report(index, time.monotonic() - start)
    logger.info("%s", describe(plan.job, report, error))
    return PartitionOutcome(report, error)


def _run_partition(plan: _Plan, index: int, rows: Iterable[Any]) -> Iterator[PartitionOutcome]:
    yield _publish_partition(plan, index, rows)


# --- the driver ---


def _check_options(job: object, batch_size: object, policy: str) -> tuple[str, RoutingPolicy]:
    """The job name and the routing policy, checked with the batch size."""
    if not isinstance(job, str) or not job.strip() or len(job) > MAX_JOB_NAME or "\x00" in job:
        raise ValidationError(
            f"job name {job!r} must be a non-empty str of at most {MAX_JOB_NAME} characters "
            "(it names the run: re-running a job with the same name is idempotent)"
        )
    if type(batch_size) is not int or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationError(f"batch_size must be an int in 1..{MAX_BATCH_SIZE}")
    try:
        return job, RoutingPolicy(policy)
    except ValueError as exc:
        raise ValidationError(
            f"policy must be 'suspend', 'drop' or 'raise', not {policy!r}"
        ) from exc


def _plan_columns(
    df: DataFrame,
    key: str,
    body: str | None,
    properties: Sequence[str] | Mapping[str, str] | None,
    trusted: bool,
    times: Mapping[str, str],
) -> tuple[list[Any], tuple[str, ...], frozenset[int]]:
    """The columns to select (key, body, times, properties), the property names and
    which property columns are timestamps; every type and name checked."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    types: dict[str, DataType] = {f.name: f.dataType for f in df.schema.fields}
    if key not in types:
        raise ValidationError(f"no key column {key!r}; the frame has {df.columns}")
    integral = T.ByteType | T.ShortType | T.IntegerType | T.LongType
    text = T.StringType | T.VarcharType | T.CharType
    if not isinstance(types[key], integral | text):
        raise ValidationError(
            f"key column {key!r} has type {types[key].simpleString()}: keys are strings or integers"
        )
    selected = [column(key).alias("_k")]
    if body is not None:
        if body not in types:
            raise ValidationError(f"no body column {body!r}; the frame has {df.columns}")
        if not isinstance(types[body], T.BinaryType | text):
            raise ValidationError(
                f"body column {body!r} has type {types[body].simpleString()}: bodies are "
                "binary or string"
            )
        selected.append(column(body).alias("_b"))
    for what, name in times.items():  # instants, as epoch microseconds
        if not isinstance(types.get(name), T.TimestampType):
            raise ValidationError(
                f"{what} column {name!r} must be a timestamp (an instant), not "
                + (types[name].simpleString() if name in types else "missing")
            )
        selected.append(F.unix_micros(column(name)).alias(f"_{what}"))
    chosen = properties
    if chosen is None:
        chosen = [c for c in df.columns if c not in (key, body, *times.values())]
    try:
        columns = property_columns(df, key, chosen)
    except ValidationError as exc:
        if properties is not None or body is not None:
            raise
        raise ValidationError(f"{exc}; if it holds the bodies, name it with body=") from exc
    names = []
    stamps = set()
    for i, (col, name) in enumerate(columns.items()):
        if is_reserved(name) and not trusted:
            raise ValidationError(
                f"column {col!r} is property {name}, in the reserved namespace messagebox. "
                "(alias BTS.): only a trusted publisher may set it (trusted=True)"
            )
        # refuses the types no property can have, in route_dataframe's words
        typed_value(column(col), types[col], repr(col), column(key))
        c = column(col)
        if isinstance(types[col], T.TimestampType):
            c = F.unix_micros(c)  # an exact instant, whatever the session time zone
            stamps.add(i)
        selected.append(c.alias(f"_p{i}"))
        names.append(name)
    return selected, tuple(names), frozenset(stamps)


def _check_keys(df: DataFrame, key: str) -> None:
    """Refuse a null or duplicate key, naming it (one aggregation over the frame)."""
    from pyspark.sql import functions as F

    k = column(key)
    bad = (
        df.groupBy(k.alias("_k"))
        .count()
        .where(F.col("_k").isNull() | (F.col("count") > 1))
        .orderBy(F.col("_k").isNotNull())  # a null key first
        .first()
    )
    if bad is None:
        return
    if bad["_k"] is None:
        raise ValidationError(
            f"key column {key!r} is null in {bad['count']} rows; nothing was published"
        )
    raise ValidationError(
        f"message key {bad['_k']!r} appears {bad['count']} times in {key!r}; keys must be "
        "unique; nothing was published"
    )


def _publish_rows(
    plan: _Plan, rows: DataFrame, box: MessageBox, executors: bool
) -> list[PartitionOutcome]:
    """Publish the selected rows partition by partition, from the executors (each
    partition on its own) or from the driver (stopping at the first failed partition;
    the executors then run no Python)."""
    from pyspark.sql import functions as F

    logger.info(
        "job %r: publishing %d partitions from the %s, %d rows a batch",
        plan.job,
        rows.rdd.getNumPartitions(),
        "executors" if executors else "driver",
        plan.batch_size,
    )
    if executors:
        run = rows.rdd.mapPartitionsWithIndex(partial(_run_partition, plan))
        with python_on_executors(rows.sparkSession, f"spark job {plan.job!r}"):
            outcomes: list[PartitionOutcome] = run.collect()
        for o in outcomes:
            logger.info("%s", describe(plan.job, o.report, o.error))
        return outcomes
    outcomes = []
    stream = rows.select(F.spark_partition_id(), "*").toLocalIterator(prefetchPartitions=True)
    for index, group in groupby(stream, key=lambda r: int(r[0])):
        outcomes.append(_publish_partition(plan, index, (r[1:] for r in group), box))
        if outcomes[-1].error is not None:
            break
    return outcomes


def _failure(
    job: str, report: PublishReport, failed: Sequence[PartitionOutcome]
) -> MessageBoxError:
    """The first failed partition's error (of its class), with the job's report noted."""
    name, text = failed[0].error or ("", "")
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, MessageBoxError)):
        cls = MessageBoxError
    failure = _error(cls, f"spark job {job!r}: {text}")
    if len(failed) > 1:
        failure.add_note(f"{len(failed) - 1} more partitions failed")
    failure.add_note(
        f"{report}; what was published stays: fix the cause and run job {job!r} "
        "again to publish the rest"
    )
    return failure


def publish_dataframe(
    df: DataFrame,
    url: str | MessageBox,
    *,
    job: str,
    key: str = "key",
    body: str | None = None,
    properties: Sequence[str] | Mapping[str, str] | None = None,
    batch_size: int = 1000,
    policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
    trusted: bool = False,
    parallel: bool | None = None,
    validate: bool = True,
    deliver_at: str | None = None,
    expires_at: str | None = None,
) -> PublishReport:
    """Publish every row of ``df`` as one message into the MessageBox at ``url`` (a URL,
    or a MessageBox whose URL the executors open), idempotently under the name ``job``
    (see the module docstring).

    ``key`` is the key column; ``body`` the body column (binary or string; none: empty
    bodies); ``properties`` picks the property columns, or renames them with a mapping of
    column to property name (by default every column but the key and the body).
    ``batch_size`` rows are published per transaction; ``policy`` and ``trusted`` are
    :meth:`MessageBox.publish <messagebox.engine.MessageBox.publish>`'s. ``parallel``
    publishes from the executors (the default where the database allows several
    processes, PostgreSQL) or from the driver (False; DuckDB always). ``validate``
    checks first that keys are unique and not null. ``deliver_at`` and ``expires_at``
    name timestamp columns: each row's message is due, and expires, then (a null: not
    scheduled, no expiry; docs/concepts.md: Scheduled delivery, Expiry).

    Returns the report; raises the first refusal (a
    :class:`~messagebox.errors.MessageBoxError` naming the partition and the key) after
    the other partitions are done, with what was published in a note.
    """
    start = time.monotonic()
    job, routing = _check_options(job, batch_size, policy)
    times = {k: v for k, v in (("deliver_at", deliver_at), ("expires_at", expires_at)) if v}
    selected, names, stamps = _plan_columns(df, key, body, properties, trusted, times)
    box = url if isinstance(url, MessageBox) else MessageBox(url)  # creates the schema once
    try:
        one_process = box.one_process
        if parallel and one_process:
            raise ValidationError(
                f"{box.backend} allows one process per database: the executors "
                "cannot publish; leave parallel unset (the driver publishes)"
            )
        executors = not one_process if parallel is None else parallel
        plan = _Plan(
            url=box.url.render_as_string(hide_password=False),
            job=job,
            names=names,
            timestamps=stamps,
            has_body=body is not None,
            times=tuple(times),
            batch_size=batch_size,
            policy=routing,
            trusted=trusted,
        )
        if validate:
            _check_keys(df, key)
        outcomes = _publish_rows(plan, df.select(*selected), box, executors)
    finally:
        if box is not url:
            box.close()
    report = PublishReport.of(
        job, [o.report for o in outcomes], time.monotonic() - start, executors
    )
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        failure = _failure(job, report, failed)
        logger.error("%s", failure)
        raise failure
    logger.info("%s", report)
    return report
