"""The compiled helpers of the publish path (messagebox/_native.c) against their Python
reference (ids.py, properties.py): the same UUIDs from the same time and random bytes,
the same bytes of a UUID column, the same typed context. Where the helpers were not
built the tests skip, except when ``CI=true``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from enum import IntEnum

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from messagebox import compiled, properties
from messagebox.compiled import native
from messagebox.message import Message
from messagebox.models import Outcome, Routed
from messagebox.properties import Value
from messagebox.routing.writes import Writes
from messagebox.storage import ids, spool
from messagebox.storage.dialects import Uuids
from tests.conftest import IN_CI

pytestmark = pytest.mark.skipif(
    native is None and not IN_CI, reason="the compiled helpers were not built"
)


class Level(IntEnum):
    LOW = 1


@given(st.integers(0, 2**48 - 1), st.lists(st.binary(min_size=10, max_size=10), max_size=20))
def test_compiled_uuid7s_are_the_python_ones(ms: int, chunks: list[bytes]) -> None:
    rand = b"".join(chunks)
    made = native.uuid7s(ms, rand)
    expected = ids._uuid7s(ms, rand)
    assert made == expected
    for u, same in zip(made, expected, strict=True):
        assert type(u) is uuid.UUID
        assert (u.int, u.is_safe, u.version, u.variant) == (
            same.int,
            same.is_safe,
            7,
            uuid.RFC_4122,
        )
        assert u.int >> 80 == ms


def test_compiled_uuid7s_refuse_a_partial_id() -> None:
    with pytest.raises(ValueError, match="10 bytes per UUID"):
        native.uuid7s(0, b"123456789")


@given(st.lists(st.integers(0, 2**128 - 1), max_size=30))
def test_compiled_uuid_bytes_are_each_uuids_bytes(numbers: list[int]) -> None:
    values = [uuid.UUID(int=n) for n in numbers]
    assert native.uuid_bytes(values) == b"".join(v.bytes for v in values)
    assert ids.uuid_bytes(values) == b"".join(v.bytes for v in values)


@pytest.mark.parametrize("odd", ["6f1c…", None, 7])
def test_a_column_with_a_value_not_a_uuid_has_no_bytes(
    odd: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = [uuid.UUID(int=1), odd]
    with pytest.raises(TypeError, match="value 1 is"):
        native.uuid_bytes(values)
    assert ids.uuid_bytes(values) is None
    monkeypatch.setattr(compiled, "NATIVE", False)  # the Python reference says the same
    assert ids.uuid_bytes(values) is None
    assert ids.uuid_bytes(values[:1]) == uuid.UUID(int=1).bytes


values = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-3))])),
    st.datetimes(),  # naive
    st.sampled_from([Level.LOW, Decimal("1.5")]),  # subclasses and other types
)


@given(st.dictionaries(st.text(max_size=4), values, max_size=8))
def test_compiled_typed_context_is_the_python_one(props: dict[str, object]) -> None:
    """Every value tagged as properties._typed tags it (exact types only; a datetime in
    UTC kept for the encoder; anything else through encode_value, errors included)."""
    try:
        expected = properties._typed(props)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        with pytest.raises(type(exc)):
            native.typed(props)
        return
    got = native.typed(props)
    assert got == expected
    assert [type(v[1]) for v in got.values()] == [type(v[1]) for v in expected.values()]


def test_encode_context_is_the_same_with_and_without_the_compiled_helpers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    promoted: dict[str, Value] = {
        "o.Rush": True,
        "o.Qty": 3,
        "o.Total": 12.5,
        "o.Region": "EU",
        "o.When": datetime(2024, 5, 1, 10, tzinfo=UTC),
    }
    written: dict[str, Value] = {
        "o.Note": 'é\n"x"',
        "o.Sent": datetime(2024, 5, 1, 7, tzinfo=timezone(timedelta(hours=-3))),
    }
    made = properties.encode_context(promoted, written)
    monkeypatch.setattr(compiled, "NATIVE", False)
    assert properties.encode_context(promoted, written) == made
    assert properties.decode_context(made)[0] == promoted


def _orjson_context(promoted: dict[str, object], written: dict[str, object]) -> str:
    """encode_context's text as the Python path writes it (orjson)."""
    return orjson.dumps(
        {"promoted": properties._typed(promoted), "written": properties._typed(written)}  # type: ignore[arg-type]
    ).decode()


