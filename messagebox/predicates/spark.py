"""The Spark compiler: filters as two small broadcast tables, messages as probes.

The counting algorithm with anchors, as the SQL router runs it (docs/concepts.md: Publishing), as
one DataFrame plan with no Python UDF and, for wide frames, no shuffle but the final
deduplication:

1. **compile**, in the driver: each group of each subscription gets an *anchor*, its
   most selective predicate (:func:`messagebox.predicates.sql.anchor_rank`: equality first, then
   ``in``, prefix, range, mask, exists, ``!=``), stored as rows of the *anchor table*;
   the group's other predicates ride along on the anchor row, as small structs;
2. **probe**: each message row carries its tested values as one array ``_vals``
   (indexed by property id) and explodes into a few *probes*, one per anchor kind its
   values can hit;
3. **candidates**: one broadcast hash join of probes against the anchor table gives the
   (message, group) pairs whose anchor holds; the cost follows the anchors that match,
   not the number of subscriptions;
4. **verify**: each anchor row carries the rest of its group's predicates, checked
   against ``_vals`` in the joined row itself (generated code, unrolled to the longest
   group; see :func:`verify`), so no (message, group) count needs a shuffle.

How anchors become probe keys ``(pid, kind, fam, s, h, l)``:

- ``==`` and each ``in`` member: ``EQ`` with the family and the value: strings join on
  the value, numbers, bools and datetimes on the exact ``(hi, lo)`` pair of
  :func:`messagebox.properties.sql_key`, so ``2**53 + 1 != 2.0**53`` holds here too;
- ``prefix``: ``PREFIX`` with the prefix and its length, probed with the value's first
  ``length`` characters for each anchor prefix length the property has (an equi-join);
- ``> >= < <=`` and ``bitwise_and``: ``RANGE`` (per family) and ``MASK``, with the bound
  or mask checked in the join condition, on that property's anchors only;
- ``exists``: ``EXISTS``; ``!=``: ``FAM`` (present in the family; verification decides);
- a group of only ``not_exists`` has no anchor: every message makes one ``BASE`` probe.

Verification follows the reference semantics: an absent property (a null in ``_vals``)
satisfies only ``not_exists``; values of different families never meet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from messagebox.predicates.model import Filter, Op, Predicate
from messagebox.predicates.sql import anchor_rank
from messagebox.properties import Family, family, sql_key

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# probe kinds
EQ, FAM, EXISTS, PREFIX, RANGE, MASK, BASE = 1, 2, 3, 4, 5, 6, 7

# operator codes in the group table
OP_CODES = {
    Op.EQ: 1,
    Op.NE: 2,
    Op.GT: 3,
    Op.GE: 4,
    Op.LT: 5,
    Op.LE: 6,
    Op.EXISTS: 7,
    Op.NOT_EXISTS: 8,
    Op.BITWISE_AND: 9,
    Op.PREFIX: 10,
    Op.IN: 11,
}

VALUE_TYPE = "STRUCT<fam: INT, s: STRING, h: DOUBLE, l: DOUBLE>"
PRED_TYPE = (
    f"STRUCT<pid: INT, op: INT, fam: INT, s: STRING, h: DOUBLE, l: DOUBLE, mask: BIGINT, "
    f"members: ARRAY<{VALUE_TYPE}>>"
)
ANCHOR_SCHEMA = (
    "pid INT, kind INT, fam INT, s STRING, h DOUBLE, l DOUBLE, "
    f"op INT, rs STRING, rh DOUBLE, rl DOUBLE, mask BIGINT, sub BIGINT, rest ARRAY<{PRED_TYPE}>"
)
"""The anchor table: the join key ``(pid, kind, fam, s, h, l)``, a range bound
``(op, rs, rh, rl)`` or a mask, then the group the anchor stands for: its subscription
and the rest of its predicates (those the join does not prove)."""

EXACT_KINDS = frozenset({EQ, EXISTS, PREFIX, RANGE, MASK})
"""Anchor kinds whose join proves the anchor predicate (``FAM`` does not: ``!=``)."""

TYPED_FIELDS = ("fam", "v_str", "hi", "lo", "v_int")
"""A value in ``_vals``: its family, and ``v_str`` (strings), ``hi, lo`` (the rest),
``v_int`` (ints, for masks)."""


def _key(value: Any) -> tuple[int, str | None, float | None, float | None]:
    """``(family, s, h, l)``: how a value is compared."""
    fam = family(value)
    if fam is Family.STR:
        return int(fam), value, None, None
    hi, lo = sql_key(value)
    return int(fam), None, hi, lo


def _member(value: Any) -> tuple[int, str, float, float]:
    """An ``in`` member as :func:`value_key` makes a value: no nulls."""
    fam, s, h, lo = _key(value)
    return fam, s or "", h or 0.0, lo or 0.0


@dataclass
class PredicateTable:
    """The compiled form of a set of subscriptions (see the module docstring)."""

    properties: dict[str, int] = field(default_factory=dict)
    """Every property a filter tests → its id, 1, 2, …"""
    anchors: list[tuple[Any, ...]] = field(default_factory=list)
    """Rows of the anchor table (:data:`ANCHOR_SCHEMA`)."""
    groups: list[tuple[int, int, int]] = field(default_factory=list)
    """``(grp, subscription, predicates left to verify)``."""
    max_rest: int = 0
    """The most predicates a candidate has left to verify."""
    _pending: list[tuple[Any, ...]] = field(default_factory=list)
    kinds: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    """Per property id, the probe kinds its anchors need."""
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

    def _anchor(self, pid: int, kind: int, grp: int, **cols: Any) -> None:
        c = {"fam": 0, "s": "", "h": 0.0, "l": 0.0, **cols}
        key = (pid, kind, c["fam"], c["s"], c["h"], c["l"])
        bound = (c.get("op"), c.get("rs"), c.get("rh"), c.get("rl"), c.get("mask"))
        self._pending.append((*key, *bound))
        self.kinds[pid].add(kind)

    def _add_anchor(self, pred: Predicate, pid: int, grp: int) -> None:
        op = pred.op
        if op in (Op.EQ, Op.IN):
            for member in pred.value if op is Op.IN else (pred.value,):
                fam, s, h, lo = _key(member)
                self._anchor(pid, EQ, grp, fam=fam, s=s or "", h=h or 0.0, l=lo or 0.0)
        elif op is Op.NE:
            self._anchor(pid, FAM, grp, fam=int(family(pred.value)))
        elif op is Op.EXISTS:
            self._anchor(pid, EXISTS, grp)
        elif op is Op.PREFIX:
            n = len(pred.value)
            self._anchor(pid, PREFIX, grp, fam=int(Family.STR), s=pred.value, h=float(n))
            self.prefix_lengths[pid].add(n)
        elif op is Op.BITWISE_AND:
            self._anchor(pid, MASK, grp, fam=int(Family.NUM), mask=pred.value)
        else:  # a range
            fam, s, h, lo = _key(pred.value)
            self._anchor(pid, RANGE, grp, fam=fam, op=OP_CODES[op], rs=s, rh=h, rl=lo)

    def _add_group(self, sub: int, predicates: Sequence[Predicate]) -> None:
        grp = len(self.groups) + 1
        self._pending = []
        ranked = [(anchor_rank(p), i) for i, p in enumerate(predicates)]
        usable = [(rank, i) for rank, i in ranked if rank is not None]
        anchor: Predicate | None = None
        if usable:
            anchor = predicates[min(usable)[1]]
            self._add_anchor(anchor, self._pid(anchor.property), grp)
        else:
            self._anchor(0, BASE, grp)
            self.has_base = True
        proven = anchor is not None and anchor.op is not Op.NE
        rest = [self._pred(p) for p in predicates if not (proven and p is anchor)]
        self.max_rest = max(self.max_rest, len(rest))
        self.anchors.extend((*row, sub, rest) for row in self._pending)
        self.groups.append((grp, sub, len(rest)))

    def _pred(self, p: Predicate) -> tuple[Any, ...]:
        """A predicate as a struct of the ``rest`` array (:data:`PRED_TYPE`)."""
        pid = self._pid(p.property)
        members = [_member(v) for v in p.value] if p.op is Op.IN else []
        if p.value is None or p.op in (Op.IN, Op.BITWISE_AND):
            fam, s, h, lo = 0, "", 0.0, 0.0
        else:
            fam, s, h, lo = _member(p.value)
        mask = p.value if p.op is Op.BITWISE_AND else None
        return (pid, OP_CODES[p.op], fam, s, h, lo, mask, members)

    # --- as Spark DataFrames ---

    def dataframe(self, spark: SparkSession) -> DataFrame:
        """The anchor table, as a small DataFrame to broadcast."""
        return local_frame(spark, self.anchors, ANCHOR_SCHEMA)


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: str) -> DataFrame:
    """A small DataFrame of ``rows`` (tuples in the order of ``schema``, a DDL string),
    built through Arrow in the driver: a local relation in the plan, which the executors
    read without starting Python (``createDataFrame`` of a list would start it)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = cast(StructType, StructType.fromDDL(schema))
    arrow = to_arrow_schema(struct)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in struct.fields]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, arrow, strict=True)]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), struct)


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

    def struct(self) -> Column:
        """The value as one struct, null when absent (an element of ``_vals``)."""
        from pyspark.sql import functions as F

        fields = [getattr(self, f).alias(f) for f in TYPED_FIELDS]
        return F.when(self.fam.isNotNull(), F.struct(*fields))

    @classmethod
    def of(cls, struct: Column) -> TypedValue:
        """The fields of a struct made by :meth:`struct`."""
        return cls(*(struct.getField(f) for f in TYPED_FIELDS))


