"""The in-memory evaluator (predicates.index.FilterIndex) agrees with the reference
evaluator on the shared random filters and messages, also after filters are replaced
and removed."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from messagebox.predicates import Filter, P, filter_matches, normalize_properties, to_filter
from messagebox.predicates.index import FilterIndex
from tests.strategies import filters, messages


def _want(subs: dict[int, Filter], props: dict[str, object]) -> set[int]:
    normal = normalize_properties(props)
    return {k for k, f in subs.items() if filter_matches(f, normal)}


@settings(max_examples=600, deadline=None)
@given(subs=st.lists(filters, min_size=1, max_size=8), batch=st.lists(messages, max_size=8))
def test_the_index_agrees_with_the_reference_evaluator(
    subs: list[Filter], batch: list[dict[str, object]]
) -> None:
    index: FilterIndex[int] = FilterIndex()
    index.update(enumerate(subs))
    for props in batch:
        assert index.match(normalize_properties(props)) == _want(dict(enumerate(subs)), props)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.one_of(st.none(), filters)), min_size=1, max_size=14
    ),
    batch=st.lists(messages, min_size=1, max_size=6),
)
def test_replacing_and_removing_filters_keeps_the_index_exact(
    steps: list[tuple[int, Filter | None]], batch: list[dict[str, object]]
) -> None:
    index: FilterIndex[int] = FilterIndex()
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


def test_exact_edges() -> None:
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
    index: FilterIndex[int] = FilterIndex()
    index.update(cases.items())
    for value in (1, True, 1.0, 2**53, 2**53 + 1, float(2**53), -0.0, "", "1", False, 0):
        props: dict[str, object] = {"t.x": value}
        assert index.match(normalize_properties(props)) == _want(cases, props), value
    early = datetime(2023, 12, 31, 23, 0, tzinfo=UTC).astimezone()
    assert index.match(normalize_properties({"t.x": early})) == {7}  # != needs one family
    assert index.match({}) == {5}


@settings(max_examples=300, deadline=None)
@given(filt=filters)
def test_a_stored_filter_reads_back_equal_without_validation(filt: Filter) -> None:
    back = Filter.from_stored_json(filt.to_json())
    assert back == Filter.from_json(filt.to_json()) == filt
    assert back.to_json() == filt.to_json()


def test_a_large_index_leaves_the_garbage_collector_almost_nothing_to_walk() -> None:
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
    index: FilterIndex[int] = FilterIndex()
    index.update(enumerate(filters))
    for _ in range(4):  # a collection untracks one level of nested tuples and dicts
        gc.collect()
    added = len(gc.get_objects()) - before  # the filters' own objects were counted before
    assert added < 100, f"{added} objects tracked for 3,000 filters"
    assert index.match(normalize_properties({"c.Id": "C6", "c.Total": 10_000})) == {6}