plain_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=6)
plain_values = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: "e" not in repr(f)),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8),
    st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)),
)
"""The values C writes itself (text with '"' and '\\', which it leaves to orjson)."""

any_names = st.one_of(plain_names, st.text(max_size=4))
any_values = st.one_of(
    plain_values,
    values,
    st.floats(),  # exponents, inf and nan too
    st.integers(-(2**64), 2**64 - 1),
    st.text(max_size=6),
)


@given(
    st.dictionaries(any_names, any_values, max_size=6),
    st.dictionaries(any_names, any_values, max_size=3),
)
def test_compiled_context_text_is_orjsons_or_none(
    promoted: dict[str, object], written: dict[str, object]
) -> None:
    """C writes a context's JSON text exactly as orjson does, or gives it back (None)
    for encode_context to write in Python: non-ASCII or escaped text, a float repr
    writes with an exponent, an int over 64 bits, a datetime not in UTC, ..."""
    try:
        expected = _orjson_context(promoted, written)
    except (ValueError, TypeError, orjson.JSONEncodeError):
        assert native.context_json(promoted, written) is None
        return
    got = native.context_json(promoted, written)
    assert got is None or got == expected
    assert properties.encode_context(promoted, written) == expected  # type: ignore[arg-type]


@given(
    st.dictionaries(plain_names, plain_values, max_size=8),
    st.dictionaries(plain_names, plain_values, max_size=3),
)
def test_compiled_context_text_covers_the_common_values(
    promoted: dict[str, object], written: dict[str, object]
) -> None:
    """A context of plain names and values is written in C (not given back), as orjson
    writes it, when no text holds a quote or a backslash."""
    expected = _orjson_context(promoted, written)
    got = native.context_json(promoted, written)
    given_values = [*promoted.values(), *written.values()]
    texts = [*promoted, *written, *(v for v in given_values if type(v) is str)]
    if any('"' in t or "\\" in t for t in texts):
        assert got is None
    else:
        assert got == expected


def test_compiled_context_text_of_a_published_message() -> None:
    promoted: dict[str, Value] = {
        "orders.Region": "UK",
        "orders.Total": 8474.34,
        "orders.Qty": -98,
        "orders.Placed": datetime(2024, 4, 9, 1, 24, 56, 120, tzinfo=UTC),
        "orders.Rush": False,
    }
    assert native.context_json(promoted, {"orders.Note": "n"}) == (
        '{"promoted":{"orders.Region":["s","UK"],"orders.Total":["f",8474.34],'
        '"orders.Qty":["i",-98],"orders.Placed":["d","2024-04-09T01:24:56.000120+00:00"],'
        '"orders.Rush":["b",false]},"written":{"orders.Note":["s","n"]}}'
    )
    assert native.context_json({"a": 1e16}, {}) is None  # repr 1e+16, orjson 1e16
    assert native.context_json({}, {"a": "é"}) is None


