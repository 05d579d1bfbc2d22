"""A publish's arguments are checked before anything is stored (issue 55, item 12): a
Message given alone instead of a list, and a time-out that is not a finite number of
seconds (``nan`` made a throttled publish wait for ever), on both backends."""

from __future__ import annotations

import math
import time

import pytest

from messagebox import Message, MessageBox
from messagebox.errors import MessageValidationError, Throttled, ValidationError
from messagebox.predicates import P
from tests.conftest import table_counts


def test_a_message_given_alone_is_refused_naming_the_fix(box: MessageBox) -> None:
    before = table_counts(box)
    with pytest.raises(MessageValidationError, match=r"not one Message: publish\(\[message\]\)"):
        box.publish(Message(b"x", promoted={"a.B": 1}))  # type: ignore[arg-type]
    for wrong in ("text", b"bytes", {"a.B": 1}, 7):
        with pytest.raises(MessageValidationError, match="publish takes a list of messages"):
            box.publish(wrong)  # type: ignore[arg-type]
    assert table_counts(box) == before


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, 1e300, "5", True])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(
    box: MessageBox, timeout: object
) -> None:
    box.create_host("h", throttle_queue_depth=1)
    box.subscribe("s", host="h", filter=P("a.B") == 1, name="s")
    box.publish([Message(b"x", promoted={"a.B": 1}) for _ in range(3)])  # throttled now
    before = table_counts(box)
    started = time.monotonic()
    with pytest.raises(ValidationError, match="timeout must be"):
        box.publish([Message(b"x", promoted={"a.B": 1})], timeout=timeout)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # refused at once, never waited for
    assert table_counts(box) == before


def test_a_finite_timeout_still_waits_then_raises(box: MessageBox) -> None:
    box.create_host("h", throttle_queue_depth=1)
    box.subscribe("s", host="h", filter=P("a.B") == 1, name="s")
    box.publish([Message(b"x", promoted={"a.B": 1}) for _ in range(3)])
    with pytest.raises(Throttled):
        box.publish([Message(b"x", promoted={"a.B": 1})], timeout=0.2)
