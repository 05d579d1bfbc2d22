"""The size limits of a filter, checked before any work that grows faster than the input:
``in_`` lists (de-duplicated in linear time, by family and exact value), OR groups and
AND groups, from the DSL, the text form and a routing file alike; and errors that name
the property, the count and the limit without echoing the values."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messagebox.config.routing_file import RoutingFileError, load
from messagebox.errors import FilterValidationError
from messagebox.predicates import (
    MAX_GROUPS,
    MAX_IN_VALUES,
    MAX_PREDICATES_PER_GROUP,
    And,
    Filter,
    P,
    parse_filter,
)
from messagebox.predicates.model import predicate_holds
from messagebox.properties import Value, family, normalize_value
from tests.strategies import values

FAST = 5.0
"""Seconds within which a refusal must come (each takes milliseconds; the machine is shared)."""


def _old_dedup(raw: list[object]) -> tuple[Value, ...]:
    """The de-duplication ``in_`` always had (quadratic): the first of each family+value."""
    members: list[Value] = []
    for item in raw:
        member = normalize_value(item)
        if not any(family(member) == family(seen) and member == seen for seen in members):
            members.append(member)
    return tuple(members)


def _typed(members: tuple[Value, ...]) -> list[tuple[type, str]]:
    """Values with their types and spelling (``-0.0`` apart from ``0.0``)."""
    return [(type(v), repr(v)) for v in members]


# --- the in_ list ---------------------------------------------------------------------


def test_a_20000_value_in_list_is_refused_at_once_with_a_short_error() -> None:
    # Given 20,000 distinct values (it took two minutes to refuse, with a 129 KB message)
    start = time.perf_counter()
    with pytest.raises(FilterValidationError) as caught:
        P("orders.Region").in_([f"R{i}" for i in range(20_000)])
    # Then it is refused in milliseconds, naming the property, the count and the limit
    assert time.perf_counter() - start < FAST
    said = str(caught.value)
    assert len(said) < 300, said
    assert "orders.Region" in said
    assert "20000" in said
    assert str(MAX_IN_VALUES) in said


def test_a_huge_in_list_of_duplicates_is_refused_from_its_length() -> None:
    # Given a million copies of one value (from a generator: no length to read first)
    start = time.perf_counter()
    with pytest.raises(FilterValidationError, match=r"orders\.Total.*at most 4000 values"):
        P("orders.Total").in_(1 for _ in range(1_000_000))
    assert time.perf_counter() - start < FAST


def test_a_list_within_the_limits_once_duplicates_are_gone_is_accepted() -> None:
    pred = P("orders.Total").in_([*range(MAX_IN_VALUES), *range(MAX_IN_VALUES)])
    assert pred.value == tuple(range(MAX_IN_VALUES))


def test_the_text_form_refuses_a_huge_in_list_at_once() -> None:
    text = f"orders.Total in [{', '.join(str(i) for i in range(20_000))}]"
    start = time.perf_counter()
    with pytest.raises(FilterValidationError) as caught:
        parse_filter(text)
    assert time.perf_counter() - start < FAST
    said = str(caught.value)
    assert len(said) < 300, said
    assert "orders.Total" in said
    assert "column 1" in said


def test_dedup_keeps_each_family_and_exact_number_apart() -> None:
    when = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    same_instant = when.astimezone(timezone(timedelta(hours=2)))
    numbers = [1, 1.0, True, "1", 1, Decimal(1), 2**53 + 1, 2.0**53, False, 0, 0.0, -0.0]
    pred = P("t.a").in_([*numbers, when, same_instant, "a", "a", True])
    # ints and floats of one value are one (the first kept); bools, strings apart
    assert _typed(pred.value) == _typed((1, True, "1", 2**53 + 1, 2.0**53, False, 0, when, "a"))


@given(st.lists(values, min_size=1, max_size=40), st.lists(values, max_size=10))
def test_dedup_keeps_what_in_matches(given_values: list[Value], probes: list[Value]) -> None:
    # Given a list with duplicates across families (each value repeated, in other forms)
    raw: list[object] = [*given_values, *given_values[::2]]
    raw += [float(v) for v in given_values if type(v) is int and float(v) == v]
    reference = _old_dedup(raw)
    if len(reference) > MAX_IN_VALUES:
        return
    # When it becomes an in_ predicate
    pred = P("t.a").in_(raw)
    # Then it keeps the same members, in the same order, with their types
    assert _typed(pred.value) == _typed(reference)
    # and matches exactly what the list matched, value by value
    for probe in [*given_values, *probes]:
        value = normalize_value(probe)
        expected = any(family(v) == family(value) and v == value for v in raw_normal(raw))
        assert predicate_holds(pred, {"t.a": value}) is expected


def raw_normal(raw: list[object]) -> list[Value]:
    return [normalize_value(v) for v in raw]


# --- groups ---------------------------------------------------------------------------


def test_a_long_or_in_the_text_form_is_refused_before_it_is_built() -> None:
    text = " or ".join(f"t.a == {i}" for i in range(500_000))
    start = time.perf_counter()
    with pytest.raises(FilterValidationError, match=f"at most {MAX_GROUPS} are allowed"):
        parse_filter(text)
    assert time.perf_counter() - start < FAST


def test_a_long_and_in_the_text_form_is_refused_before_it_is_expanded() -> None:
    # Given 100,000 copies of one predicate, ANDed (the expansion was quadratic)
    text = " and ".join(["t.a == 1"] * 100_000)
    start = time.perf_counter()
    with pytest.raises(
        FilterValidationError, match=f"at most {MAX_PREDICATES_PER_GROUP} are allowed"
    ):
        parse_filter(text)
    assert time.perf_counter() - start < FAST


def test_a_long_and_of_repeats_from_the_dsl_collapses_in_linear_time() -> None:
    # Given 100,000 copies of one predicate, ANDed (the expansion was quadratic)
    expr = And.of(*([P("t.a") == 1] * 100_000))
    start = time.perf_counter()
    filt = Filter.of(expr)
    assert time.perf_counter() - start < FAST
    assert [str(p) for p in filt.groups[0].predicates] == ["t.a == 1"]


def test_a_long_and_of_distinct_predicates_is_refused_as_the_group_grows() -> None:
    expr = And.of(*(P("t.a") == i for i in range(100_000)))
    start = time.perf_counter()
    with pytest.raises(
        FilterValidationError,
        match=rf"more than {MAX_PREDICATES_PER_GROUP} distinct predicates.*first: t\.a == 0",
    ):
        Filter.of(expr)
    assert time.perf_counter() - start < FAST


def test_repeats_within_four_times_the_group_limit_collapse_in_the_text_form() -> None:
    filt = parse_filter(" and ".join(["t.a == 1"] * (4 * MAX_PREDICATES_PER_GROUP)))
    assert len(filt.groups[0].predicates) == 1


# --- a routing file -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_an_9_mb_routing_file_with_a_huge_in_list_is_refused_in_seconds(tmp_path: Path) -> None:
    # Given a routing file of about 9 MB: one filter with a million values in its list
    values_text = ", ".join(str(i) for i in range(1_150_000))
    path = tmp_path / "routing.toml"
    path.write_text(
        '[hosts.h]\n\n[[subscriptions]]\nservice = "s"\nhost = "h"\n'
        f"filter = 'orders.Total in [{values_text}]'\n"
    )
    assert path.stat().st_size > 8_900_000
    # When it is loaded
    start = time.perf_counter()
    with pytest.raises(RoutingFileError) as caught:
        load(path.read_text(), str(path))
    # Then it is refused within seconds, naming the file, line and property, briefly
    assert time.perf_counter() - start < FAST
    said = str(caught.value)
    assert said.startswith(f"{path}:6: subscriptions[0].filter")
    assert "orders.Total" in said
    assert len(said) < 400, said


def test_an_endless_iterator_is_refused_not_exhausted() -> None:
    with pytest.raises(FilterValidationError, match=r"orders\.Total.*more than 1000 are distinct"):
        P("orders.Total").in_(itertools.count())
    with pytest.raises(FilterValidationError, match=r"orders\.Total.*more than 4000 given"):
        P("orders.Total").in_(itertools.repeat(1))


def test_nested_repeats_past_four_times_the_filter_limits_are_refused_at_once() -> None:
    # Given 4 * 128 * 64 predicates, nested so that no one list of terms is too long
    inner = "(" + " and ".join(["t.a == 1"] * 64) + ")"
    middle = "(" + " and ".join([inner] * 256) + ")"
    full = f"{middle} and {middle}"
    # Then they are read (they are one predicate, repeated), and one more is refused at once
    assert len(parse_filter(full).groups[0].predicates) == 1
    start = time.perf_counter()
    with pytest.raises(FilterValidationError, match=r"more than 32768 predicates"):
        parse_filter(f"{full} and t.a == 1")
    assert time.perf_counter() - start < FAST
