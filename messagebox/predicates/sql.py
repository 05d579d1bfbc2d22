"""The SQL compiler: predicates as rows of the typed predicate tables.

Each predicate becomes rows of one table per operator family:

- ``mb_pred_str``   string-valued ``==  !=  >  >=  <  <=  prefix`` and ``in`` members;
- ``mb_pred_num``   number/bool/datetime-valued ones, as exact ``(hi, lo)`` keys;
- ``mb_pred_mask``  ``bitwise_and``;
- ``mb_pred_exists`` ``exists`` and ``not_exists``.

The routing statement itself is in ``sql/common.sql``.
"""

from __future__ import annotations

from typing import Any

from messagebox.predicates.model import Op, Predicate
from messagebox.properties import Family, family, sql_key

STR, NUM, MASK, EXISTS = "mb_pred_str", "mb_pred_num", "mb_pred_mask", "mb_pred_exists"

_ANCHOR_RANK = {
    Op.EQ: 0,
    Op.IN: 1,
    Op.PREFIX: 2,
    Op.GT: 3,
    Op.GE: 3,
    Op.LT: 3,
    Op.LE: 3,
    Op.BITWISE_AND: 4,
    Op.EXISTS: 5,
    Op.NE: 6,
}


def anchor_rank(pred: Predicate) -> int | None:
    """How good an anchor the predicate makes (lower is more selective); None: never."""
    if pred.op is Op.NOT_EXISTS:
        return None
    rank = _ANCHOR_RANK[pred.op]
    if pred.op is Op.EQ and family(pred.value) is Family.BOOL:
        rank = 3  # a bool has two values: equality on it selects little
    return rank


def _value_row(pred_id: int, prop_id: int, op: str, value: Any) -> tuple[str, dict[str, Any]]:
    if family(value) is Family.STR:
        return STR, {"pred": pred_id, "prop": prop_id, "op": op, "v": value}
    hi, lo = sql_key(value)
    return NUM, {
        "pred": pred_id,
        "prop": prop_id,
        "fam": int(family(value)),
        "op": op,
        "hi": hi,
        "lo": lo,
    }


def typed_rows(pred: Predicate, pred_id: int, prop_id: int) -> list[tuple[str, dict[str, Any]]]:
    """The rows that store ``pred``, as ``(table name, row)`` pairs."""
    op = pred.op
    if op in (Op.EXISTS, Op.NOT_EXISTS):
        return [(EXISTS, {"pred": pred_id, "prop": prop_id, "op": op.value})]
    if op is Op.BITWISE_AND:
        return [(MASK, {"pred": pred_id, "prop": prop_id, "mask": pred.value})]
    if op is Op.IN:
        return [_value_row(pred_id, prop_id, op.value, v) for v in pred.value]
    return [_value_row(pred_id, prop_id, op.value, pred.value)]
