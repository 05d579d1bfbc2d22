"""Batch routing on Spark (docs/howto-spark.md): the same filters over a DataFrame of messages.

    from messagebox.pipelines.spark import route_dataframe, session

    spark = session()                                   # local[*]; session("spark://…")
    orders = spark.read.parquet("orders/")              # key + one column per property
    routes = route_dataframe(orders, "postgresql://…/box", key="order_id")
    routes.write.partitionBy("subscription").parquet("routes/")

The result has one row per (message, matching subscription): the key column, then
``subscription`` (id), ``name``, ``service``, ``host``. It is identical to what the SQL
router finds for the same messages (``MessageBox.would_route``): the algorithm is the
counting algorithm as one broadcast join (see :mod:`messagebox.predicates.spark`), with no Python
UDF on the path.

Messages come in one of two layouts:

- **wide**: one row per message, a key column and one column per promoted property,
  named ``namespace.Name`` (or renamed with ``properties={"column": "ns.Name"}``). A null
  is an absent property. Column types: strings, integers, floats, decimals, booleans and
  timestamps (instants); ``timestamp_ntz``, dates and nested types are refused.
- **long**: one row per (message, property): a key column, a ``property`` column of
  names and one or more value columns (``value``, or e.g. ``value_str``, ``value_int``:
  several typed columns let one property hold values of several families). At most one
  value column of a row may be non-null; a row whose values are all null is an absent
  property. A message is known by its rows.

Subscriptions come from a MessageBox (its URL, or the object: every enlisted
subscription), or are given: a mapping of name to filter (or ``P`` expression), or a
list of :class:`~messagebox.models.Subscription` or :class:`Target`.

Bad input is refused with :class:`~messagebox.errors.ValidationError` naming the column
when the plan is built (a type, a name), or, for bad values (NaN, a null key, a promoted
string over 256 characters, an invalid property name in a long frame), by the Spark job
with an error message naming the column and the message key. Only the columns some
subscription tests are read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from messagebox.errors import ValidationError
from messagebox.models import State, Subscription
from messagebox.pipelines.spark_session import HUGE_METHODS as HUGE_METHODS
from messagebox.pipelines.spark_session import session as session
from messagebox.predicates.model import Filter
from messagebox.predicates.spark import (
    PredicateTable,
    TypedValue,
    base_probe,
    local_frame,
    probes,
)
from messagebox.properties import (
    INT64_MAX,
    INT64_MIN,
    MAX_NAME_LENGTH,
    MAX_PROMOTED_STRING,
    Family,
    canonical_name,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType


Layout = Literal["auto", "wide", "long"]

OUTPUT_COLUMNS = ("subscription", "name", "service", "host")
"""What :func:`route_dataframe` adds to the key column, in this order."""


@dataclass(frozen=True)
class Target:
    """A subscription as batch routing sees it."""

    id: int
    service: str
    filter: Filter
    name: str | None = None
    host: str | None = None

    @classmethod
    def of(cls, sub: Subscription) -> Target:
        return cls(sub.id, sub.service, sub.filter, sub.name, sub.host)


def load_subscriptions(source: Any) -> list[Target]:
    """Targets from a MessageBox URL or object (its enlisted subscriptions), a JSON file
    (a list of ``{"name", "service", "host", "filter"}``, the filter in its JSON form),
    a mapping of name to filter, or subscriptions."""
    from messagebox.engine import MessageBox

    if isinstance(source, str | Path) and not _is_url(str(source)):
        return _from_json_file(Path(source))
    if isinstance(source, str):
        box = MessageBox(source)
        try:
            return load_subscriptions(box)
        finally:
            box.close()
    if isinstance(source, MessageBox):
        return [Target.of(s) for s in source.subscriptions() if s.state != State.UNENLISTED]
    if isinstance(source, Mapping):
        return [
            Target(i, str(name), Filter.of(expr), name=str(name))
            for i, (name, expr) in enumerate(source.items(), start=1)
        ]
    targets: list[Target] = []
    for item in source:
        if isinstance(item, Subscription):
            if item.state != State.UNENLISTED:
                targets.append(Target.of(item))
        elif isinstance(item, Target):
            targets.append(item)
        else:
            raise ValidationError(
                f"subscriptions: expected a Subscription or Target, got {type(item).__name__}"
            )
    if len({t.id for t in targets}) != len(targets):
        raise ValidationError("subscriptions: two targets share one id")
    return targets


def _is_url(text: str) -> bool:
    return "://" in text


def _from_json_file(path: Path) -> list[Target]:
    try:
        items = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError(f"subscriptions file {path}: {exc}") from exc
    if not isinstance(items, list):
        raise ValidationError(f"subscriptions file {path}: expected a JSON list of objects")
    targets = []
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict) or "filter" not in item:
            raise ValidationError(f"subscriptions file {path}: item {i} has no 'filter'")
        name = item.get("name")
        service = item.get("service") or name
        if not service:
            raise ValidationError(f"subscriptions file {path}: item {i} needs a name or service")
        filt = Filter.from_json(json.dumps(item["filter"]))
        targets.append(Target(i, str(service), filt, name=name, host=item.get("host")))
    return targets


# --- typed values: a column of a supported type as the SQL router's encoding ---


def column(name: str) -> Column:
    """A column by its exact name (dots are part of it, not struct access)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _fail(text: str, key: Column) -> Column:
    """Raise, from the Spark job, an error naming the message key."""
    from pyspark.sql import functions as F

    return F.raise_error(
        F.concat(
            F.lit(f"messagebox: {text} (message key "),
            F.coalesce(key.cast("string"), F.lit("null")),
            F.lit(")"),
        )
    )


