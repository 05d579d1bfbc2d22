"""What-if routing: which stored messages would change destination under proposed
subscriptions (docs/howto-spark.md).

    from messagebox.pipelines.whatif import what_if

    report = what_if(box, {"ship-eu": P("orders.Region").in_(["EU", "UK"])}, spark=spark)
    report.changes.show()        # message_id, before, after, added, removed
    print(report.summary)        # messages evaluated, changed, gained/lost per service

The stored messages are exported from the spool (their promoted properties, in the long
layout of :mod:`messagebox.pipelines.spark`) and routed once, in one Spark job, against the current
subscriptions and the proposed ones together. A destination is a *service*: by default
the proposed subscriptions replace the current ones of the services they name (a
service with no proposed subscription keeps its own); with ``replace_all=True`` the
proposed set is the whole new set. Proposals are given as for
:func:`~messagebox.pipelines.spark.load_subscriptions`: a mapping of service to filter, a JSON file,
another MessageBox's URL, or subscriptions. Nothing is stored or changed.

The export is Parquet that the executors read: in a temporary folder of the driver on a
``local`` master; on a cluster, in ``staging=`` (or the Spark setting
``spark.messagebox.staging``), a location every executor reads (:func:`export_messages`).
A message with no promoted property has no rows in the export and is not evaluated.
"""

from __future__ import annotations

import atexit
import logging
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from messagebox.errors import ValidationError
from messagebox.pipelines.spark import Target, load_subscriptions, route_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from messagebox.engine import MessageBox

EXPORT_CHUNK = 50_000
"""Spool rows read, decoded and written to Parquet at a time."""

