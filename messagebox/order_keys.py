"""The keys of per-key ordered delivery (``subscribe(..., ordered_by=...)``;
docs/concepts.md: Per-key order).

An entry's key is its message's value of the subscription's ``ordered_by`` property,
stored on the queue entry as text that is equal exactly when the values are equal by
the engine's rules (:func:`messagebox.properties.values_equal`): a family tag, then the
value. Numbers are one family (``1`` and ``1.0`` are one key, ``2**53 + 1`` and
``float(2**53)`` two), and a string never equals a number (``"7"`` and ``7`` are two
keys). A message without the property has the one key :data:`ABSENT`: such messages
are ordered among themselves, one at a time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from messagebox.properties import INT64_MAX, INT64_MIN, Value, datetime_micros

ABSENT = ""
"""The key of every message without the property (no value's key is empty)."""


def encode(value: Value | None) -> str:
    """The key of a normalised property value (None: the property is absent)."""
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "b1" if value else "b0"
    if isinstance(value, int):
        return f"n{value}"
    if isinstance(value, float):
        if value.is_integer() and INT64_MIN <= value <= INT64_MAX:
            return f"n{int(value)}"  # equal to that int, so the same key
        return f"n{value!r}"
    if isinstance(value, str):
        return f"s{value}"
    return f"d{datetime_micros(value)}"


def describe(key: str | None) -> str:
    """A key as a person reads it: the value as a filter would write it."""
    if key is None:
        return "-"
    if key == ABSENT:
        return "(absent)"
    tag, text = key[0], key[1:]
    if tag == "s":
        return repr(text)
    if tag == "b":
        return "true" if text == "1" else "false"
    if tag == "d":
        return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(text))).isoformat()
    return text