def _exact_pair(x: Column) -> tuple[Column, Column]:
    """``(hi, lo)`` of a bigint column, exactly (:func:`messagebox.properties.exact_pair`)."""
    from pyspark.sql import functions as F

    hi = x.cast("double")
    two62 = F.lit(2**62)
    lo = F.when(hi >= F.lit(float(2**63)), (x - two62) - two62).otherwise(x - hi.cast("bigint"))
    return hi, lo.cast("double")


def typed_value(c: Column, dtype: DataType, label: str, key: Column) -> TypedValue:
    """The typed encoding of a column's values, checked as a publish would check them.
    Raises ``ValidationError`` for a type no property can have."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    null_str = F.lit(None).cast("string")
    null_dbl = F.lit(None).cast("double")
    null_int = F.lit(None).cast("bigint")
    present = c.isNotNull()

    def fam(f: Family) -> Column:
        return F.when(present, F.lit(int(f)))

    if isinstance(dtype, T.StringType | T.VarcharType | T.CharType):
        checked = (
            F.when(
                F.char_length(c) > MAX_PROMOTED_STRING,
                _fail(
                    f"property {label}: promoted string is longer than "
                    f"{MAX_PROMOTED_STRING} characters",
                    key,
                ),
            )
            .when(F.instr(c, "\x00") > 0, _fail(f"property {label}: NUL in a string", key))
            .otherwise(c)
        )
        return TypedValue(fam(Family.STR), checked, null_dbl, null_dbl, null_int)
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        x = c.cast("bigint")
        hi, lo = _exact_pair(x)
        return TypedValue(fam(Family.NUM), null_str, hi, lo, x)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        x = c.cast("double")
        finite = F.when(
            F.isnan(x) | (F.abs(x) == F.lit(float("inf"))),
            _fail(f"property {label}: float is not finite", key),
        ).otherwise(x + F.lit(0.0))  # + 0.0 folds -0.0 into 0.0
        return TypedValue(fam(Family.NUM), null_str, finite, F.when(present, 0.0), null_int)
    if isinstance(dtype, T.BooleanType):
        hi = F.when(present, F.when(c, 1.0).otherwise(0.0))
        return TypedValue(fam(Family.BOOL), null_str, hi, F.when(present, 0.0), null_int)
    if isinstance(dtype, T.TimestampType):
        hi, lo = _exact_pair(F.unix_micros(c))
        return TypedValue(fam(Family.DATETIME), null_str, hi, lo, null_int)
    if isinstance(dtype, T.DecimalType):
        return _decimal(c, dtype, label, key, fam(Family.NUM))
    if isinstance(dtype, T.TimestampNTZType):
        why = "timestamp_ntz has no time zone; properties are aware datetimes: cast to timestamp"
    elif isinstance(dtype, T.DateType):
        why = "a date is not a datetime: cast it to timestamp"
    else:
        why = "use string, integer, float, decimal, boolean or timestamp"
    raise ValidationError(f"column {label} has type {dtype.simpleString()}: {why}")


def _decimal(c: Column, dtype: Any, label: str, key: Column, fam: Column) -> TypedValue:
    """A decimal is an int when integral (it must then fit 64 bits), else a float."""
    from pyspark.sql import functions as F

    if dtype.scale == 0 and dtype.precision <= 18:
        x = c.cast("bigint")
        hi, lo = _exact_pair(x)
        return TypedValue(fam, F.lit(None).cast("string"), hi, lo, x)
    wide = c.cast("decimal(38,18)") if dtype.scale > 0 else c
    integral = F.floor(wide) == wide
    fits = (wide >= F.lit(INT64_MIN)) & (wide <= F.lit(INT64_MAX))
    x = F.when(
        integral,
        F.when(fits, wide.cast("bigint")).otherwise(
            _fail(f"property {label}: integral decimal does not fit in 64 bits", key)
        ),
    )
    ihi, ilo = _exact_pair(x)
    hi = F.when(integral, ihi).otherwise(c.cast("double"))
    lo = F.when(integral, ilo).otherwise(F.when(c.isNotNull(), 0.0))
    return TypedValue(fam, F.lit(None).cast("string"), hi, lo, x)


# --- routing ---


def route_dataframe(
    df: DataFrame,
    subscriptions: Any,
    *,
    key: str = "key",
    layout: Layout = "auto",
    properties: Sequence[str] | Mapping[str, str] | None = None,
    property: str = "property",
    value: str | Sequence[str] | None = None,
    validate: bool = True,
) -> DataFrame:
    """Route every message of ``df`` (see the module docstring for the layouts):
    ``(key, subscription, name, service, host)``, one row per matching subscription.

    ``properties`` (wide) picks the property columns, or renames them with a mapping of
    column to property name; by default every column but the key is one. ``property``
    and ``value`` (long) name the property column and the value column(s); by default
    ``value`` and every ``value_*`` column. ``validate`` checks, with one extra pass,
    that keys are unique (wide) or that no message gives a property twice (long).
    """
    from pyspark.sql import functions as F

    targets = load_subscriptions(subscriptions)
    if key not in df.columns:
        raise ValidationError(f"no key column {key!r}; the frame has {df.columns}")
    if key in OUTPUT_COLUMNS:
        raise ValidationError(f"the key column may not be called {key!r}: rename it")
    if layout == "auto":
        layout = "long" if property in df.columns and _value_columns(df, value) else "wide"
    table = PredicateTable.compile((t.id, t.filter) for t in targets)
    spark = df.sparkSession
    if layout == "wide":
        probe_rows = _wide_probes(df, key, property_columns(df, key, properties), table)
    elif layout == "long":
        probe_rows = _long_probes(df, key, property, _value_columns(df, value), table, validate)
    else:
        raise ValidationError(f"layout must be 'auto', 'wide' or 'long', not {layout!r}")
    if validate and layout == "wide":
        _check_unique(
            df.groupBy(column(key)).count(), f"message key {{}} appears {{}} times in {key!r}"
        )
    info = local_frame(
        spark,
        [(t.id, t.name, t.service, t.host) for t in targets],
        "subscription BIGINT, name STRING, service STRING, host STRING",
    )
    if probe_rows is None:
        empty = df.select(column(key)).limit(0).crossJoin(info.limit(0))
        return empty.select(column(key), *OUTPUT_COLUMNS)
    from messagebox.predicates.spark import route_probes

    pairs = route_probes(probe_rows, table, spark)
    routed = pairs.join(F.broadcast(info), pairs["_sub"] == info["subscription"])
    return routed.select(F.col("_key").alias(key), *OUTPUT_COLUMNS)


def _check_unique(counts: DataFrame, text: str) -> None:
    from pyspark.sql import functions as F

    dupe = counts.where(F.col("count") > 1).first()
    if dupe is not None:
        *key, n = dupe
        raise ValidationError(
            "messagebox: " + text.format(", ".join(repr(k) for k in key), n) + "; nothing routed"
        )


def property_columns(
    df: DataFrame, key: str, properties: Sequence[str] | Mapping[str, str] | None
) -> dict[str, str]:
    """The property columns of a wide frame, column → canonical property name: those
    ``properties`` names (or renames), by default every column but the key. Raises
    ``ValidationError`` naming a missing column or one that is no property name."""
    if properties is None:
        chosen = {c: c for c in df.columns if c != key}
    elif isinstance(properties, Mapping):
        chosen = dict(properties)
    else:
        chosen = {c: c for c in properties}
    out = {}
    for col, name in chosen.items():
        if col not in df.columns:
            raise ValidationError(f"no column {col!r} in the frame; it has {df.columns}")
        try:
            out[col] = canonical_name(name)
        except ValueError as exc:
            raise ValidationError(
                f"column {col!r}: {exc}; rename it, or pick the property columns with "
                "properties=[...] or {column: 'namespace.Name'}"
            ) from exc
    seen: dict[str, str] = {}
    for col, name in out.items():
        if name in seen:
            raise ValidationError(f"columns {seen[name]!r} and {col!r} are both property {name}")
        seen[name] = col
    return out


def _value_columns(df: DataFrame, value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return [c for c in df.columns if c == "value" or c.startswith("value_")]
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if name not in df.columns:
            raise ValidationError(f"no value column {name!r}; the frame has {df.columns}")
    return names


def _checked_key(key: str) -> Column:
    from pyspark.sql import functions as F

    k = column(key)
    return F.when(k.isNull(), _fail(f"key column {key!r} is null", k)).otherwise(k)


def _probe_rows(staged: DataFrame, pids: Iterable[int], table: PredicateTable) -> DataFrame | None:
    """``(_key, _vals, _probe)`` rows from ``staged``: ``_key`` and a value struct
    ``_p<pid>`` per tested property it has (see :class:`messagebox.predicates.spark.TypedValue`)."""
    from pyspark.sql import functions as F

    have = set(pids)
    structs = [
        p for pid in sorted(have) for p in probes(pid, TypedValue.of(F.col(f"_p{pid}")), table)
    ]
    if table.has_base:
        structs.append(base_probe())
    if not structs:
        return None
    absent = F.lit(None).cast(VALUE_STRUCT)
    vals = F.array(
        *[
            F.col(f"_p{pid}") if pid in have else absent
            for pid in range(1, len(table.properties) + 1)
        ]
    )
    # explode, then drop the nulls (a filter() lambda would turn off generated code)
    exploded = staged.select(
        "_key", vals.alias("_vals"), F.explode(F.array(*structs)).alias("_probe")
    )
    return exploded.where(F.col("_probe").isNotNull())


VALUE_STRUCT = "STRUCT<fam: INT, v_str: STRING, hi: DOUBLE, lo: DOUBLE, v_int: BIGINT>"
"""A tested value in a row's ``_vals`` (null when absent)."""


