"""The pure-Python reference evaluator: the oracle every other evaluator must agree with.
It lives in :mod:`messagebox.predicates.model`, beside the types it evaluates (their ``matches``
use it); this module names it.

Semantics (docs/concepts.md: Filters): an absent property satisfies only ``not_exists``; comparisons
need both sides in one family (str, number, bool, datetime); numbers compare exactly,
strings by code point, datetimes chronologically.
"""

from __future__ import annotations

from messagebox.predicates.model import filter_matches, normalize_properties, predicate_holds

__all__ = ["filter_matches", "normalize_properties", "predicate_holds"]
