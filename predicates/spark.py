"""The Spark compiler: filters as one broadcast predicate table, messages as probes.

The counting algorithm (DESIGN.md §5, §11) as one DataFrame plan, with no Python UDF:

1. every subscription's groups are compiled, in the driver, into rows of one small
   *predicate table*, each row ``(key…, grp, w)``: "a probe with this key adds ``w`` to
   group ``grp``";
2. each message property becomes a few *probes* (one row each, built with Spark
   expressions from its typed value), whose keys are those the table can hold for it;
3. one broadcast hash join of probes against the table yields ``(message, grp, w)``;
   the sum of ``w`` per (message, group) equals the group's number of positive
   predicates exactly when the group holds. One aggregation, then distinct
   (message, subscription) pairs.

How each operator becomes table rows (weights in brackets):

- ``==`` and each ``in`` member: an equality key ``(prop, EQ, family, value)`` [+1];
  strings join on the value, numbers, bools and datetimes on the exact ``(hi, lo)`` pair
  of :func:`messagebox.properties.sql_key`, so ``2**53 + 1 != 2.0**53`` holds here too;
- ``!=``: a presence key ``(prop, FAM, family)`` [+1] and the equality key [-1];
- ``exists``: ``(prop, EXISTS)`` [+1]; ``not_exists``: the same key [-:data:`VETO`], so a
  present property vetoes its group; a group of only ``not_exists`` predicates gets one
  ``BASE`` row [0] that every message probes;
- ``prefix``: ``(prop, PREFIX, length, prefix)`` [+1], probed with the value's first
  ``length`` characters for each prefix length the property has: an equi-join too;
- ``> >= < <=``: ``(prop, RANGE, family)`` [+1] with the bound in extra columns: the only
  non-equi condition, evaluated on the rows of that property and family;
- ``bitwise_and``: ``(prop, MASK)`` [+1] with ``(value & mask) != 0`` on int values.

An absent property has no probes, so it satisfies nothing but ``not_exists``; probes
carry their family, so values of different families never meet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from messagebox.properties import Family, family, sql_key
from predicates.model import Filter, Op

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# probe kinds
EQ, FAM, EXISTS, PREFIX, RANGE, MASK, BASE = 1, 2, 3, 4, 5, 6, 7
VETO = 1000
"""The weight of a violated ``not_exists``: more than any group's positive count."""

_RANGE_CODES = {Op.GT: 1, Op.GE: 2, Op.LT: 3, Op.LE: 4}

TABLE_SCHEMA = (
    "pid INT, kind INT, fam INT, s STRING, h DOUBLE, l DOUBLE, "
    "op INT, rs STRING, rh DOUBLE, rl DOUBLE, mask BIGINT, grp INT, w INT"
)
"""The predicate table: the join key ``(pid, kind, fam, s, h, l)``, a range bound
``(op, rs, rh, rl)``, a mask, and what a hit adds: ``w`` to group ``grp``."""

PROBE_FIELDS = ("pid", "kind", "fam", "s", "h", "l", "vs", "vh", "vl", "vi")
"""A probe: its join key, then the value it came from (for range and mask conditions)."""


