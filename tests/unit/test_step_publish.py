"""What an orchestration step publishes (``Orchestration.publish``): each message with the
instance's correlation properties promoted, unless the message promotes them itself; the
rest of the message as given, its id left to the step (fixed by instance and version)."""

from __future__ import annotations

import re
import typing
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from messagebox import Message
from messagebox.errors import MessageValidationError
from messagebox.hosts import Delivery, Orchestration, activate
from messagebox.predicates import P
from messagebox.properties import Value, normalize_value
from messagebox.steps import Step
from tests.strategies import values


class Nothing(BaseModel):
    pass


class Shipping(Orchestration[Nothing]):
    correlation = ("t.OrderId", "t.Region")

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        pass


def _step(correlation: dict[str, object]) -> Shipping:
    """An instance in the middle of a step, with these correlation values (as a
    message promoted them)."""
    orch = Shipping.__new__(Shipping)
    normal = {
        k: None if v is None else normalize_value(v, promoted=True) for k, v in correlation.items()
    }
    orch.correlation_values = typing.cast(dict[str, Value], normal)  # None: not in the message
    orch._effects = Step(
        owner="o",
        entry_id=1,
        instance_id="i",
        service="Shipping",
        host="h",
        sub=1,
        version=None,
        data={},
        correlation={},
    )
    return orch


@given(order_id=values, promoted=st.dictionaries(st.sampled_from(["t.A", "t.Region"]), values))
def test_the_correlation_is_promoted_unless_the_message_promotes_it(
    order_id: object, promoted: dict[str, object]
) -> None:
    message = Message(b"ship", promoted=promoted, written={"t.Note": "x"})
    orch = _step({"t.OrderId": order_id, "t.Region": "EU"})
    orch.publish(message, [message])
    for sent in orch._effects.publish:
        assert sent.promoted == {
            "t.OrderId": normalize_value(order_id, promoted=True),
            "t.Region": "EU",
            **message.promoted,
        }
        assert (sent.parts, sent.written, sent.body_part) == (
            message.parts,
            message.written,
            message.body_part,
        )
    assert message.promoted == Message(b"", promoted=promoted).promoted  # not changed


def test_a_missing_correlation_value_is_not_promoted() -> None:
    orch = _step({"t.OrderId": 7, "t.Region": None})
    orch.publish(Message(b"ship", promoted={"t.Kind": "ship"}))
    assert orch._effects.publish[0].promoted == {"t.OrderId": 7, "t.Kind": "ship"}


def test_the_step_fixes_the_id_of_what_it_publishes() -> None:
    orch = _step({"t.OrderId": 7})
    orch.publish(Message(b"ship", id=uuid.uuid4()))
    assert orch._effects.publish[0].id is None


def test_a_correlation_property_the_message_writes_is_refused() -> None:
    orch = _step({"t.OrderId": 7, "t.Region": "EU"})
    with pytest.raises(
        MessageValidationError, match=re.escape("'t.Region' is both promoted and written")
    ):
        orch.publish(Message(b"ship", written={"t.Region": "US"}))
    assert orch._effects.publish == []
