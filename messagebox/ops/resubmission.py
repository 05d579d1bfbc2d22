"""Resubmitting a suspended receive failure (``MessageBox.resubmit``): the input a
receive pipeline refused, held suspended with its original bytes, published again, as
it was or edited (another body, changed properties), once its cause is fixed.

Through the receive location that refused it when the caller has it (a running host
app's, or one loaded from the app's module: it runs the location's pipeline again),
else as it is: one message with the properties it was stored with. Either way without
the error report's properties (``ErrorReport.*``: an error port would route it as a
failure again), and the suspended entry is terminated in the transaction that
publishes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from messagebox.errors import ValidationError
from messagebox.message import Message, StoredMessage
from messagebox.models import RECEIVE_FAILURE, RoutingPolicy, SuspendedEntry
from messagebox.properties import Value

ERROR_REPORT = "ErrorReport."
MESSAGE_TYPE = "messagebox.MessageType"
PORT = "messagebox.ReceivePortName"
LOCATION = "messagebox.ReceiveLocationName"


class Resubmits(Protocol):
    """A receive location, as a resubmission runs its pipeline."""

    key: str
    """``port/location``."""
    policy: RoutingPolicy

    def resubmission(self, body: bytes, properties: Mapping[str, object]) -> list[Message]:
        """The messages its pipeline makes of ``body``; raises if it refuses it."""
        ...


def check(entry: SuspendedEntry) -> None:
    """Refuse an entry that is not a receive failure, saying what it takes instead."""
    if entry.reason != RECEIVE_FAILURE:
        raise ValidationError(
            f"suspended entry {entry.id} is a {entry.reason}, not a {RECEIVE_FAILURE}: only "
            "a refused input is resubmitted (resume, reroute or terminate this one)"
        )


def origin(promoted: Mapping[str, Value]) -> tuple[str, str] | None:
    """The receive port and location that refused an input, by its stored message's
    promoted properties (None: they do not say)."""
    port, location = promoted.get(PORT), promoted.get(LOCATION)
    if isinstance(port, str) and isinstance(location, str):
        return port, location
    return None


def _kept(values: Mapping[str, Value]) -> dict[str, object]:
    return {k: v for k, v in values.items() if not k.startswith(ERROR_REPORT)}


def messages(
    stored: StoredMessage,
    body: bytes | None,
    properties: Mapping[str, object],
    location: Resubmits | None,
) -> list[Message]:
    """What resubmitting ``stored`` publishes: ``body`` (else its stored bytes) through
    ``location``'s pipeline (its stored properties as the input's transport properties;
    ``properties`` over what the pipeline promotes), or as it is with its stored
    properties and ``properties`` over them (the error report's left out)."""
    data = stored.body if body is None else body
    promoted = {**_kept(stored.promoted), **properties}
    if location is None:
        return [Message(data, promoted=promoted, written=_kept(stored.written))]
    refused_by = origin(stored.promoted)
    if refused_by is not None and "/".join(refused_by) != location.key:
        raise ValidationError(
            f"message {stored.id} was refused by receive location {'/'.join(refused_by)}, "
            f"not by {location.key}"
        )
    transport = _kept(stored.promoted)
    transport.pop(MESSAGE_TYPE, None)  # the pipeline says what it is
    return [
        Message(
            parts=m.parts,
            body_part=m.body_part,
            promoted={**m.promoted, **properties},
            written=m.written,
        )
        for m in location.resubmission(data, transport)
    ]
