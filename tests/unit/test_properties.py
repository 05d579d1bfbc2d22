"""Property names, value normalisation, the exact (hi, lo) number encoding and the typed
context encoding (docs/concepts.md: Messages)."""

from __future__ import annotations

import itertools
import json
import math
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from enum import IntEnum

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from messagebox.properties import (
    INT64_MAX,
    INT64_MIN,
    MAX_NAME_LENGTH,
    MAX_PROMOTED_STRING,
    Family,
    canonical_name,
    datetime_micros,
    decode_context,
    decode_value,
    decode_values,
    encode_context,
    encode_value,
    exact_pair,
    family,
    is_reserved,
    normalize_value,
    sql_key,
    values_equal,
)

TWO_53 = 2**53
PLUS_2 = timezone(timedelta(hours=2))
NOON_UTC = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


class Colour(IntEnum):
    RED = 1


# --- canonical_name --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["orders.Total", "a.b", "my-ns.Sub_Name.Leaf", "x1.y2", "BTSX.Type", "x." + "y" * 254],
    ids=["plain", "short", "dashes-dots", "digits", "bts-lookalike", "256-chars"],
)
def test_an_ordinary_name_is_its_own_canonical_name(name: str) -> None:
    assert canonical_name(name) == name


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("BTS.MessageType", "messagebox.MessageType"),
        ("bts.MessageType", "messagebox.MessageType"),
        ("Bts.MessageType", "messagebox.MessageType"),
        ("messagebox.MessageType", "messagebox.MessageType"),
        ("MessageBox.MessageType", "messagebox.MessageType"),
        ("MESSAGEBOX.MessageType", "messagebox.MessageType"),
        ("BTS.Inbound.Transport", "messagebox.Inbound.Transport"),
    ],
)
def test_the_reserved_namespace_and_its_alias_are_case_insensitive(
    name: str, canonical: str
) -> None:
    assert canonical_name(name) == canonical


def test_the_name_after_the_namespace_keeps_its_case() -> None:
    assert canonical_name("BTS.messageTYPE") == "messagebox.messageTYPE"


@pytest.mark.parametrize(
    ("name", "culprit"),
    [
        ("orders", "not of the form namespace.Name"),
        ("", "not of the form namespace.Name"),
        ("orders.", "not of the form namespace.Name"),
        (".Total", "not of the form namespace.Name"),
        ("orders..Total", "not of the form namespace.Name"),
        ("orders.To tal", "not of the form namespace.Name"),
        ("orders.'Total'", "not of the form namespace.Name"),
        ("a.b'; DROP TABLE x;--", "not of the form namespace.Name"),
        ("orders.Total\n", "not of the form namespace.Name"),
        ("orders.Tötal", "not of the form namespace.Name"),
        ("x." + "y" * 255, f"longer than {MAX_NAME_LENGTH} characters"),
        (5, "must be a str, not int"),
        (None, "must be a str, not NoneType"),
        (b"orders.Total", "must be a str, not bytes"),
    ],
    ids=[
        "no-dot",
        "empty",
        "no-name",
        "no-namespace",
        "double-dot",
        "space",
        "quotes",
        "sql",
        "newline",
        "non-ascii",
        "257-chars",
        "int",
        "none",
        "bytes",
    ],
)
def test_a_bad_name_is_refused(name: object, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        canonical_name(name)


@pytest.mark.parametrize(
    ("name", "reserved"),
    [
        ("messagebox.MessageType", True),
        ("orders.Total", False),
        ("messageboxes.Total", False),
        ("orders.messagebox", False),
    ],
)
def test_is_reserved_recognises_the_engine_namespace(name: str, reserved: bool) -> None:
    assert is_reserved(name) is reserved


def test_an_alias_is_reserved_once_canonical() -> None:
    assert is_reserved(canonical_name("BTS.ReceivePortName")) is True


# --- normalize_value -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "normal", "kind"),
    [
        (True, True, bool),
        (False, False, bool),
        (0, 0, int),
        (INT64_MAX, INT64_MAX, int),
        (INT64_MIN, INT64_MIN, int),
        (Colour.RED, 1, int),
        (1.5, 1.5, float),
        (-0.0, 0.0, float),
        (Decimal("2"), 2, int),
        (Decimal("2.000"), 2, int),
        (Decimal("-0"), 0, int),
        (Decimal("2.5"), 2.5, float),
        (Decimal("0.1"), 0.1, float),
        (Decimal(INT64_MAX), INT64_MAX, int),
        (Decimal("1E+3"), 1000, int),
        ("PO", "PO", str),
        ("", "", str),
        ("x" * MAX_PROMOTED_STRING, "x" * MAX_PROMOTED_STRING, str),
        ("é😀", "é😀", str),
    ],
    ids=repr,
)
def test_a_value_normalises_to_its_plain_type(value: object, normal: object, kind: type) -> None:
    result = normalize_value(value)
    assert result == normal
    assert type(result) is kind


