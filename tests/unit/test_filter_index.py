"""The in-memory evaluator (predicates.index.FilterIndex) agrees with the reference
evaluator on the shared random filters and messages, also after filters are replaced
and removed: both of its matchers, the compiled one (predicates/_native.c) and the pure
Python one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from messagebox.predicates import Filter, P, filter_matches, normalize_properties, to_filter
from messagebox.predicates import index as index_module
from messagebox.predicates.index import FilterIndex
from tests.conftest import IN_CI
from tests.strategies import EDGE_FLOATS, EDGE_INTS, filters, messages

MATCHERS = pytest.mark.parametrize(
    "native",
    [
        False,
        # CI=true: FilterIndex(native=True) fails where the module was not built
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                not index_module.BUILT and not IN_CI,
                reason="the compiled matcher was not built (no C compiler at install time)",
            ),
        ),
    ],
    ids=["python", "native"],
)
"""Both matchers: the compiled one (predicates/_native.c) and the pure-Python one."""


def _want(subs: dict[int, Filter], props: dict[str, object]) -> set[int]:
    normal = normalize_properties(props)
    return {k for k, f in subs.items() if filter_matches(f, normal)}


@MATCHERS
@settings(max_examples=600, deadline=None)
@given(subs=st.lists(filters, min_size=1, max_size=8), batch=st.lists(messages, max_size=8))
def test_the_index_agrees_with_the_reference_evaluator(
    native: bool, subs: list[Filter], batch: list[dict[str, object]]
) -> None:
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update(enumerate(subs))
    want = [sorted(_want(dict(enumerate(subs)), props)) for props in batch]
    for props, keys in zip(batch, want, strict=True):
        assert index.match(normalize_properties(props)) == set(keys)
    flat, counts = index.matching_all([normalize_properties(props) for props in batch])
    assert (flat, counts) == ([k for keys in want for k in keys], [len(keys) for keys in want])


@MATCHERS
@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.one_of(st.none(), filters)), min_size=1, max_size=14
    ),
    batch=st.lists(messages, min_size=1, max_size=6),
)
def test_replacing_and_removing_filters_keeps_the_index_exact(
    native: bool, steps: list[tuple[int, Filter | None]], batch: list[dict[str, object]]
) -> None:
    index: FilterIndex[int] = FilterIndex(native=native)
    live: dict[int, Filter] = {}
    for key, filt in steps:
        if filt is None:
            index.remove(key)
            live.pop(key, None)
        else:
            index.add(key, filt)
            live[key] = filt
        for props in batch:
            assert index.match(normalize_properties(props)) == _want(live, props)
    assert len(index) == len(live)
    for key in list(live):
        index.remove(key)
    assert len(index) == 0
    assert not index._anchors
    assert not index._unanchored
    assert not index._groups


@MATCHERS
def test_exact_edges(native: bool) -> None:
    """Cases a hash or a sorted list could get wrong: a bool beside the number it equals
    in Python, 2**53 + 1 beside its nearest double, -0.0, the empty prefix, datetimes in
    another zone, and a group with no anchor."""
    x = P("t.x")
    cases: dict[int, Filter] = {
        0: Filter.of(x == 1),
        1: Filter.of(x == True),  # noqa: E712
        2: Filter.of(x > 2**53),
        3: Filter.of(x >= float(2**53)),
        4: Filter.of(x.prefix("")),
        5: Filter.of(x.not_exists()),
        6: Filter.of(x == 0.0),
        7: Filter.of(x < datetime(2024, 1, 1, tzinfo=UTC)),
        8: Filter.of(x.in_([1.0, "1", False])),
        9: Filter.of(x != 1),
    }
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update(cases.items())
    for value in (1, True, 1.0, 2**53, 2**53 + 1, float(2**53), -0.0, "", "1", False, 0):
        props: dict[str, object] = {"t.x": value}
        assert index.match(normalize_properties(props)) == _want(cases, props), value
    early = datetime(2023, 12, 31, 23, 0, tzinfo=UTC).astimezone()
    assert index.match(normalize_properties({"t.x": early})) == {7}  # != needs one family
    assert index.match({}) == {5}


@MATCHERS
def test_numbers_compare_exactly_at_every_edge(native: bool) -> None:
    """Every comparison and mask, with every edge number as the bound, against every
    edge number: the compiled matcher compares int64s and doubles directly only where
    that is exact (beyond 2**53 an int is not a double) and must agree with Python's
    exact comparisons everywhere else, also in a range whose bounds are not all
    doubles."""
    numbers = sorted({*EDGE_INTS, *EDGE_FLOATS, 2**53 - 1, 2**62 + 1, 0.1, -(2**53) - 2.0})
    x = P("t.x")
    shapes = [
        lambda b: x > b,
        lambda b: x >= b,
        lambda b: x < b,
        lambda b: x <= b,
        lambda b: x != b,
        lambda b: (x == 0.25) & (P("t.y") > b),  # not the anchor: checked after it
        lambda b: P("t.y").exists() & (x <= b),
    ]
    cases: dict[int, Filter] = {}
    for b in numbers:
        for shape in shapes:
            cases[len(cases)] = Filter.of(shape(b))
        if isinstance(b, int) and b:
            cases[len(cases)] = Filter.of(x.bitwise_and(b))
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update(cases.items())
    for v in numbers:
        batch: list[dict[str, object]] = [{"t.x": v}, {"t.x": v, "t.y": v}, {"t.x": 0.25, "t.y": v}]
        for props in batch:
            assert index.match(normalize_properties(props)) == _want(cases, props), props


@settings(max_examples=300, deadline=None)
@given(filt=filters)
def test_a_stored_filter_reads_back_equal_without_validation(filt: Filter) -> None:
    back = Filter.from_stored_json(filt.to_json())
    assert back == Filter.from_json(filt.to_json()) == filt
    assert back.to_json() == filt.to_json()


@MATCHERS
def test_a_large_index_leaves_the_garbage_collector_almost_nothing_to_walk(native: bool) -> None:
    """Every operator's groups are plain values after a collection: a full collection
    walks a few containers per property, not objects per subscription (closures made
    some seven per subscription, 700,000 at 100,000 subscriptions)."""
    import gc

    when = datetime(2024, 5, 1, tzinfo=UTC)
    shapes = [
        lambda i: (P("c.Id") == f"C{i}") & (P("c.Total") > i),
        lambda i: P("c.Id").in_([f"C{i}", f"D{i}"]) & P("c.Rush").exists(),
        lambda i: P("c.Sku").prefix(f"S{i}") & P("c.Flags").bitwise_and(i + 1),
        lambda i: (P("c.Placed") <= when) & (P("c.Region") != f"R{i}"),
        lambda i: (P("c.Rush") == True) & P("c.Gone").not_exists() & (P("c.Qty") >= i),  # noqa: E712
        lambda i: (P("c.Total") < i) | (P("c.Id") == f"E{i}"),
    ]
    filters = [to_filter(shapes[i % len(shapes)](i)) for i in range(3_000)]
    gc.collect()
    before = len(gc.get_objects())
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update(enumerate(filters))
    index.match({})  # the compiled matcher packs the anchors on its first match
    for _ in range(4):  # a collection untracks one level of nested tuples and dicts
        gc.collect()
    added = len(gc.get_objects()) - before  # the filters' own objects were counted before
    assert added < 100, f"{added} objects tracked for 3,000 filters"
    assert index.match(normalize_properties({"c.Id": "C6", "c.Total": 10_000})) == {6}


@MATCHERS
def test_a_mapping_that_is_not_a_dict_matches_the_same(native: bool) -> None:
    """The compiled matcher takes dicts; any other mapping is matched in Python."""
    from types import MappingProxyType

    index: FilterIndex[int] = FilterIndex(native=native)
    index.update([(1, Filter.of(P("t.x") > 2)), (2, Filter.of(P("t.y").not_exists()))])
    props = normalize_properties({"t.x": 3})
    assert index.match(MappingProxyType(props)) == index.match(props) == {1, 2}


def test_asking_for_the_compiled_matcher_where_it_was_not_built_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(index_module, "_native", None)
    with pytest.raises(RuntimeError, match="compiled matcher"):
        FilterIndex(native=True)
    assert FilterIndex(native=False).native is False


@MATCHERS
def test_the_compiled_matcher_keeps_no_memory_per_match(native: bool) -> None:
    """Every operator's path, matched many times, leaves no objects behind (a reference
    the C code forgot to drop would grow with every match)."""
    import tracemalloc

    when = datetime(2024, 5, 1, tzinfo=UTC)
    shapes = [
        lambda i: (P("c.Id") == f"C{i % 50}") & (P("c.Total") > i) & (P("c.Qty") <= 7),
        lambda i: P("c.Id").in_([f"C{i % 50}", True]) & P("c.Rush").exists(),
        lambda i: P("c.Sku").prefix(f"S{i % 9}") & P("c.Flags").bitwise_and(i + 1),
        lambda i: (P("c.Placed") <= when) & (P("c.Region") != f"R{i % 7}"),
        lambda i: (P("c.Rush") == True) & P("c.Gone").not_exists() & (P("c.Qty") >= i % 9),  # noqa: E712
        lambda i: (P("c.Total") < i) | (P("c.Id") == f"E{i}") | P("c.Sku").prefix("S1"),
        lambda i: P("c.Flags").bitwise_and(2**62 + i) | (P("c.Region") != 3),
        lambda i: P("c.Nothing").not_exists() & (P("c.Big") > 2**62),
    ]
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update((i, to_filter(shapes[i % len(shapes)](i))) for i in range(400))
    messages = [
        normalize_properties(
            {
                "c.Id": f"C{i % 60}",
                "c.Total": i * 1.5,
                "c.Qty": i % 11,
                "c.Rush": i % 3 == 0,
                "c.Sku": f"S{i}",
                "c.Flags": 2**62 + i if i % 5 == 0 else i,
                "c.Placed": datetime(2024, 1 + i % 12, 1, tzinfo=UTC),
                "c.Region": f"R{i % 9}" if i % 4 else i,
                "c.Big": 2**63 - 1 if i % 2 else 1.5,
            }
        )
        for i in range(60)
    ]
    want = [index.match(m) for m in messages]
    assert any(want)
    assert all(isinstance(w, set) for w in want)
    tracemalloc.start()
    try:
        for _ in range(3):
            for m, w in zip(messages, want, strict=True):
                assert index.match(m) == w
            index.matching_all(messages)
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(30):
            for m in messages:
                index.match(m)
            index.matching_all(messages)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4_096, f"{grown} bytes kept by 1,800 matches"


@MATCHERS
def test_replacing_filters_keeps_no_memory(native: bool) -> None:
    """Filters replaced and removed over and over, matched between the changes: the
    compiled buckets of what changed are rebuilt and the old ones freed, with the
    references they held."""
    import gc
    import sys
    import tracemalloc

    key = 10**30  # a key object of its own, to count the references to it
    bound = 2**62 + 12_345  # and a bound
    shapes = [
        lambda i: (P("c.Id") == f"C{i % 5}") & (P("c.Total") > i) & (P("c.Big") < bound),
        lambda i: (P("c.Total") <= i) | P("c.Sku").prefix(f"S{i % 3}"),
        lambda i: P("c.Flags").bitwise_and(i + 1) & (P("c.Region") != "R1"),
        lambda i: P("c.Rush").exists() & P("c.Gone").not_exists(),
        lambda i: P("c.Gone").not_exists(),
    ]
    made = [[to_filter(shape(r)) for shape in shapes] for r in range(3)]
    props = normalize_properties(
        {
            "c.Id": "C1",
            "c.Total": 3,
            "c.Sku": "S1",
            "c.Flags": 3,
            "c.Region": "R2",
            "c.Rush": 1,
            "c.Big": 1,
        }
    )
    index: FilterIndex[int] = FilterIndex(native=native)
    index.update((i, to_filter(shapes[i % len(shapes)](i))) for i in range(50))
    index.match(props)  # compiled: the compiled buckets hold their own references
    refs = sys.getrefcount(key), sys.getrefcount(bound)

    def churn(rounds: int) -> None:
        for r in range(rounds):
            for filt in made[r % len(made)]:
                index.add(key, filt)
                index.match(props)
            index.remove(key)
            index.match(props)

    tracemalloc.start()  # before the warm-up: a dict resized later frees what it traced
    try:
        churn(10)  # the index's dicts reach their working size
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        churn(60)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert (sys.getrefcount(key), sys.getrefcount(bound)) == refs
    assert grown < 4_096, f"{grown} bytes kept by 300 replacements"


@pytest.mark.skipif(
    not index_module.BUILT and not IN_CI, reason="the compiled matcher was not built"
)
def test_the_compiled_matcher_refuses_malformed_input_by_name() -> None:
    """Its entry points are index.py's, but a wrong shape is a clear TypeError or
    ValueError naming what is wrong, never a crash or a half-built object."""
    from messagebox.predicates import _native

    native: Any = _native  # called with wrong types on purpose

    cases = [
        (lambda: native.compile([(1, None)]), "a group is \\(key, anchor, checks\\)"),
        (lambda: native.compile([(1, None, ((99, "t.x"),))]), "unknown check code"),
        (lambda: native.compile([(1, None, ((0, "t.x", 1),))]), "a comparison is 4 items"),
        (lambda: native.compile([(1, None, ((9, "t.x", 5),))]), "a prefix is a str"),
        (lambda: native.compile([(1, None, ())], [1, 2]), "one bound a group"),
        (lambda: native.compile(5), "groups must be a sequence"),
        (lambda: native.match({}, None), "match\\(\\) takes packed, unanchored, properties"),
        (lambda: native.match([], None, {}), "packed must be a dict"),
        (lambda: native.match({}, None, []), "properties must be a dict"),
        (lambda: native.match_all({}, None, ({},)), "batch must be a list of dicts"),
        (lambda: native.match_all({}, None, [{}, 3]), "batch must be a list of dicts"),
    ]
    for call, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            call()
    groups = native.compile([(7, None, ((0, "t.x", index_module._family(1), 2),))])
    assert len(groups) == 1
    assert native.match({}, groups, {"t.x": 3}) == [7]
    assert native.match_all({}, groups, [{"t.x": 3}, {"t.x": 1}]) == ([7], [1, 0])
    # a mapping that is not a dict is matched in Python, not refused
    from types import MappingProxyType

    index: FilterIndex[int] = FilterIndex()
    index.add(1, Filter.of(P("t.x") > 2))
    assert index.matching_all([MappingProxyType({"t.x": 3})]) == ([1], [1])
