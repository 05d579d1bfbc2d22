"""The text form of filters (``predicates.text``): parsed without eval, written back exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings

from messagebox.errors import FilterValidationError
from messagebox.predicates import Filter, P, format_filter, parse_filter
from tests.strategies import filters


@settings(max_examples=400, database=None)
@given(filt=filters)
def test_every_filter_reads_back_from_its_text_form(filt: Filter) -> None:
    # Given any filter written in the text form
    text = format_filter(filt)
    # Then parsing it gives the same filter, with the same value types
    again = parse_filter(text)
    assert again == filt
    assert again.to_json() == filt.to_json()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('orders.Region == "EU"', P("orders.Region") == "EU"),
        ("orders.Total >= 100", P("orders.Total") >= 100),
        ("orders.Total < 1.5e3", P("orders.Total") < 1500.0),
        ("orders.Total != -2", P("orders.Total") != -2),
        ("orders.Rush == true", P("orders.Rush") == True),  # noqa: E712
        ("orders.Audit exists", P("orders.Audit").exists()),
        ("orders.Audit NOT_EXISTS", P("orders.Audit").not_exists()),
        ('orders.Id prefix "PO-"', P("orders.Id").prefix("PO-")),
        ("orders.Flags bitwise_and 6", P("orders.Flags").bitwise_and(6)),
        ('orders.Region in ["EU", "UK"]', P("orders.Region").in_(["EU", "UK"])),
        (
            'orders.At > datetime("2024-05-01T10:00:00+02:00")',
            P("orders.At") > datetime(2024, 5, 1, 8, tzinfo=UTC),
        ),
        (
            'a.b == "x" and a.c == 1 or a.d exists',
            (P("a.b") == "x") & (P("a.c") == 1) | P("a.d").exists(),
        ),
        (
            'a.b == "x" AND (a.c == 1 OR a.d exists)',
            (P("a.b") == "x") & ((P("a.c") == 1) | P("a.d").exists()),
        ),
        ('  a.b=="é\\n" ', P("a.b") == "é\n"),
    ],
)
def test_the_text_form_means_what_the_dsl_means(text: str, expected: object) -> None:
    assert parse_filter(text) == Filter.of(expected)


def test_ints_and_floats_keep_their_types() -> None:
    [group] = parse_filter("a.b == 100 and a.c == 100.0").groups
    assert [type(p.value) for p in group.predicates] == [int, float]


def test_a_datetime_is_written_with_its_offset_in_utc() -> None:
    when = datetime(2024, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert (
        format_filter(Filter.of(P("a.b") > when)) == 'a.b > datetime("2024-01-01T00:00:00+00:00")'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "filter text is empty"),
        ("orders.Total >=", "column 16: expected a value after '>='"),
        ("orders.Total = 1", "column 14: expected an operator after orders.Total ('==', not '=')"),
        ("Total == 1", "column 1: expected a property name"),
        ("a.b == 1 and", "column 13: expected a property name"),
        ("a.b == 1 a.c == 2", "column 10: expected 'and', 'or' or the end"),
        ("(a.b == 1", "column 10: expected ')'"),
        ("not a.b exists", "'not' is not supported"),
        ("a.b == 'EU'", "strings are in double quotes"),
        ('a.b == "EU', "column 8: expected a well-formed JSON string"),
        ("a.b == null", "there is no null"),
        ("a.b in []", "column 9: expected a value after '['"),
        ("a.b in [1, 2", "expected ',' or ']'"),
        ('a.b > datetime("2024-01-01T00:00:00")', "a datetime with a time zone offset"),
        ('a.b > datetime("yesterday")', "an ISO 8601 datetime"),
        ("a.b > true", "> cannot order a bool"),
        ("a.b == 1e400", "not finite"),
        ("a.b == 99999999999999999999", "does not fit in 64 bits"),
        ('a.b bitwise_and "x"', "bitwise_and takes an int mask"),
        ("a.b prefix 1", "prefix takes a str"),
        ("a.b like 1", "expected an operator after a.b"),
    ],
)
def test_malformed_text_is_refused_naming_the_place(text: str, message: str) -> None:
    with pytest.raises(FilterValidationError) as err:
        parse_filter(text)
    assert message in str(err.value)


def test_nothing_is_evaluated() -> None:
    # A Python expression is not a filter: nothing runs, the text is refused
    with pytest.raises(FilterValidationError, match="expected a property name"):
        parse_filter("__import__('os').system('false')")