def test_an_aware_datetime_moves_to_utc() -> None:
    # Given 14:00 at +02:00
    value = datetime(2024, 6, 1, 14, 0, tzinfo=PLUS_2)
    # When normalised
    result = normalize_value(value)
    # Then it is 12:00 UTC: the same instant
    assert result == NOON_UTC
    assert isinstance(result, datetime)
    assert result.tzinfo is UTC
    assert result.hour == 12


@pytest.mark.parametrize(
    ("value", "culprit"),
    [
        (float("inf"), "not finite"),
        (float("-inf"), "not finite"),
        (float("nan"), "not finite"),
        (Decimal("NaN"), "not finite"),
        (Decimal("sNaN"), "not finite"),
        (Decimal("Infinity"), "not finite"),
        (Decimal(2**63), "does not fit in 64 bits"),
        (Decimal("1E+30"), "does not fit in 64 bits"),
        (INT64_MAX + 1, "does not fit in 64 bits"),
        (INT64_MIN - 1, "does not fit in 64 bits"),
        (datetime(2024, 1, 1), "timezone-aware"),
        ("a\x00b", "NUL"),
        ("\ud800", "lone surrogate"),
        ("ok\udc00", "lone surrogate"),
        ("x" * (MAX_PROMOTED_STRING + 1), "at most 256 can be promoted"),
        (None, "unsupported value type NoneType"),
        (b"PO", "unsupported value type bytes"),
        (date(2024, 1, 1), "unsupported value type date"),
        ([1], "unsupported value type list"),
        (1 + 2j, "unsupported value type complex"),
    ],
    ids=[
        "inf",
        "-inf",
        "nan",
        "decimal-nan",
        "decimal-snan",
        "decimal-inf",
        "decimal-too-big",
        "decimal-1e30",
        "int-too-big",
        "int-too-small",
        "naive-datetime",
        "nul",
        "high-surrogate",
        "low-surrogate",
        "long-string",
        "none",
        "bytes",
        "date",
        "list",
        "complex",
    ],
)
def test_a_bad_value_is_refused(value: object, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        normalize_value(value)


def test_a_written_string_may_be_longer_than_a_promoted_one() -> None:
    long = "x" * (MAX_PROMOTED_STRING * 10)
    assert normalize_value(long, promoted=False) == long


def test_a_written_string_still_may_not_contain_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        normalize_value("a\x00b", promoted=False)


# --- families and equality -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fam"),
    [
        ("1", Family.STR),
        (1, Family.NUM),
        (1.0, Family.NUM),
        (True, Family.BOOL),
        (NOON_UTC, Family.DATETIME),
    ],
    ids=repr,
)
def test_each_value_belongs_to_one_family(value: object, fam: Family) -> None:
    assert family(value) is fam  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1.0, True),
        (1, True, False),
        (0, False, False),
        ("1", 1, False),
        (TWO_53 + 1, float(TWO_53), False),
        (NOON_UTC, datetime(2024, 6, 1, 14, tzinfo=PLUS_2), True),
    ],
    ids=repr,
)
def test_values_are_equal_only_within_a_family(a: object, b: object, equal: bool) -> None:
    assert values_equal(a, b) is equal  # type: ignore[arg-type]