STAGING_CONF = "spark.messagebox.staging"
"""The Spark setting that gives :func:`export_messages` its default staging location
(``--conf spark.messagebox.staging=hdfs:///tmp/messagebox`` on the command line)."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

logger = logging.getLogger("messagebox.spark")

_VALUE_COLUMNS = ("value_str", "value_int", "value_float", "value_bool", "value_ts")


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("message_id", pa.string()),
            ("property", pa.string()),
            ("value_str", pa.string()),
            ("value_int", pa.int64()),
            ("value_float", pa.float64()),
            ("value_bool", pa.bool_()),
            ("value_ts", pa.timestamp("us", tz="UTC")),
        ]
    )


def export_messages(
    box: MessageBox | None,
    spark: SparkSession,
    path: str | Path | None = None,
    *,
    staging: str | Path | None = None,
    chunk: int = EXPORT_CHUNK,
    progress: Any = None,
    pages: Iterable[Sequence[tuple[Any, Mapping[str, Any]]]] | None = None,
) -> DataFrame:
    """The promoted properties of every stored message (or of ``pages`` of (id,
    properties)), as a long frame keyed by ``message_id``, written as Parquet to
    ``path`` (kept), or else to a new folder under ``staging`` (removed when the process
    exits). ``progress(n)`` is called with the count so far.

    The executors read the files: on a cluster they must be on storage they share. A
    local path is written by the driver; a URL (``hdfs://…``, ``s3a://…``,
    ``file://…``) by the executors, from the chunks the driver sends them. ``staging``
    defaults to the session's :data:`STAGING_CONF` setting, else, on a ``local``
    master, to the temporary folder; on a cluster, one of the two must be given."""
    target = str(path) if path is not None else _staging_folder(spark, staging)
    if pages is None:
        if box is None:
            raise ValueError("export_messages needs a MessageBox or pages")
        pages = box.iter_promoted(chunk)
    n = written = 0
    for rows in pages:
        _write(spark, _table(rows), target, written)
        written += 1
        n += len(rows)
        if progress is not None:
            progress(n)
    if not written:
        _write(spark, _arrow_schema().empty_table(), target, 0)
    return spark.read.parquet(target)


def _table(rows: Sequence[tuple[Any, Mapping[str, Any]]]) -> Any:
    """A page of (id, properties) as an Arrow table of the long layout."""
    import pyarrow as pa

    arrow_schema = _arrow_schema()
    cols: dict[str, list[Any]] = {name: [] for name in arrow_schema.names}
    for message_id, promoted in rows:
        for name, value in promoted.items():
            cols["message_id"].append(str(message_id))
            cols["property"].append(name)
            slot = _slot(value)
            for column in _VALUE_COLUMNS:
                cols[column].append(value if column == slot else None)
    return pa.table(cols, schema=arrow_schema)


def _write(spark: SparkSession, table: Any, target: str, part: int) -> None:
    """Write one page: a URL through Spark (the executors write), a path with pyarrow."""
    import pyarrow.parquet as pq

    if _URL.match(target):
        mode = "append" if part else "overwrite"
        spark.createDataFrame(table).write.mode(mode).parquet(target)
        return
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"part-{part:05d}.parquet")


def _staging_folder(spark: SparkSession, staging: str | Path | None) -> str:
    """A new folder under ``staging`` (or its default), removed when the process exits."""
    base = staging if staging is not None else spark.conf.get(STAGING_CONF, None)
    if base is None:
        master = str(spark.sparkContext.master)
        if not master.startswith("local"):
            raise ValidationError(
                f"on {master} the executors read the exported messages: give staging= "
                f"(or the Spark setting {STAGING_CONF}) a URL or folder they all read "
                "(hdfs://…, s3a://…, a shared mount); the driver's temporary folder is its own"
            )
        folder = tempfile.mkdtemp(prefix="messagebox-export-")
        atexit.register(shutil.rmtree, folder, True)
        return folder
    name = f"messagebox-export-{uuid.uuid4().hex}"
    if _URL.match(str(base)):
        url = str(base).rstrip("/") + "/" + name
        _remove_at_exit(spark, url)
        return url
    atexit.register(shutil.rmtree, Path(base) / name, True)
    return str(Path(base) / name)


def _remove_at_exit(spark: SparkSession, url: str) -> None:
    """Delete ``url`` when the process exits, through the Hadoop file system Spark
    writes it with (the JVM outlives a stopped session)."""
    sc: Any = spark.sparkContext
    path = sc._jvm.org.apache.hadoop.fs.Path(url)
    atexit.register(_delete, path.getFileSystem(sc._jsc.hadoopConfiguration()), path, url)


def _delete(fs: Any, path: Any, url: str) -> None:
    try:
        fs.delete(path, True)
    except Exception as exc:  # at exit, with the JVM perhaps gone: say what is left
        logger.warning("what-if: could not remove the export %s: %s", url, exc)


def _slot(value: object) -> str:
    if isinstance(value, bool):
        return "value_bool"
    if isinstance(value, int):
        return "value_int"
    if isinstance(value, float):
        return "value_float"
    if isinstance(value, str):
        return "value_str"
    return "value_ts"


@dataclass(frozen=True)
class WhatIfSummary:
    """Counts of a what-if run."""

    messages: int
    changed: int
    gained: dict[str, int] = field(default_factory=dict)
    """Per service, the messages it would receive that it does not now."""
    lost: dict[str, int] = field(default_factory=dict)
    """Per service, the messages it receives now and would not."""

    def __str__(self) -> str:
        lines = [f"{self.changed:,} of {self.messages:,} stored messages would change destination"]
        services = sorted(self.gained.keys() | self.lost.keys())
        if services:
            width = max(len(s) for s in services)
            lines.append(f"  {'service':<{width}}  {'gains':>9}  {'loses':>9}")
            for s in services:
                lines.append(
                    f"  {s:<{width}}  {self.gained.get(s, 0):>9,}  {self.lost.get(s, 0):>9,}"
                )
        return "\n".join(lines)


@dataclass(frozen=True)
class WhatIf:
    """The messages whose destinations would change, and the counts."""

    changes: DataFrame
    """``message_id, before, after, added, removed`` (sorted arrays of services)."""
    summary: WhatIfSummary


def what_if(
    box: MessageBox,
    proposed: Any,
    *,
    spark: SparkSession,
    replace_all: bool = False,
    messages: DataFrame | None = None,
    staging: str | Path | None = None,
) -> WhatIf:
    """Route the stored messages (or ``messages``, a long frame keyed by
    ``message_id``) under the current and the proposed subscriptions; see the module
    docstring. The stored messages are exported under ``staging`` (see
    :func:`export_messages`: on a cluster, storage every executor reads)."""
    from pyspark.sql import functions as F

    current = load_subscriptions(box)
    new = load_subscriptions(proposed)
    if not replace_all:
        named = {t.service for t in new}
        new = [t for t in current if t.service not in named] + new
    # one routing pass: current targets keep their ids, proposed ones get fresh ids
    offset = max((t.id for t in current), default=0) + 1
    both = current + [replace(t, id=offset + i) for i, t in enumerate(new)]
    frame = messages if messages is not None else export_messages(box, spark, staging=staging)
    routes = route_dataframe(frame, both, key="message_id", layout="long", validate=False)
    side = F.when(F.col("subscription") >= offset, "after").otherwise("before")
    per_message = (
        routes.withColumn("side", side)
        .groupBy("message_id")
        .agg(
            F.array_sort(F.collect_set(F.when(F.col("side") == "before", F.col("service")))).alias(
                "before"
            ),
            F.array_sort(F.collect_set(F.when(F.col("side") == "after", F.col("service")))).alias(
                "after"
            ),
        )
    )
    changes = (
        per_message.where(F.col("before") != F.col("after"))
        .withColumn("added", F.array_except("after", "before"))
        .withColumn("removed", F.array_except("before", "after"))
    ).cache()
    gained = _per_service(changes, "added")
    lost = _per_service(changes, "removed")
    summary = WhatIfSummary(
        messages=frame.select("message_id").distinct().count(),
        changed=changes.count(),
        gained=gained,
        lost=lost,
    )
    return WhatIf(changes, summary)


def _per_service(changes: DataFrame, column: str) -> dict[str, int]:
    from pyspark.sql import functions as F

    rows = changes.select(F.explode(column).alias("service")).groupBy("service").count().collect()
    return {r["service"]: int(r["count"]) for r in rows}


def spark_router(spark: SparkSession, staging: str | Path | None = None) -> Any:
    """A router for :meth:`~messagebox.engine.MessageBox.plan` that routes the window's
    messages on Spark, both sets of subscriptions in one job, and brings back only the
    messages whose destinations differ (exported under ``staging``: see
    :func:`export_messages`)."""

    def route(
        pages: Iterable[Sequence[tuple[Any, Mapping[str, Any]]]],
        before: Sequence[tuple[str, Any]],
        after: Sequence[tuple[str, Any]],
    ) -> Iterator[tuple[uuid.UUID, frozenset[str], frozenset[str]]]:
        from pyspark.sql import functions as F

        frame = export_messages(None, spark, staging=staging, pages=pages)
        offset = len(before) + 1
        targets = [Target(i, name, f, name=name) for i, (name, f) in enumerate(before, 1)]
        targets += [Target(offset + i, name, f, name=name) for i, (name, f) in enumerate(after)]
        routes = route_dataframe(frame, targets, key="message_id", layout="long", validate=False)
        old = F.col("subscription") < offset
        per_message = routes.groupBy("message_id").agg(
            F.array_sort(F.collect_set(F.when(old, F.col("name")))).alias("before"),
            F.array_sort(F.collect_set(F.when(~old, F.col("name")))).alias("after"),
        )
        for row in per_message.where(F.col("before") != F.col("after")).toLocalIterator():
            yield uuid.UUID(row["message_id"]), frozenset(row["before"]), frozenset(row["after"])

    route.name = "spark"  # type: ignore[attr-defined]
    return route


__all__ = [
    "STAGING_CONF",
    "Target",
    "WhatIf",
    "WhatIfSummary",
    "export_messages",
    "spark_router",
    "what_if",
]