@given(st.lists(st.integers(0, 4), max_size=30), st.booleans())
def test_compiled_results_are_the_python_ones(counts: list[int], suspend: bool) -> None:
    """routed_all's results, made in C and in Python: equal, frozen, of the same type."""
    batch = [uuid.UUID(int=i + 1) for i in range(len(counts))]
    subs = tuple(range(100, 100 + sum(counts)))

    def results() -> list[Routed]:
        writes = Writes.empty(datetime(2024, 1, 1, tzinfo=UTC))
        writes.columns = {"sub": subs}
        entries = list(range(1, sum(counts) + len(counts) + 1))
        return writes.routed_all(entries, batch, counts, suspend_unrouted=suspend)

    made = results()
    before, compiled.NATIVE = compiled.NATIVE, False
    try:
        expected = results()
    finally:
        compiled.NATIVE = before
    assert made == expected
    assert [type(r) for r in made] == [Routed] * len(counts)
    assert [hash(r) for r in made] == [hash(r) for r in expected]
    if made:
        with pytest.raises(AttributeError):
            made[0].outcome = Outcome.DROPPED  # type: ignore[misc]


def test_compiled_results_refuse_counts_that_do_not_fit() -> None:
    batch = [uuid.UUID(int=1), uuid.UUID(int=2)]
    with pytest.raises(ValueError, match="one count per id"):
        native.routed(Routed, batch, [1], (7,), Outcome.ROUTED, Outcome.DROPPED)
    with pytest.raises(ValueError, match="do not fit"):
        native.routed(Routed, batch, [1, 2], (7, 8), Outcome.ROUTED, Outcome.DROPPED)
    with pytest.raises(TypeError):
        native.routed(Routed, batch, (1, 1), (7, 8), Outcome.ROUTED, Outcome.DROPPED)  # type: ignore[arg-type]


part_data = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=10),  # stored as UTF-8: given back to Python
)


message_values = st.one_of(  # some not plain; a Message refuses NUL and lone surrogates
    plain_values,
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=3),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    names = draw(st.lists(st.sampled_from(["body", "x", "y", "é"]), min_size=1, unique=True))
    keys = st.sampled_from(["A", "B", "C-2", "D_1"])
    return Message(
        parts={name: draw(part_data) for name in names},
        promoted=draw(st.dictionaries(keys.map("p.".__add__), message_values, max_size=4)),
        written=draw(st.dictionaries(keys.map("w.".__add__), message_values, max_size=2)),
        body_part=draw(st.sampled_from(names)),
    )


@given(st.lists(messages(), max_size=8), st.integers(0, 50))
def test_compiled_message_columns_are_the_python_ones(
    batch: list[Message], fragment_size: int
) -> None:
    """A batch's spool, link and part columns, made in C: those spool._columns makes
    (which is what a batch of one fragment per part needs), or None when a message's
    context is not plain or a part is not bytes of at most ``fragment_size``."""
    got = native.message_columns(batch, fragment_size)
    plain = all(
        native.context_json(m.promoted, m.written) is not None
        and all(type(d) is bytes and len(d) <= fragment_size for d in m.parts.values())
        for m in batch
    )
    if not plain:
        assert got is None
        return
    part_ids = Uuids(ids.uuid7s(sum(len(m.parts) for m in batch)))
    assert got == spool._columns(None, None, batch, part_ids)  # type: ignore[arg-type]


def test_compiled_message_columns_refuse_what_is_not_a_list_of_messages() -> None:
    with pytest.raises(TypeError, match="a list and an int"):
        native.message_columns((), 10)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        native.message_columns([object()], 10)


def test_compiled_message_columns_of_a_published_batch() -> None:
    batch = [
        Message(b"<a/>", promoted={"o.Region": "UK", "o.Total": 10.5}),
        Message(parts={"head": b"h", "body": b"<b/>"}, body_part="body", written={"o.N": 1}),
    ]
    assert native.message_columns(batch, 10) == (
        [
            '{"promoted":{"o.Region":["s","UK"],"o.Total":["f",10.5]},"written":{}}',
            '{"promoted":{},"written":{"o.N":["i",1]}}',
        ],
        [1, 2],
        ["body", "body"],
        [0, 1, 1],
        [0, 0, 1],
        ["body", "head", "body"],
        [4, 1, 4],
        [1, 1, 1],
        [b"<a/>", b"h", b"<b/>"],
    )
    assert native.message_columns(batch, 3) is None  # a part of two fragments