# --- exact_pair ------------------------------------------------------------------------

TRICKY_NUMBERS: list[int | float] = [
    TWO_53 - 1,
    TWO_53,
    TWO_53 + 1,
    TWO_53 + 2,
    TWO_53 + 3,
    float(TWO_53),
    float(TWO_53 + 2),
    float(TWO_53) + 4,
    -TWO_53 - 1,
    float(-TWO_53),
    INT64_MAX,
    INT64_MAX - 1,
    INT64_MAX - 512,
    INT64_MAX - 513,
    INT64_MAX - 1024,
    INT64_MAX - 1025,
    float(INT64_MAX - 1024),
    float(2**63),
    INT64_MIN,
    INT64_MIN + 1,
    -float(2**63),
    0,
    0.0,
    -0.0,
    1,
    1.0,
    0.5,
    -0.5,
    5e-324,
    1e300,
    -1e300,
]


def test_sorting_by_exact_pair_is_sorting_by_value() -> None:
    # Given numbers that doubles alone cannot tell apart
    by_value = sorted(TRICKY_NUMBERS)
    # When they are sorted by their (hi, lo) pairs
    by_pair = sorted(TRICKY_NUMBERS, key=exact_pair)
    # Then the order is the same (ties are equal values either way)
    assert [exact_pair(v) for v in by_pair] == [exact_pair(v) for v in by_value]
    assert all(a <= b for a, b in itertools.pairwise(by_pair))


@pytest.mark.parametrize(
    ("a", "b"), list(itertools.combinations(TRICKY_NUMBERS, 2)), ids=lambda v: repr(v)
)
def test_exact_pairs_compare_as_their_values(a: int | float, b: int | float) -> None:
    assert (exact_pair(a) < exact_pair(b)) is (a < b)
    assert (exact_pair(a) == exact_pair(b)) is (a == b)


@pytest.mark.parametrize(
    ("value", "pair"),
    [
        (TWO_53 + 1, (float(TWO_53), 1.0)),
        (INT64_MAX, (float(2**63), -1.0)),
        (INT64_MIN, (-float(2**63), 0.0)),
        (1, (1.0, 0.0)),
        (1.0, (1.0, 0.0)),
        (-0.0, (0.0, 0.0)),
    ],
    ids=repr,
)
def test_exact_pair_splits_a_number_into_a_double_and_its_exact_rest(
    value: int | float, pair: tuple[float, float]
) -> None:
    assert exact_pair(value) == pair


def test_negative_zero_folds_into_zero() -> None:
    hi, _ = exact_pair(-0.0)
    assert str(hi) == "0.0"


@settings(database=None, max_examples=300)
@given(
    st.one_of(st.integers(INT64_MIN, INT64_MAX), st.floats(allow_nan=False, allow_infinity=False)),
    st.one_of(st.integers(INT64_MIN, INT64_MAX), st.floats(allow_nan=False, allow_infinity=False)),
)
def test_exact_pairs_order_any_two_numbers_as_their_values(a: int | float, b: int | float) -> None:
    assert (exact_pair(a) < exact_pair(b)) is (a < b)
    assert (exact_pair(a) == exact_pair(b)) is (a == b)


@settings(database=None, max_examples=300)
@given(st.integers(INT64_MIN, INT64_MAX))
def test_the_rest_of_an_int64_is_small_and_exact(value: int) -> None:
    hi, lo = exact_pair(value)
    assert abs(lo) <= 2**10
    assert int(hi) + int(lo) == value


