"""Property values as text (``name=value``, ``name:type=value``) and as JSON, as the
command line reads them (``messagebox.properties``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from messagebox.properties import parse_assignment, properties_from_json

AT = datetime(2024, 5, 1, 8, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders.Total=12.5", ("orders.Total", 12.5)),
        ("orders.Total=12", ("orders.Total", 12)),
        ("orders.Rush=true", ("orders.Rush", True)),
        ('orders.Region="EU"', ("orders.Region", "EU")),
        ("orders.Region=EU", ("orders.Region", "EU")),
        ("orders.Id=007", ("orders.Id", "007")),  # not JSON: the text itself
        ("orders.Note=a=b", ("orders.Note", "a=b")),
        ("orders.Empty=", ("orders.Empty", "")),
        ("orders.Zip:str=01234", ("orders.Zip", "01234")),
        ("orders.Total:str=12", ("orders.Total", "12")),
        ("orders.N:int=42", ("orders.N", 42)),
        ("orders.N:float=42", ("orders.N", 42.0)),
        ("orders.Rush:bool=FALSE", ("orders.Rush", False)),
        ("orders.At:datetime=2024-05-01T10:00:00+02:00", ("orders.At", AT)),
        ("orders.At:datetime=2024-05-01T08:00:00Z", ("orders.At", AT)),
        ("BTS.MessageType=PO", ("messagebox.MessageType", "PO")),
    ],
)
def test_an_assignment_gives_a_typed_value(text: str, expected: tuple[str, object]) -> None:
    name, value = parse_assignment(text)
    assert (name, value) == expected
    assert type(value) is type(expected[1])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("orders.Total", "is not name=value"),
        ("Total=1", "is not of the form namespace.Name"),
        ("orders.X=null", "is JSON null, not a property value"),
        ("orders.X=[1, 2]", "is JSON list"),
        ('orders.X={"a": 1}', "is JSON dict"),
        ("orders.X=NaN", "NaN is not a finite number"),
        ("orders.X=1e999", "not finite"),
        ("orders.X=9223372036854775808", "does not fit in 64 bits"),
        ("orders.X:int=1.5", "'1.5' is not an int"),
        ("orders.X:float=abc", "'abc' is not a float"),
        ("orders.X:bool=yes", "'yes' is not a bool"),
        ("orders.X:datetime=2024-05-01", "has no time zone"),
        ("orders.X:datetime=tomorrow", "is not an ISO 8601 datetime"),
        ("orders.X:money=1", "unknown type 'money'"),
    ],
)
def test_a_malformed_assignment_names_the_property(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_assignment(text)


def test_json_properties_take_scalars_and_typed_pairs() -> None:
    found = properties_from_json(
        {"orders.Total": 12, "orders.Price": 1.5, "orders.At": ["d", "2024-05-01T08:00:00+00:00"]}
    )
    assert found == {"orders.Total": 12, "orders.Price": 1.5, "orders.At": AT}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "must be a JSON object"),
        ({"orders.X": None}, "property 'orders.X': not a property value"),
        ({"orders.X": {"a": 1}}, "property 'orders.X': not a property value"),
        ({"orders.X": ["d", "nope"]}, "property 'orders.X': bad datetime"),
    ],
)
def test_malformed_json_properties_name_the_property(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        properties_from_json(data)


def test_json_properties_come_back_canonical_and_a_name_given_twice_is_refused() -> None:
    assert properties_from_json({"BTS.ReceivePortName": "in"}) == {
        "messagebox.ReceivePortName": "in"
    }
    with pytest.raises(ValueError, match=re.escape("property 'messagebox.X' is given twice")):
        properties_from_json({"BTS.X": 1, "messagebox.X": 2})
