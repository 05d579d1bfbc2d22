"""Application-made ids (messagebox.storage.ids) and the reserved-name check of a message."""

from __future__ import annotations

import copy
import pickle
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messagebox.message import Message
from messagebox.storage.ids import as_uuid, uuid5, uuid7s


@given(namespace=st.uuids(), name=st.text())
def test_uuid5_is_the_standard_librarys(namespace: uuid.UUID, name: str) -> None:
    """The name-based UUIDs of a step's publications are ``uuid.uuid5``'s, in every
    way the standard library's object is."""
    mine, theirs = uuid5(namespace, name), uuid.uuid5(namespace, name)
    assert type(mine) is uuid.UUID
    assert (mine, hash(mine), str(mine), mine.version, mine.variant) == (
        theirs,
        hash(theirs),
        str(theirs),
        5,
        uuid.RFC_4122,
    )
    assert pickle.loads(pickle.dumps(mine)) == theirs


@given(value=st.uuids())
def test_as_uuid_reads_each_form_a_driver_gives(value: uuid.UUID) -> None:
    """A UUID as a driver returns it (itself, its 16 bytes as DuckDB's hot statements
    give it, its text) is the standard library's object, equal in every way."""
    for given_form in (value, value.bytes, str(value)):
        mine = as_uuid(given_form)
        assert type(mine) is uuid.UUID
        assert (mine, hash(mine), str(mine), mine.bytes) == (
            value,
            hash(value),
            str(value),
            value.bytes,
        )
        assert pickle.loads(pickle.dumps(mine)) == value


def test_uuid7s_are_ordinary_time_ordered_uuids() -> None:
    """Made without the constructor's checks, they are the constructor's UUIDs: equal,
    hashed, printed, pickled and frozen alike, version 7, RFC 4122 variant."""
    made = uuid7s(500)
    assert len(set(made)) == 500
    for u in made[:50]:
        same = uuid.UUID(str(u))
        assert type(u) is uuid.UUID
        assert (u, hash(u), str(u), repr(u), u.bytes) == (
            same,
            hash(same),
            str(same),
            repr(same),
            same.bytes,
        )
        assert u.is_safe is same.is_safe
        assert (u.version, u.variant) == (7, uuid.RFC_4122)
        assert pickle.loads(pickle.dumps(u)) == u == copy.deepcopy(u)
        with pytest.raises(TypeError):
            u.int = 0  # type: ignore[misc]
    millis = [u.int >> 80 for u in made]
    assert millis == sorted(millis)  # one time prefix per call, or later ones


@pytest.mark.parametrize(
    ("promoted", "written", "reserved"),
    [
        ({"orders.Total": 1}, {}, []),
        ({"orders.Total": 1, "BTS.MessageType": "PO"}, {}, ["messagebox.MessageType"]),
        ({}, {"a.messagebox.x": 1, "messagebox.ReceivedBy": "x"}, ["messagebox.ReceivedBy"]),
        ({"a.b": 1}, {"messageboxes.x": 2, "x.messagebox.y": 3}, []),
    ],
)
def test_reserved_names_are_found_wherever_they_are(
    promoted: dict[str, object], written: dict[str, object], reserved: list[str]
) -> None:
    message = Message(b"x", promoted=promoted, written=written)
    assert message.reserved() == reserved