# --- sql_key and datetime_micros -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (True, (1.0, 0.0)),
        (False, (0.0, 0.0)),
        (TWO_53 + 1, (float(TWO_53), 1.0)),
        (datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC), (1.0, 0.0)),
        (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), (-1.0, 0.0)),
    ],
    ids=repr,
)
def test_sql_key_encodes_non_string_values(value: object, key: tuple[float, float]) -> None:
    assert sql_key(value) == key  # type: ignore[arg-type]


def test_a_string_has_no_sql_key() -> None:
    with pytest.raises(TypeError, match="strings have no numeric key"):
        sql_key("1")


def test_datetime_micros_is_exact_across_time_zones() -> None:
    assert datetime_micros(datetime(2024, 6, 1, 14, 0, 0, 7, tzinfo=PLUS_2)) == (
        datetime_micros(NOON_UTC) + 7
    )
    assert datetime_micros(NOON_UTC) == 1717243200 * 10**6


# --- typed value and context encoding --------------------------------------------------

TYPED_VALUES = [
    1,
    1.0,
    "1",
    True,
    False,
    0,
    -0.0,
    INT64_MAX,
    INT64_MIN,
    TWO_53 + 1,
    0.1,
    5e-324,
    1.7976931348623157e308,
    "",
    "é😀\u2028\"'\\",
    NOON_UTC,
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


@pytest.mark.parametrize("value", TYPED_VALUES, ids=repr)
def test_a_value_survives_encode_and_decode_with_its_type(value: object) -> None:
    # When a value is encoded, sent through JSON text and decoded
    back = decode_value(json.loads(json.dumps(encode_value(value))))  # type: ignore[arg-type]
    # Then it is the same value of the same type
    assert back == value
    assert type(back) is type(value)


def test_a_float_tag_makes_an_integral_payload_a_float() -> None:
    back = decode_value(["f", 1])
    assert back == 1.0
    assert type(back) is float


@pytest.mark.parametrize(
    ("value", "tag"),
    [(True, "b"), (1, "i"), (1.0, "f"), ("1", "s"), (NOON_UTC, "d")],
    ids=repr,
)
def test_each_type_has_its_own_tag(value: object, tag: str) -> None:
    assert encode_value(value)[0] == tag  # type: ignore[arg-type]


def test_a_context_survives_encode_and_decode_with_its_types() -> None:
    # Given promoted and written properties of every type, with values easy to confuse
    promoted = {
        "t.Int": 1,
        "t.Float": 1.0,
        "t.Str": "1",
        "t.Bool": True,
        "t.When": NOON_UTC,
        "messagebox.MessageType": "PO",
        "t.Big": INT64_MAX,
        "t.Exact": TWO_53 + 1,
    }
    written = {"t.Note": "é" * 1000, "t.Zero": 0, "t.No": False}
    # When the context is encoded and decoded
    back_promoted, back_written = decode_context(
        encode_context(promoted, written)  # type: ignore[arg-type]
    )
    # Then both halves come back equal, every value of its original type
    assert back_promoted == promoted
    assert back_written == written
    for original, back in ((promoted, back_promoted), (written, back_written)):
        assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in original.items()}


_PAYLOADS = st.one_of(
    st.booleans(),
    st.integers(INT64_MIN - 2, INT64_MAX + 2),
    st.sampled_from([INT64_MIN - 1, INT64_MIN, INT64_MAX, INT64_MAX + 1]),
    st.floats(),  # NaN and infinities too
    st.sampled_from([math.inf, -math.inf, math.nan]),
    st.text(),  # surrogates and non-ASCII text too
    st.text(st.characters(max_codepoint=127), max_size=4),  # ASCII, NUL too
    st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat),
    st.none(),
)
_PAIRS = st.one_of(
    st.tuples(st.sampled_from(["b", "i", "f", "s", "d", "x"]), _PAYLOADS).map(list),
    st.lists(_PAYLOADS, max_size=3),  # not a pair
    _PAYLOADS,
)


