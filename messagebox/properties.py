"""Property names, value types and their encodings (docs/concepts.md: Messages).

Values are normalised once, at the edge: ``Decimal`` becomes ``int`` when integral and
``float`` otherwise, datetimes move to UTC. After that every value is one of
``str | int | float | bool | datetime`` and belongs to one *family*; values of different
families never compare equal or ordered.

For SQL, every non-string value is encoded as an exact, order-preserving pair of doubles
``(hi, lo)``: ``hi`` is the value rounded to the nearest double, ``lo`` the exact rest
(an integer of at most 2**10 for 64-bit ints, 0 for floats). Comparing pairs
lexicographically compares the values exactly, so ``2**53 + 1 != float(2**53)`` holds in
SQL as it does in Python.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import IntEnum
from typing import Any

import orjson

from messagebox import compiled
from messagebox.compiled import native

Value = str | int | float | bool | datetime

MAX_NAME_LENGTH = 256
MAX_PROMOTED_STRING = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
RESERVED_NAMESPACE = "messagebox"
RESERVED_PREFIX = RESERVED_NAMESPACE + "."
RESERVED_ALIASES = frozenset({"messagebox", "bts"})

_NAME_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class Family(IntEnum):
    """Comparison families: values compare only within one family."""

    STR = 1
    NUM = 2
    BOOL = 3
    DATETIME = 4


def canonical_name(name: object) -> str:
    """Check a property name and return its canonical spelling (``BTS.`` → ``messagebox.``)."""
    if not isinstance(name, str):
        raise ValueError(f"property name must be a str, not {type(name).__name__}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"property name is longer than {MAX_NAME_LENGTH} characters")
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"property name {name!r} is not of the form namespace.Name "
            "(letters, digits, '_', '-', dots between segments)"
        )
    namespace, rest = name.split(".", 1)
    if namespace.lower() in RESERVED_ALIASES:
        return f"{RESERVED_NAMESPACE}.{rest}"
    return name


def is_reserved(canonical: str) -> bool:
    """True when a canonical name lies in the engine's reserved namespace."""
    return canonical.startswith(RESERVED_PREFIX)


def check_unicode(text: str) -> None:
    """Raise ``ValueError`` if ``text`` has no UTF-8 encoding (it holds a lone surrogate).

    Searches without encoding, so a large text part is not copied to be checked."""
    if not text.isascii() and (found := _SURROGATE.search(text)):
        raise ValueError(
            f"string is not valid Unicode (lone surrogate {found.group()!r} "
            f"at index {found.start()})"
        )


def check_text(value: str) -> None:
    """Raise ``ValueError`` unless ``value`` can be stored as text on every backend:
    valid Unicode, without NUL characters (PostgreSQL's text refuses them)."""
    if "\x00" in value:
        raise ValueError("strings may not contain NUL characters")
    check_unicode(value)


def normalize_value(value: object, *, promoted: bool = True) -> Value:
    """Check a property value and return it normalised, or raise ``ValueError``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"int {value} does not fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"float {value} is not finite")
        return float(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"Decimal {value} is not finite")
        if value == value.to_integral_value():
            return normalize_value(int(value), promoted=promoted)
        return normalize_value(float(value), promoted=promoted)
    if isinstance(value, str):
        check_text(value)
        if promoted and len(value) > MAX_PROMOTED_STRING:
            raise ValueError(
                f"promoted string is {len(value)} characters long; "
                f"at most {MAX_PROMOTED_STRING} can be promoted"
            )
        return str(value)  # a str subclass (lxml's string results) becomes a plain str
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("datetime must be timezone-aware")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError(
                f"datetime {value.isoformat()} is out of range in UTC (years 1 to 9999)"
            ) from None
    raise ValueError(
        f"unsupported value type {type(value).__name__} "
        "(use str, int, float, Decimal, bool or an aware datetime)"
    )


def family(value: Value) -> Family:
    """The comparison family of a normalised value."""
    if isinstance(value, bool):
        return Family.BOOL
    if isinstance(value, int | float):
        return Family.NUM
    if isinstance(value, str):
        return Family.STR
    return Family.DATETIME


def datetime_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch, exactly."""
    return (value - _EPOCH) // _MICROSECOND