@dataclass
class PredicateTable:
    """The compiled form of a set of subscriptions (see the module docstring)."""

    properties: dict[str, int] = field(default_factory=dict)
    """Every property a filter tests → its id."""
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    groups: list[tuple[int, int, int]] = field(default_factory=list)
    """``(grp, subscription, n_pos)``: a group holds when its weights sum to ``n_pos``."""
    kinds: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    """Per property id, the probe kinds the table has rows for."""
    prefix_lengths: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    has_base: bool = False
    """Some group is made only of ``not_exists``: every message needs a base probe."""
    multi_group: bool = False
    """Some subscription has several groups: pairs need deduplicating."""

    @classmethod
    def compile(cls, subscriptions: Iterable[tuple[int, Filter]]) -> PredicateTable:
        """Compile ``(subscription id, filter)`` pairs."""
        table = cls()
        for sub, filt in subscriptions:
            if len(filt.groups) > 1:
                table.multi_group = True
            for group in filt.groups:
                table._add_group(sub, group.predicates)
        return table

    def _pid(self, name: str) -> int:
        return self.properties.setdefault(name, len(self.properties) + 1)

    def _row(
        self,
        pid: int,
        kind: int,
        grp: int,
        w: int = 1,
        *,
        fam: int = 0,
        s: str = "",
        h: float = 0.0,
        lo: float = 0.0,
        op: int | None = None,
        rs: str | None = None,
        rh: float | None = None,
        rl: float | None = None,
        mask: int | None = None,
    ) -> None:
        self.rows.append((pid, kind, fam, s, h, lo, op, rs, rh, rl, mask, grp, w))
        self.kinds[pid].add(kind)

    def _eq(self, pid: int, grp: int, value: Any, w: int) -> None:
        fam = family(value)
        if fam is Family.STR:
            self._row(pid, EQ, grp, w, fam=int(fam), s=value)
        else:
            hi, lo = sql_key(value)
            self._row(pid, EQ, grp, w, fam=int(fam), h=hi, lo=lo)

    def _add_group(self, sub: int, predicates: Sequence[Any]) -> None:
        grp = len(self.groups) + 1
        n_pos = 0
        for pred in predicates:
            pid = self._pid(pred.property)
            op = pred.op
            if op is Op.NOT_EXISTS:
                self._row(pid, EXISTS, grp, -VETO)
                continue
            n_pos += 1
            if op is Op.EQ:
                self._eq(pid, grp, pred.value, 1)
            elif op is Op.IN:
                for member in pred.value:
                    self._eq(pid, grp, member, 1)
            elif op is Op.NE:
                self._row(pid, FAM, grp, fam=int(family(pred.value)))
                self._eq(pid, grp, pred.value, -1)
            elif op is Op.EXISTS:
                self._row(pid, EXISTS, grp)
            elif op is Op.PREFIX:
                n = len(pred.value)
                self._row(pid, PREFIX, grp, fam=int(Family.STR), s=pred.value, h=float(n))
                self.prefix_lengths[pid].add(n)
            elif op is Op.BITWISE_AND:
                self._row(pid, MASK, grp, fam=int(Family.NUM), mask=pred.value)
            else:  # a range
                fam = family(pred.value)
                if fam is Family.STR:
                    bound: dict[str, Any] = {"rs": pred.value}
                else:
                    hi, lo = sql_key(pred.value)
                    bound = {"rh": hi, "rl": lo}
                self._row(pid, RANGE, grp, fam=int(fam), op=_RANGE_CODES[op], **bound)
        if n_pos == 0:
            self._row(0, BASE, grp, 0)
            self.has_base = True
        self.groups.append((grp, sub, n_pos))

    # --- as Spark DataFrames ---

    def dataframes(self, spark: SparkSession) -> tuple[DataFrame, DataFrame]:
        """The predicate table and the group table, as small DataFrames to broadcast."""
        table = spark.createDataFrame(self.rows, TABLE_SCHEMA)
        groups = spark.createDataFrame(self.groups, "grp INT, sub BIGINT, n_pos INT")
        return table, groups


def probes(pid: Column | int, typed: TypedValue, table: PredicateTable) -> list[Column]:
    """The probe structs of one property value (null when the value is absent).

    With a literal ``pid`` (a wide column) only the kinds the table has rows for are
    made; with a column (a long frame) all are, and the join drops the misses.
    """
    from pyspark.sql import functions as F

    kinds = table.kinds.get(pid, set()) if isinstance(pid, int) else set(range(EQ, MASK + 1))
    lengths = sorted(table.prefix_lengths.get(pid, ())) if isinstance(pid, int) else []
    pid_col = F.lit(pid) if isinstance(pid, int) else pid
    present = typed.fam.isNotNull()
    zero = F.lit(0.0)

    def probe(kind: int, fam: Column, s: Column, h: Column, lo: Column, when: Column) -> Column:
        return F.when(
            when,
            F.struct(
                pid_col.cast("int").alias("pid"),
                F.lit(kind).alias("kind"),
                fam.cast("int").alias("fam"),
                s.alias("s"),
                h.cast("double").alias("h"),
                lo.cast("double").alias("l"),
                typed.v_str.alias("vs"),
                typed.hi.alias("vh"),
                typed.lo.alias("vl"),
                typed.v_int.alias("vi"),
            ),
        )

    out: list[Column] = []
    is_str = typed.fam == F.lit(int(Family.STR))
    if EQ in kinds:
        out.append(
            probe(
                EQ,
                typed.fam,
                F.coalesce(typed.v_str, F.lit("")),
                F.coalesce(typed.hi, zero),
                F.coalesce(typed.lo, zero),
                present,
            )
        )
    if FAM in kinds:
        out.append(probe(FAM, typed.fam, F.lit(""), zero, zero, present))
    if EXISTS in kinds:
        out.append(probe(EXISTS, F.lit(0), F.lit(""), zero, zero, present))
    if RANGE in kinds:
        out.append(probe(RANGE, typed.fam, F.lit(""), zero, zero, present))
    if MASK in kinds:
        out.append(
            probe(MASK, F.lit(int(Family.NUM)), F.lit(""), zero, zero, typed.v_int.isNotNull())
        )
    for n in lengths:
        out.append(
            probe(
                PREFIX,
                F.lit(int(Family.STR)),
                F.substring(typed.v_str, 1, n),
                F.lit(float(n)),
                zero,
                present & is_str & (F.char_length(typed.v_str) >= n),
            )
        )
    return out