def _decoded_or_error(pair: object) -> tuple[object, object]:
    try:
        value = decode_value(pair)
    except ValueError as exc:
        return ("error", str(exc))
    return (type(value), value)


@given(st.dictionaries(st.text(min_size=1, max_size=5), _PAIRS, max_size=6))
@example({"a": ["s", "a\x00"]})
@example({"a": ["i", INT64_MAX + 1]})
@example({"a": ["f", math.nan]})
@example({"a": ["b", 1]})
@settings(max_examples=400)
def test_decoding_many_values_agrees_with_decoding_each(pairs: dict[str, object]) -> None:
    # Given stored [tag, value] pairs, well-formed or not
    # When they are decoded together (the fast path of every message read)
    together: dict[str, tuple[object, object]]
    try:
        together = {k: (type(v), v) for k, v in decode_values(pairs).items()}
    except ValueError as exc:
        together = {"error": ("error", str(exc))}
    # Then each value, its type, and the first error are what decoding one by one gives
    each = {k: _decoded_or_error(v) for k, v in pairs.items()}
    errors = [e for e in each.values() if e[0] == "error"]
    if errors:
        assert together == {"error": errors[0]}
    else:
        assert repr(together) == repr(each)  # repr: NaN is not equal to itself


def test_an_empty_context_survives_encode_and_decode() -> None:
    assert decode_context(encode_context({}, {})) == ({}, {})


def test_a_context_datetime_keeps_its_instant() -> None:
    # Given a datetime not yet moved to UTC
    when = datetime(2024, 6, 1, 14, 0, tzinfo=PLUS_2)
    # When the context goes through its encoding
    promoted, _ = decode_context(encode_context({"t.When": when}, {}))
    back = promoted["t.When"]
    # Then it is the same instant, still time-zone aware
    assert back == NOON_UTC
    assert isinstance(back, datetime)
    assert back.utcoffset() is not None


@pytest.mark.parametrize(
    "pair",
    [
        ["x", 1],
        ["d", "yesterday"],
        ["d", 5],
        ["d", "2024-01-01T00:00:00"],
        ["f", "not a number"],
        ["i"],
        ["i", 1, 2],
        "i1",
        None,
    ],
    ids=repr,
)
def test_decoding_an_unknown_or_bad_value_raises_value_error(pair: object) -> None:
    with pytest.raises(
        ValueError, match=r"malformed|bad datetime|timezone-aware|expected a \[tag, value\] pair"
    ):
        decode_value(pair)


@pytest.mark.parametrize(
    "pair",
    [["i", "1"], ["i", True], ["i", 1.5], ["s", 5], ["b", 1], ["f", "1e3"], ["f", True]],
    ids=repr,
)
def test_decoding_a_payload_that_does_not_match_its_tag_raises_value_error(
    pair: list[object],
) -> None:
    # Given a context whose value is tagged as one type but holds another
    text = json.dumps({"promoted": {"t.X": pair}, "written": {}})
    # Then decoding refuses it rather than returning the other type
    with pytest.raises(ValueError, match="malformed"):
        decode_context(text)


@settings(max_examples=300)
@given(
    when=st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(seconds=3_630))]
        ),
    )
)
def test_a_context_writes_datetimes_as_isoformat_does(when: datetime) -> None:
    """UTC datetimes (what normalisation makes) are written by the JSON encoder itself,
    others by ``isoformat``: the stored text is the same either way, and reads back."""
    utc = normalize_value(when, promoted=True)
    assert isinstance(utc, datetime)
    promoted = {"t.when": utc}
    written = {"t.raw": when}  # not normalised: kept as given
    text = encode_context(promoted, written)
    assert json.loads(text) == {
        "promoted": {"t.when": ["d", utc.isoformat()]},
        "written": {"t.raw": ["d", when.isoformat()]},
    }
    assert decode_context(text)[0] == promoted