def _wide_probes(
    df: DataFrame, key: str, columns: Mapping[str, str], table: PredicateTable
) -> DataFrame | None:
    k = column(key)
    types = {f.name: f.dataType for f in df.schema.fields}
    values: dict[int, Column] = {}
    for col, name in columns.items():
        # the type is checked for every property column, read only when one is tested
        typed = typed_value(column(col), types[col], repr(name), k)
        pid = table.properties.get(name)
        if pid is not None:  # encoded (and checked) once, below the probes
            values[pid] = typed.struct().cast(VALUE_STRUCT).alias(f"_p{pid}")
    staged = df.select(_checked_key(key).alias("_key"), *values.values())
    return _probe_rows(staged, values, table)


def _long_probes(
    df: DataFrame,
    key: str,
    prop: str,
    values: list[str],
    table: PredicateTable,
    validate: bool,
) -> DataFrame | None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not values:
        raise ValidationError(
            "a long frame needs a value column ('value' or 'value_*', or give value=)"
        )
    types = {f.name: f.dataType for f in df.schema.fields}
    if not isinstance(types[prop], T.StringType):
        raise ValidationError(
            f"property column {prop!r} has type {types[prop].simpleString()}; names are strings"
        )
    k = column(key)
    raw = column(prop)
    canonical = F.regexp_replace(raw, r"(?i)^(bts|messagebox)\.", "messagebox.")
    name = (
        F.when(raw.isNull(), _fail(f"property column {prop!r} is null", k))
        .when(
            ~raw.rlike(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+\z")
            | (F.char_length(raw) > MAX_NAME_LENGTH),
            F.raise_error(
                F.concat(
                    F.lit("messagebox: property name '"),
                    raw,
                    F.lit(f"' in column {prop!r} is not of the form namespace.Name (message key "),
                    F.coalesce(k.cast("string"), F.lit("null")),
                    F.lit(")"),
                )
            ),
        )
        .otherwise(canonical)
    )
    typed_cols = [typed_value(column(v), types[v], f"value column {v!r}", k) for v in values]
    n_values = sum((t.fam.isNotNull().cast("int") for t in typed_cols), F.lit(0))
    staged = df.select(
        _checked_key(key).alias("_key"),
        name.alias("_name"),
        F.when(n_values > 1, _fail(f"more than one of the value columns {values} is set", k))
        .otherwise(F.coalesce(*[t.struct().cast(VALUE_STRUCT) for t in typed_cols]))
        .alias("_value"),
    )
    if validate:
        _check_unique(
            staged.groupBy("_key", "_name").count(),
            "message key {} gives property {} times (once is allowed)",
        )
    if not table.properties:
        return None
    spark = df.sparkSession
    props = local_frame(spark, list(table.properties.items()), "_name STRING, _pid INT")
    joined = staged.join(F.broadcast(props), "_name", "left")
    entry = F.when(
        F.col("_pid").isNotNull() & F.col("_value").isNotNull(), F.struct("_pid", "_value")
    )
    # one row per message (a message whose properties no filter tests still has one)
    per_message = joined.groupBy("_key").agg(F.map_from_entries(F.collect_list(entry)).alias("_m"))
    pids = list(table.properties.values())
    rows = per_message.select("_key", *[F.col("_m").getItem(pid).alias(f"_p{pid}") for pid in pids])
    return _probe_rows(rows, pids, table)


def write_routes(routes: DataFrame, output: str | Path, fmt: str = "parquet") -> None:
    """Write routing results partitioned by subscription (a ``subscription=<id>`` folder
    each). A local ``output`` is replaced only when the whole job succeeded: the job
    writes beside it, then the folders are swapped; a failed job leaves the old output
    as it was. Other file systems (``hdfs://``, ``s3a://``…) are written in place."""
    import shutil
    import uuid

    text = str(output)
    writer = routes.write.mode("overwrite").partitionBy("subscription").format(fmt)
    if "://" in text and not text.startswith("file://"):
        writer.save(text)
        return
    final = Path(text.removeprefix("file://")).absolute()
    staging = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        writer.save(str(staging))
        if final.exists():
            old = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.old")
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old)
        else:
            staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