def probes(pid: int, typed: TypedValue, table: PredicateTable) -> list[Column]:
    """The probe structs of one property value (null when the value is absent), for the
    anchor kinds the table has for that property."""
    from pyspark.sql import functions as F

    kinds = table.kinds.get(pid, set())
    present = typed.fam.isNotNull()
    zero = F.lit(0.0)

    def probe(kind: int, fam: Column, s: Column, h: Column, lo: Column, when: Column) -> Column:
        return F.when(
            when,
            F.struct(
                F.lit(pid).alias("pid"),
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
    if EQ in kinds:
        s = F.coalesce(typed.v_str, F.lit(""))
        h, lo = F.coalesce(typed.hi, zero), F.coalesce(typed.lo, zero)
        out.append(probe(EQ, typed.fam, s, h, lo, present))
    if FAM in kinds:
        out.append(probe(FAM, typed.fam, F.lit(""), zero, zero, present))
    if EXISTS in kinds:
        out.append(probe(EXISTS, F.lit(0), F.lit(""), zero, zero, present))
    if RANGE in kinds:
        out.append(probe(RANGE, typed.fam, F.lit(""), zero, zero, present))
    if MASK in kinds:
        num = F.lit(int(Family.NUM))
        out.append(probe(MASK, num, F.lit(""), zero, zero, typed.v_int.isNotNull()))
    for n in sorted(table.prefix_lengths.get(pid, ())):
        long_enough = present & (F.char_length(typed.v_str) >= n)
        prefix = F.substring(typed.v_str, 1, n)
        str_fam = F.lit(int(Family.STR))
        out.append(probe(PREFIX, str_fam, prefix, F.lit(float(n)), zero, long_enough))
    return out


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


def _lexi(op: Column, a: tuple[Column, Column], b: tuple[Column, Column]) -> Column:
    """``a (op) b`` for exact ``(hi, lo)`` pairs, lexicographically (codes 3–6)."""
    from pyspark.sql import functions as F

    (ah, al), (bh, bl) = a, b
    return (
        F.when(op == 3, (ah > bh) | ((ah == bh) & (al > bl)))
        .when(op == 4, (ah > bh) | ((ah == bh) & (al >= bl)))
        .when(op == 5, (ah < bh) | ((ah == bh) & (al < bl)))
        .otherwise((ah < bh) | ((ah == bh) & (al <= bl)))
    )


def _str_cmp(op: Column, a: Column, b: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(op == 3, a > b).when(op == 4, a >= b).when(op == 5, a < b).otherwise(a <= b)


def anchor_condition(p: DataFrame, t: DataFrame) -> Column:
    """Probes ``p`` meet anchors ``t``: equal keys, and a range anchor's bound or a mask
    anchor's mask holds."""
    from pyspark.sql import functions as F

    keys = (
        (p["pid"] == t["pid"])
        & (p["kind"] == t["kind"])
        & (p["fam"] == t["fam"])
        & (p["s"] == t["s"])
        & (p["h"] == t["h"])
        & (p["l"] == t["l"])
    )
    op = t["op"]
    range_holds = F.when(
        t["fam"] == F.lit(int(Family.STR)), _str_cmp(op, p["vs"], t["rs"])
    ).otherwise(_lexi(op, (p["vh"], p["vl"]), (t["rh"], t["rl"])))
    mask_holds = p["vi"].bitwiseAND(t["mask"]) != 0
    return keys & (
        F.when(t["kind"] == RANGE, range_holds)
        .when(t["kind"] == MASK, mask_holds)
        .otherwise(F.lit(True))
    )


def value_key(v: Column) -> Column:
    """A value as an ``in`` member is stored (:data:`VALUE_TYPE`, no nulls), so that
    membership is one ``array_contains`` (generated code, no lambda)."""
    from pyspark.sql import functions as F

    return F.struct(
        v["fam"].alias("fam"),
        F.coalesce(v["v_str"], F.lit("")).alias("s"),
        F.coalesce(v["hi"], F.lit(0.0)).alias("h"),
        F.coalesce(v["lo"], F.lit(0.0)).alias("l"),
    )


def _slot(j: int) -> tuple[list[Column], Column]:
    """Slot ``j`` of the unrolled check: flat columns from ``_r<j>`` (the predicate)
    and ``_v<j>`` (the message's value of its property), and the condition on them.

    Every comparison operator reduces to one three-way comparison ``_c<j>`` of the
    exact keys ``(s, hi, lo)``: strings by code point, the rest by ``(hi, lo)``."""
    from pyspark.sql import functions as F

    r, v = F.col(f"_r{j}"), F.col(f"_v{j}")
    op = r["op"]
    vs, vh, vl = (F.coalesce(v[f], F.lit(d)) for f, d in (("v_str", ""), ("hi", 0.0), ("lo", 0.0)))
    ps, ph, pl = r["s"], r["h"], r["l"]
    three_way = (
        F.when(vs < ps, -1)
        .when(vs > ps, 1)
        .when(vh < ph, -1)
        .when(vh > ph, 1)
        .when(vl < pl, -1)
        .when(vl > pl, 1)
        .otherwise(0)
    )
    special = (
        F.when(op == OP_CODES[Op.IN], F.array_contains(r["members"], value_key(v)))
        .when(
            op == OP_CODES[Op.BITWISE_AND],
            v["v_int"].isNotNull() & (v["v_int"].bitwiseAND(r["mask"]) != 0),
        )
        .when(
            op == OP_CODES[Op.PREFIX],
            (v["fam"] == F.lit(int(Family.STR))) & F.startswith(v["v_str"], ps),
        )
    )
    columns = [
        op.alias(f"_o{j}"),
        v.isNull().alias(f"_a{j}"),
        (v["fam"] == r["fam"]).alias(f"_s{j}"),
        three_way.alias(f"_c{j}"),
        special.alias(f"_x{j}"),
    ]
    o, absent, same, c = (F.col(f"_{x}{j}") for x in "oasc")
    holds = (
        F.when(o.isNull(), F.lit(True))  # the group has fewer predicates
        .when(o == OP_CODES[Op.NOT_EXISTS], absent)
        .when(absent, F.lit(False))
        .when(o == OP_CODES[Op.EXISTS], F.lit(True))
        .when(o == OP_CODES[Op.EQ], same & (c == 0))
        .when(o == OP_CODES[Op.NE], same & (c != 0))
        .when(o == OP_CODES[Op.GT], same & (c > 0))
        .when(o == OP_CODES[Op.GE], same & (c >= 0))
        .when(o == OP_CODES[Op.LT], same & (c < 0))
        .when(o == OP_CODES[Op.LE], same & (c <= 0))
        .otherwise(F.col(f"_x{j}"))
    )
    return columns, F.coalesce(holds, F.lit(False))


def verify(candidates: DataFrame, table: PredicateTable) -> DataFrame:
    """``(_key, _sub)`` of the candidates all of whose ``rest`` predicates hold.

    Generated code stays small (a method over 8 KB of bytecode would never be compiled
    by the JVM, and run a hundred times slower): each slot's predicate and value are
    picked once in a projection, flattened into a few scalars in a second one
    (``spark_partition_id`` there keeps the filter from being pushed through it and
    into the join, where every use would be generated again), and the check, unrolled
    to the longest ``rest`` of the table, reads only those: no lambda, no repeated
    lookups."""
    from pyspark.sql import functions as F

    keep = [F.col("_key"), F.col("_sub")]
    picks = [F.col("_key"), F.col("sub").alias("_sub")]
    flat: list[Column] = [*keep, F.spark_partition_id().alias("_part")]
    ok = F.lit(True)
    for j in range(table.max_rest):
        pred = F.try_element_at(F.col("rest"), F.lit(j + 1))
        picks += [pred.alias(f"_r{j}"), F.element_at(F.col("_vals"), pred["pid"]).alias(f"_v{j}")]
        columns, holds = _slot(j)
        flat += columns
        ok = ok & holds
    barrier = F.col("_part") >= 0  # referenced, so neither pruned nor pushed down
    return candidates.select(*picks).select(*flat).where(barrier & ok).select(*keep)


def route_probes(probe_rows: DataFrame, table: PredicateTable, spark: SparkSession) -> DataFrame:
    """``(_key, _sub)`` pairs from exploded probe rows ``(_key, _vals, _probe)``: the
    anchor join, the verification of the rest, the distinct pairs."""
    from pyspark.sql import functions as F

    anchors = table.dataframe(spark)
    p = probe_rows.select("_key", "_vals", "_probe.*")
    candidates = p.join(F.broadcast(anchors), anchor_condition(p, anchors)).select(
        p["_key"], p["_vals"], anchors["sub"], anchors["rest"]
    )
    pairs = verify(candidates, table)
    return pairs.dropDuplicates(["_key", "_sub"]) if table.multi_group else pairs