def exact_pair(value: int | float) -> tuple[float, float]:
    """The exact order-preserving ``(hi, lo)`` encoding of a number."""
    if isinstance(value, float):
        return (value + 0.0, 0.0)  # + 0.0 folds -0.0 into 0.0
    hi = float(value)
    return (hi, float(value - int(hi)))


def sql_key(value: Value) -> tuple[float, float]:
    """The ``(hi, lo)`` key of a non-string value (bools are 0/1, datetimes micros)."""
    if isinstance(value, bool):
        return (1.0 if value else 0.0, 0.0)
    if isinstance(value, int | float):
        return exact_pair(value)
    if isinstance(value, datetime):
        return exact_pair(datetime_micros(value))
    raise TypeError(f"strings have no numeric key: {value!r}")


def values_equal(a: Value, b: Value) -> bool:
    """Equality within a family; values of different families are never equal."""
    return family(a) == family(b) and a == b


# --- context encoding: typed JSON, so that a round trip keeps int/float/datetime apart ---

_TAGS: dict[type, str] = {bool: "b", int: "i", float: "f", str: "s", datetime: "d"}


def encode_value(value: Value) -> list[Any]:
    """A JSON-ready ``[tag, value]`` pair."""
    tag = _TAGS[type(value)] if type(value) in _TAGS else _TAGS[datetime]
    if isinstance(value, datetime):
        return [tag, value.isoformat()]
    return [tag, value]


def decode_value(pair: object) -> Value:
    """Inverse of :func:`encode_value`; raises ``ValueError`` on a malformed pair."""
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise ValueError(f"expected a [tag, value] pair, got {pair!r}")
    tag, raw = pair
    if tag == "d" and isinstance(raw, str):
        try:
            value = datetime.fromisoformat(raw)
        except ValueError as exc:
            raise ValueError(f"bad datetime {raw!r}") from exc
        return normalize_value(value, promoted=False)
    if tag == "f" and type(raw) in (float, int):
        return normalize_value(float(raw), promoted=False)
    if tag == "i" and type(raw) is int:
        return normalize_value(raw, promoted=False)
    if tag == "b" and type(raw) is bool:
        return raw
    if tag == "s" and type(raw) is str:
        return normalize_value(raw, promoted=False)
    raise ValueError(f"malformed [tag, value] pair {[tag, raw]!r}")


_PLAIN_TAGS: dict[type, str] = {bool: "b", int: "i", float: "f", str: "s"}


def _typed(props: Mapping[str, Value]) -> dict[str, list[Any]]:
    """:func:`encode_value` of each value, inlined: it runs once per property published."""
    out: dict[str, list[Any]] = {}
    tags = _PLAIN_TAGS
    for k, v in props.items():
        tag = tags.get(type(v))
        if tag is not None:
            out[k] = [tag, v]
        elif type(v) is datetime and v.tzinfo is UTC:  # as normalised: orjson writes it
            out[k] = ["d", v]  # exactly as isoformat() does, and faster
        else:
            out[k] = encode_value(v)
    return out


if native is not None:
    native.setup_values(UTC, encode_value)


def _typed_any(props: Mapping[str, Value]) -> dict[str, list[Any]]:
    """:func:`_typed`, in C where it was built (for a dict; the same result)."""
    if compiled.NATIVE and type(props) is dict:
        return native.typed(props)
    return _typed(props)


def encode_context(promoted: Mapping[str, Value], written: Mapping[str, Value]) -> str:
    """Serialise a message context to typed JSON (compact, UTF-8 as it is). Where it was
    built, C writes the common context's text directly (the same text: a third of the
    time, once per message published); it leaves any other to orjson."""
    if compiled.NATIVE:
        text = native.context_json(promoted, written)
        if text is not None:
            return text
    return orjson.dumps({"promoted": _typed_any(promoted), "written": _typed_any(written)}).decode()


def decode_context(text: str) -> tuple[dict[str, Value], dict[str, Value]]:
    """Inverse of :func:`encode_context`: ``(promoted, written)``."""
    data = orjson.loads(text)
    return decode_values(data["promoted"]), decode_values(data["written"])


