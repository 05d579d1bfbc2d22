"""Failure groups: suspended entries that failed the same way, as ServicePulse groups
failed messages, so that an operator handles a hundred alike failures as one.

An entry's group is its reason, its subscription's service, the exception's type and
**where it was raised**: the innermost frames of the handler's own code, each its file
(relative), function and statement, without line numbers (:mod:`messagebox.ops.tracebacks`
says why). The message is the group's example, not its key: ``unsupported currency
'JPY' for order A064109`` and ``… 'GBP' for order B7`` raised by one statement are one
failure, and a ``KeyError`` raised in two places is two.

An error without a traceback (a ``PermanentFailure``, a handler that timed out, a
removed subscription, a routing failure) is grouped by its message instead, with what
varies from message to message masked (:func:`mask`): UUIDs, ``0x`` numbers, numbers,
quoted values with no space
in them, and every token that mixes letters and digits (``A064109``, ``B7``); words are
kept, quoted phrases too (``'tax table has no entry for APAC'``). In the key every
masked part is one and the same, so ``order 17`` and ``order B7`` fall together.

A group's id is a hash of its key: the same in every process, across restarts, as long
as the code raising it is unchanged.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from messagebox.ops.tracebacks import Frame, read

SCAN = 100_000
"""Failure groups are made of the newest this many suspended entries."""

_MASK = re.compile(
    r"(?P<id>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)"
    r"|(?P<value>'[^'\s]*'|\"[^\"\s]*\")"
    r"|(?P<hex>\b0[xX][0-9a-fA-F]+\b)"
    r"|(?P<n>(?<!\w)-?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b)"
    r"|(?P<token>\b(?=\w*\d)(?=\w*[^\W\d_])\w+)"
)
_PLACEHOLDER = {"id": "<id>", "value": "<value>", "hex": "<hex>", "n": "<n>", "token": "<id>"}


def mask(message: str) -> str:
    """``message`` with what varies from one failure to the next masked: UUIDs and
    tokens mixing letters and digits (``<id>``), quoted values without a space
    (``<value>``), ``0x`` numbers (``<hex>``), numbers (``<n>``); words kept."""
    return _MASK.sub(lambda m: _PLACEHOLDER[m.lastgroup or "id"], message)


class FailureRow(NamedTuple):
    """A suspended entry, as grouping reads it."""

    id: int
    reason: str
    service: str | None
    host: str | None
    error: str | None
    suspended_at: datetime


@dataclass
class FailureGroup:
    """Suspended entries that failed alike, the newest first."""

    id: str
    """A hash of what the entries share: the same in every process."""
    reason: str
    service: str | None
    exception: str | None
    message: str
    """The newest entry's message, masked (:func:`mask`)."""
    where: tuple[Frame, ...] = ()
    """Where it was raised: the handler's innermost frames (file, function, statement),
    innermost last; empty for an error without a traceback."""
    entry_ids: list[int] = field(default_factory=list)
    """Its entries, the newest first."""
    hosts: set[str] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None
    example: str | None = None
    """The newest entry's exception line, as it was."""
    example_entry: int | None = None
    """The newest entry's id."""

    @property
    def count(self) -> int:
        return len(self.entry_ids)


def group_id(reason: str, service: str | None, exception: str | None, place: str) -> str:
    """The id of a group: a hash of its key (``place``: where, or the masked message)."""
    key = "\x1f".join((reason, service or "", exception or "", place))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _key(place: tuple[Frame, ...] | str) -> str:
    """Where an error was raised (its frames), or its masked message, as text."""
    if isinstance(place, str):
        return "message\x1d" + place
    return "\x1e".join("\x1d".join(f) for f in place)


def groups(rows: list[FailureRow]) -> list[FailureGroup]:
    """The groups of ``rows`` (newest first), largest first, then the most recent."""
    found: dict[tuple[str, str | None, str | None, object], FailureGroup] = {}
    masked: dict[str, str] = {}  # many errors without a traceback are one text
    for r in rows:
        error = read(r.error)
        place = error.where or masked.get(error.message)
        if place is None:
            place = masked[error.message] = _MASK.sub("\x00", error.message)
        g = found.get((r.reason, r.service, error.exception, place))
        if g is None:
            g = found[(r.reason, r.service, error.exception, place)] = FailureGroup(
                group_id(r.reason, r.service, error.exception, _key(place)),
                r.reason,
                r.service,
                error.exception,
                mask(error.message),
                error.where,
                example=": ".join(p for p in (error.exception, error.message) if p),
                example_entry=r.id,
            )
        g.entry_ids.append(r.id)
        if r.host:
            g.hosts.add(r.host)
        g.first = r.suspended_at if g.first is None else min(g.first, r.suspended_at)
        g.last = r.suspended_at if g.last is None else max(g.last, r.suspended_at)
    return sorted(found.values(), key=lambda g: (-g.count, -(g.last.timestamp() if g.last else 0)))
