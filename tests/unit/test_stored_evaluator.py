"""A filter compiled to a test of stored promoted pairs (``predicates.stored``, what a
search runs on each message) agrees with the reference evaluator on every filter and
message (tests/strategies.py: every operator, cross-family values, edge numbers and
datetimes), and so does the text a search pushes down to SQL: a stored context that
matches holds one of the texts."""

from __future__ import annotations

import orjson
from hypothesis import given, settings

from messagebox.ops.search_walk import pushdown
from messagebox.predicates import Filter, P, filter_matches, normalize_properties
from messagebox.predicates.stored import compile_stored
from messagebox.properties import encode_context
from tests.strategies import filters, messages


@settings(max_examples=2000)
@given(filt=filters, props=messages)
def test_the_stored_test_agrees_with_the_reference_evaluator(
    filt: Filter, props: dict[str, object]
) -> None:
    normal = normalize_properties(props)
    context = encode_context(normal, {})
    expected = filter_matches(filt, normal)
    assert compile_stored(filt)(orjson.loads(context)["promoted"]) is expected
    texts = pushdown(filt)
    if expected and texts is not None:  # the SQL test never drops a match
        assert any(t in context for t in texts)


def test_numbers_are_pushed_down_in_both_types_and_zero_with_either_sign() -> None:
    assert pushdown(Filter.of(P("o.N") == 0)) == [
        '"o.N":["i",0]',
        '"o.N":["f",0.0]',
        '"o.N":["f",-0.0]',
    ]
    assert pushdown(Filter.of(P("o.N") == 2**53 + 1)) == ['"o.N":["i",9007199254740993]']
    assert pushdown(Filter.of((P("o.N") > 1) | (P("o.R") == "EU"))) is None  # a range alone
    assert pushdown(Filter.of((P("o.N") > 1) & P("o.R").prefix("E"))) == ['"o.R":["s","E']