def decode_values(pairs: Mapping[str, object]) -> dict[str, Value]:
    """:func:`decode_value` of each value. It runs for every property of every message
    read, so the values that are already normal (ASCII text without NUL, 64-bit ints,
    finite floats, bools) are taken as they are, checked inline, without the calls
    (a third of the time of reading a batch of messages went there); any other goes
    through :func:`decode_value`, which checks and normalises it."""
    out: dict[str, Value] = {}
    for name, pair in pairs.items():
        if type(pair) is list and len(pair) == 2:
            tag, raw = pair
            kind = type(raw)
            if tag == "s":
                if kind is str and raw.isascii() and "\x00" not in raw:
                    out[name] = raw
                    continue
            elif tag == "i":
                if kind is int and INT64_MIN <= raw <= INT64_MAX:
                    out[name] = raw
                    continue
            elif tag == "f":
                if kind is float and math.isfinite(raw):
                    out[name] = raw
                    continue
            elif tag == "b" and kind is bool:
                out[name] = raw
                continue
        out[name] = decode_value(pair)
    return out


# --- values as text (command line, console forms) ---

VALUE_TYPES = ("str", "int", "float", "bool", "datetime")
"""The type names of :func:`parse_value`."""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a finite number")


def parse_value(text: str, type_name: str | None = None) -> Value:
    """A property value from text, or ``ValueError``.

    Without a type, the text is read as a JSON scalar when it is one (``12`` an int,
    ``12.5`` a float, ``true`` a bool, ``"EU"`` a str) and is otherwise the str itself
    (``EU``). A type forces the reading: ``str`` (the text as it is), ``int``, ``float``,
    ``bool`` (``true`` or ``false``) or ``datetime`` (ISO 8601 with an offset or ``Z``).
    """
    if type_name is None:
        try:
            value: object = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError:
            value = text
        if value is None or isinstance(value, list | dict):
            raise ValueError(
                f"{text!r} is JSON {type(value).__name__ if value is not None else 'null'}, "
                "not a property value (a str, number, bool or, with :datetime, a datetime)"
            )
        return normalize_value(value, promoted=False)
    if type_name == "str":
        return normalize_value(text, promoted=False)
    if type_name == "int":
        try:
            return normalize_value(int(text.strip()), promoted=False)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not an int ({exc})") from exc
    if type_name == "float":
        try:
            return normalize_value(float(text.strip()), promoted=False)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a float ({exc})") from exc
    if type_name == "bool":
        if text.strip().lower() not in ("true", "false"):
            raise ValueError(f"{text!r} is not a bool (true or false)")
        return text.strip().lower() == "true"
    if type_name == "datetime":
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError as exc:
            raise ValueError(f"{text!r} is not an ISO 8601 datetime") from exc
        if when.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone: add an offset (+02:00) or Z")
        return normalize_value(when, promoted=False)
    raise ValueError(f"unknown type {type_name!r} (one of {', '.join(VALUE_TYPES)})")


def parse_assignment(text: str) -> tuple[str, Value]:
    """``name=value`` or ``name:type=value`` (see :func:`parse_value`), e.g.
    ``orders.Total=12.5``, ``orders.Region=EU``, ``orders.Zip:str=01234``,
    ``orders.At:datetime=2024-05-01T10:00:00Z``. Raises ``ValueError`` naming the part."""
    left, sep, raw = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r} is not name=value (or name:type=value)")
    name, colon, type_name = left.partition(":")
    name = canonical_name(name.strip())
    try:
        return name, parse_value(raw, type_name.strip() if colon else None)
    except ValueError as exc:
        raise ValueError(f"property {name!r}: {exc}") from exc


def properties_from_json(data: object) -> dict[str, Value]:
    """Properties from decoded JSON: an object of name to a JSON scalar or a typed
    ``[tag, value]`` pair (``["d", "2024-05-01T10:00:00+00:00"]`` for a datetime, as in
    a stored context). Names come back canonical; a name given twice (``BTS.X`` and
    ``messagebox.X``) is refused. Raises ``ValueError`` naming the property."""
    if not isinstance(data, dict):
        raise ValueError(f"properties must be a JSON object, not {type(data).__name__}")
    out: dict[str, Value] = {}
    for given, raw in data.items():
        name = canonical_name(given)
        if name in out:
            raise ValueError(f"property {given!r} is given twice")
        try:
            if isinstance(raw, list):
                value = decode_value(raw)
            elif raw is None or isinstance(raw, dict):
                raise ValueError(
                    "not a property value (a str, number, bool or a [tag, value] pair)"
                )
            else:
                value = normalize_value(raw, promoted=False)
        except ValueError as exc:
            raise ValueError(f"property {name!r}: {exc}") from exc
        out[name] = value
    return out
