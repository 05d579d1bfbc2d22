"""Application-made ids (messagebox.ids) and the reserved-name check of a message."""

from __future__ import annotations

import copy
import pickle
import uuid

import pytest

from messagebox.ids import uuid7s
from messagebox.message import Message


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
