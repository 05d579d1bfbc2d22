"""Correlation keys (docs/concepts.md: Orchestrations): two messages reach one convoy
instance exactly when
routing finds their correlation values equal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from messagebox.delivery import service_instances
from messagebox.delivery.service_instances import message_ids
from messagebox.properties import Value, normalize_value, values_equal
from messagebox.routing.convoys import correlation_key
from tests.strategies import values


@given(values, values)
def test_equal_keys_exactly_when_routing_finds_the_values_equal(a: object, b: object):
    va, vb = normalize_value(a), normalize_value(b)
    same_key = correlation_key(["x.Id"], {"x.Id": va}) == correlation_key(["x.Id"], {"x.Id": vb})
    assert same_key == values_equal(va, vb)


def test_numbers_of_both_types_share_a_key_and_families_never_do():
    key = correlation_key
    assert key(["x.Id"], {"x.Id": 42}) == key(["x.Id"], {"x.Id": 42.0})
    assert key(["x.Id"], {"x.Id": 42}) != key(["x.Id"], {"x.Id": "42"})
    assert key(["x.Id"], {"x.Id": True}) != key(["x.Id"], {"x.Id": 1})
    moment = datetime(2026, 11, 23, 12, tzinfo=UTC)
    same_instant = normalize_value(moment.astimezone(timezone(timedelta(hours=2))))
    assert key(["x.Id"], {"x.Id": moment}) == key(["x.Id"], {"x.Id": same_instant})
    assert key(["x.Id"], {"x.Id": moment}) != key(
        ["x.Id"], {"x.Id": moment + timedelta(microseconds=1)}
    )


def test_a_key_covers_every_correlation_property_in_order():
    props: dict[str, Value] = {"a.X": "1", "a.Y": 2}
    assert correlation_key(["a.X", "a.Y"], props) != correlation_key(["a.Y", "a.X"], props)
    assert correlation_key(["a.X", "a.Z"], props) != correlation_key(["a.X"], props)


def test_a_step_run_again_gets_the_same_message_ids():
    assert message_ids("i-1", 3, 2) == message_ids("i-1", 3, 2)
    assert len(set(message_ids("i-1", 3, 5))) == 5
    assert set(message_ids("i-1", 3, 2)).isdisjoint(message_ids("i-1", 4, 2))
    assert set(message_ids("i-1", 3, 2)).isdisjoint(message_ids("i-2", 3, 2))


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), _json, max_size=4))
def test_instance_data_reads_back_as_the_standard_library_would(data: dict[str, object]):
    """A step's data (a state dumped in JSON mode) is written by orjson where that gives
    the same JSON, by the standard library elsewhere (NaN, infinities, ints past 64
    bits); either way it reads back as ``json.dumps`` then ``json.loads`` would give."""
    expected = json.loads(json.dumps(data, ensure_ascii=False, default=str))
    back = service_instances._load(service_instances._dump(data))
    assert json.dumps(back, sort_keys=True) == json.dumps(expected, sort_keys=True)
