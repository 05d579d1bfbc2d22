"""Messages: binary parts plus a context of typed properties (docs/concepts.md: Messages).

A message is checked when it is built: names, value types and sizes. Whether it may carry
properties of the reserved ``messagebox.`` namespace depends on who publishes it, so that
is checked by :meth:`MessageBox.publish <messagebox.engine.MessageBox.publish>`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain
from typing import IO

from messagebox.errors import MessageValidationError
from messagebox.properties import (
    RESERVED_PREFIX,
    Value,
    canonical_name,
    check_text,
    check_unicode,
    normalize_value,
)
from messagebox.timing import Timing, message_timing

MAX_PROPERTIES = 1024
MAX_PARTS = 256
MAX_PART_NAME = 256
DEFAULT_BODY_PART = "body"

PartData = bytes | bytearray | memoryview | str | IO[bytes]
"""What a part can be made of: bytes-like, text (stored as UTF-8) or a binary file object
(read in chunks while publishing, never whole)."""


def _check_properties(
    kind: str, raw: Mapping[str, object] | None, *, promoted: bool
) -> dict[str, Value]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise MessageValidationError(f"{kind} properties must be a mapping of name to value")
    if len(raw) > MAX_PROPERTIES:
        raise MessageValidationError(
            f"{len(raw)} {kind} properties; at most {MAX_PROPERTIES} are allowed"
        )
    out: dict[str, Value] = {}
    for name, value in raw.items():
        try:
            canon = canonical_name(name)
        except ValueError as exc:
            raise MessageValidationError(f"{kind} property {name!r}: {exc}") from exc
        if canon in out:
            raise MessageValidationError(f"{kind} property {name!r} is given twice")
        try:
            out[canon] = normalize_value(value, promoted=promoted)
        except ValueError as exc:
            raise MessageValidationError(f"{kind} property {name!r}: {exc}") from exc
    return out


def _check_part(name: object, data: object) -> PartData:
    if not isinstance(name, str) or not name or len(name) > MAX_PART_NAME:
        raise MessageValidationError(
            f"part name {name!r} must be a non-empty str of at most {MAX_PART_NAME} characters"
        )
    try:
        check_text(name)
    except ValueError as exc:
        raise MessageValidationError(f"part name {name!r}: {exc}") from exc
    if isinstance(data, str):
        try:
            check_unicode(data)  # a str part is stored as UTF-8
        except ValueError as exc:
            raise MessageValidationError(f"part {name!r}: {exc}") from exc
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        return data
    if hasattr(data, "read"):
        return data  # type: ignore[return-value]
    raise MessageValidationError(
        f"part {name!r} must be bytes, str or a binary file object, not {type(data).__name__}"
    )


class Message:
    """A message to publish.

    ``Message(body=b"...", promoted={"orders.Total": 12})`` or
    ``Message(parts={"body": b"...", "attachment": f}, promoted=..., written=...)``.
    Promoted properties route; written properties travel in the context only.
    ``id`` is normally assigned at publish; give one (a UUID) to make a publish
    idempotent: publishing the same id again stores nothing and raises
    :class:`~messagebox.errors.AlreadyExists`, so a retry after an unknown outcome
    (a lost connection at commit) cannot store the message twice.

    Times (docs/concepts.md: Scheduled delivery, Expiry): ``deliver_at`` (a
    timezone-aware datetime) holds its queue entries until then; ``expires_at``, or
    ``ttl`` seconds after the publish (by the database's clock), is when an entry not
    yet delivered expires (suspended or dropped, as its subscription says).
    """

    __slots__ = ("body_part", "id", "parts", "promoted", "timing", "written")

    def __init__(
        self,
        body: PartData | None = None,
        *,
        parts: Mapping[str, PartData] | None = None,
        promoted: Mapping[str, object] | None = None,
        written: Mapping[str, object] | None = None,
        body_part: str | None = None,
        id: uuid.UUID | str | None = None,
        deliver_at: datetime | None = None,
        expires_at: datetime | None = None,
        ttl: float | None = None,
    ) -> None:
        if (body is None) == (parts is None):
            raise MessageValidationError("a message needs exactly one of body= or parts=")
        if parts is None:
            parts = {body_part or DEFAULT_BODY_PART: body}  # type: ignore[dict-item]
        if not isinstance(parts, Mapping) or not parts:
            raise MessageValidationError("parts= must be a non-empty mapping of name to data")
        if len(parts) > MAX_PARTS:
            raise MessageValidationError(f"{len(parts)} parts; at most {MAX_PARTS} are allowed")
        self.parts: dict[str, PartData] = {n: _check_part(n, d) for n, d in parts.items()}
        self.body_part: str = body_part or next(iter(self.parts))
        if self.body_part not in self.parts:
            raise MessageValidationError(f"body_part {self.body_part!r} is not one of the parts")
        self.promoted = _check_properties("promoted", promoted, promoted=True)
        self.written = _check_properties("written", written, promoted=False)
        both = self.promoted.keys() & self.written.keys()
        if both:
            raise MessageValidationError(
                f"property {sorted(both)[0]!r} is both promoted and written"
            )
        try:
            self.id: uuid.UUID | None = None if id is None else uuid.UUID(str(id))
        except ValueError as exc:
            raise MessageValidationError(f"message id {id!r} is not a UUID") from exc
        self.timing: Timing | None = message_timing(deliver_at, expires_at, ttl)

    @property
    def deliver_at(self) -> datetime | None:
        """When its queue entries become due (UTC), if scheduled."""
        return None if self.timing is None else self.timing.deliver_at

    @property
    def expires_at(self) -> datetime | None:
        """When its queue entries expire (UTC), if given as a time."""
        return None if self.timing is None else self.timing.expires_at

    @property
    def ttl(self) -> float | None:
        """Seconds after the publish that its queue entries expire, if given so."""
        return None if self.timing is None else self.timing.ttl

    def with_promoted(self, extra: Mapping[str, Value]) -> Message:
        """A copy without an id that also promotes ``extra`` (checked property values;
        the message's own promoted values win), its parts and properties not checked
        again. A name it writes cannot be promoted too."""
        both = [n for n in extra if n in self.written and n not in self.promoted]
        if both:
            raise MessageValidationError(f"property {both[0]!r} is both promoted and written")
        copy = Message.__new__(Message)
        copy.parts, copy.body_part, copy.written, copy.id, copy.timing = (
            self.parts,
            self.body_part,
            self.written,
            None,
            self.timing,
        )
        copy.promoted = {**extra, **self.promoted}
        return copy

    def reserved(self) -> list[str]:
        """Names in the reserved ``messagebox.`` namespace that this message sets."""
        # it runs for each message published: one search of all the names joined first
        # (a line break is in no valid name), then, only if that finds the prefix, the
        # exact test of each name
        if "\n" + RESERVED_PREFIX not in "\n" + "\n".join(chain(self.promoted, self.written)):
            return []
        prefix = RESERVED_PREFIX
        return [n for n in chain(self.promoted, self.written) if n.startswith(prefix)]

    def __repr__(self) -> str:
        return f"Message(parts={list(self.parts)}, promoted={self.promoted!r})"


@dataclass(frozen=True)
class StoredMessage:
    """A message read back from the spool."""

    id: uuid.UUID
    promoted: dict[str, Value]
    written: dict[str, Value]
    parts: dict[str, bytes]
    body_part: str
    published_at: datetime
    publisher: str
    part_sizes: dict[str, int] = field(default_factory=dict)

    @property
    def body(self) -> bytes:
        """The body part's bytes."""
        return self.parts[self.body_part]

    def summary(self) -> MessageSummary:
        """Its context and part sizes, without the bytes."""
        return MessageSummary(
            id=self.id,
            promoted=self.promoted,
            written=self.written,
            body_part=self.body_part,
            part_sizes=self.part_sizes,
            published_at=self.published_at,
            publisher=self.publisher,
        )


def from_handler(who: str, items: Iterable[Message | Iterable[Message]]) -> list[Message]:
    """The messages a handler publishes (``items``: messages, or iterables of them), each
    checked to be a :class:`Message` that sets no property in the reserved ``messagebox.``
    namespace: those are the engine's, and a handler's publications skip the checks of
    ``MessageBox.publish``. Else :class:`MessageValidationError`, naming ``who``."""
    out: list[Message] = []
    for item in items:
        for message in [item] if isinstance(item, Message) else item:
            if not isinstance(message, Message):
                raise MessageValidationError(
                    f"{who} takes Message objects, not {type(message).__name__}"
                )
            reserved = message.reserved()
            if reserved:
                raise MessageValidationError(
                    f"{who}: property {reserved[0]!r} is in the reserved namespace messagebox."
                )
            out.append(message)
    return out


@dataclass(frozen=True)
class MessageSummary:
    """A stored message's context and part sizes, without reading its parts."""

    id: uuid.UUID
    promoted: dict[str, Value]
    written: dict[str, Value]
    body_part: str
    part_sizes: dict[str, int]
    """Bytes of each part, in part order."""
    published_at: datetime
    publisher: str