def long_prefix_probes(pid: Column, lengths: Column, typed: TypedValue) -> Column:
    """Prefix probes of a long frame's value: one per length in the array ``lengths``."""
    from pyspark.sql import functions as F

    def one(n: Column) -> Column:
        return F.struct(
            pid.cast("int").alias("pid"),
            F.lit(PREFIX).alias("kind"),
            F.lit(int(Family.STR)).alias("fam"),
            F.substring(typed.v_str, F.lit(1), n).alias("s"),
            n.cast("double").alias("h"),
            F.lit(0.0).alias("l"),
            typed.v_str.alias("vs"),
            typed.hi.alias("vh"),
            typed.lo.alias("vl"),
            typed.v_int.alias("vi"),
        )

    # a non-string or absent value has a null length: no prefix probe
    usable = F.filter(lengths, lambda n: F.char_length(typed.v_str) >= n)
    return F.transform(usable, one)


def base_probe() -> Column:
    """The probe every message makes once, for groups of only ``not_exists``."""
    from pyspark.sql import functions as F

    return F.struct(
        F.lit(0).alias("pid"),
        F.lit(BASE).alias("kind"),
        F.lit(0).alias("fam"),
        F.lit("").alias("s"),
        F.lit(0.0).alias("h"),
        F.lit(0.0).alias("l"),
        F.lit(None).cast("string").alias("vs"),
        F.lit(None).cast("double").alias("vh"),
        F.lit(None).cast("double").alias("vl"),
        F.lit(None).cast("bigint").alias("vi"),
    )


def join_condition(p: DataFrame, t: DataFrame) -> Column:
    """Probes ``p`` meet table rows ``t``: equal keys, and for ranges and masks the
    bound or the mask holds."""
    from pyspark.sql import functions as F

    keys = (
        (p["pid"] == t["pid"])
        & (p["kind"] == t["kind"])
        & (p["fam"] == t["fam"])
        & (p["s"] == t["s"])
        & (p["h"] == t["h"])
        & (p["l"] == t["l"])
    )
    vs, vh, vl = p["vs"], p["vh"], p["vl"]
    rs, rh, rl, op = t["rs"], t["rh"], t["rl"], t["op"]
    str_holds = (
        F.when(op == 1, vs > rs).when(op == 2, vs >= rs).when(op == 3, vs < rs).otherwise(vs <= rs)
    )
    num_holds = (
        F.when(op == 1, (vh > rh) | ((vh == rh) & (vl > rl)))
        .when(op == 2, (vh > rh) | ((vh == rh) & (vl >= rl)))
        .when(op == 3, (vh < rh) | ((vh == rh) & (vl < rl)))
        .otherwise((vh < rh) | ((vh == rh) & (vl <= rl)))
    )
    range_holds = F.when(t["fam"] == F.lit(int(Family.STR)), str_holds).otherwise(num_holds)
    mask_holds = p["vi"].bitwiseAND(t["mask"]) != 0
    return keys & (
        F.when(t["kind"] == RANGE, range_holds)
        .when(t["kind"] == MASK, mask_holds)
        .otherwise(F.lit(True))
    )


@dataclass(frozen=True)
class TypedValue:
    """A property value as Spark expressions: its family and typed columns
    (``v_str`` for strings; ``hi, lo`` for the rest, see
    :func:`messagebox.properties.sql_key`; ``v_int`` for ints). All null when absent."""

    fam: Column
    v_str: Column
    hi: Column
    lo: Column
    v_int: Column


def route_probes(probe_rows: DataFrame, table: PredicateTable, spark: SparkSession) -> DataFrame:
    """``(_key, _sub)`` pairs from exploded probe rows ``(_key, _probe)``: the join, the
    count, the distinct pairs."""
    from pyspark.sql import functions as F

    t, groups = table.dataframes(spark)
    p = probe_rows.select("_key", "_probe.*")
    hits = p.join(F.broadcast(t), join_condition(p, t)).select(p["_key"], t["grp"], t["w"])
    sums = hits.groupBy("_key", "grp").agg(F.sum("w").alias("n"))
    matched = sums.join(F.broadcast(groups), "grp").where(F.col("n") == F.col("n_pos"))
    pairs = matched.select("_key", F.col("sub").alias("_sub"))
    return pairs.dropDuplicates(["_key", "_sub"]) if table.multi_group else pairs
