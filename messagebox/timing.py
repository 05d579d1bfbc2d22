"""When a message's queue entries are due and when they expire (docs/concepts.md:
Scheduled delivery, Expiry): the checks of ``deliver_at``, ``expires_at``, ``ttl`` and
``delay``, and each message's times in a publish, from the database's time.

No storage here: :mod:`messagebox.routing.writes` writes the times, :mod:`messagebox.storage.expiry`
sweeps what expired.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from messagebox.errors import MessageValidationError, ValidationError

if TYPE_CHECKING:
    from messagebox.message import Message

YEAR_SECONDS = 365 * 86_400.0
"""The longest a time to live or a delay may be: expiry and scheduling are for hours
and days, and a longer one is a typo (a timestamp given as seconds)."""


class Timing(NamedTuple):
    """A message's own times, as checked when it was built (UTC)."""

    deliver_at: datetime | None
    expires_at: datetime | None
    ttl: float | None


class Times(NamedTuple):
    """Each message's times in one publish, by position: when its entries are due (never
    before the publish), and when they expire (None: never, but by a host's
    ``message_ttl_seconds``)."""

    due: list[datetime]
    expires: list[datetime | None]


def seconds(what: str, value: object, error: type[ValidationError] = ValidationError) -> float:
    """``value`` as a number of seconds from 0 to :data:`YEAR_SECONDS`, or ``error``
    naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{what} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise error(f"{what} must be a finite number of seconds of at least 0, not {value!r}")
    if value > YEAR_SECONDS:
        raise error(f"{what} must be at most 365 days ({YEAR_SECONDS:,.0f} s), not {value!r}")
    return float(value)


def instant(what: str, value: object, error: type[ValidationError] = ValidationError) -> datetime:
    """``value`` as a UTC datetime, or ``error`` naming ``what``: it must be a
    timezone-aware datetime (a naive one names no moment)."""
    if not isinstance(value, datetime):
        raise error(f"{what} must be a timezone-aware datetime, not {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{what} must be timezone-aware, not the naive {value.isoformat()}")
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise error(f"{what} {value.isoformat()} is out of range in UTC") from exc


def message_timing(deliver_at: object, expires_at: object, ttl: object) -> Timing | None:
    """A message's times, checked (None when it has none)."""
    if deliver_at is None and expires_at is None and ttl is None:
        return None
    error = MessageValidationError
    due = None if deliver_at is None else instant("deliver_at", deliver_at, error)
    end = None if expires_at is None else instant("expires_at", expires_at, error)
    live = None if ttl is None else seconds("ttl", ttl, error)
    if live == 0:
        raise error("ttl must be more than 0 seconds: the message would expire as it is published")
    if end is not None and live is not None:
        raise error("give expires_at or ttl, not both")
    if due is not None and end is not None and due >= end:
        raise error(
            f"deliver_at {due.isoformat()} is not before expires_at {end.isoformat()}: "
            "the message would expire before it is due"
        )
    return Timing(due, end, live)


_TIMING = operator.attrgetter("timing")


def batch_times(
    messages: Sequence[Message], now: datetime, delay: float | None, *, strict: bool = True
) -> Times | None:
    """Each message's times in a publish at the database's ``now``; None when no message
    has any and there is no ``delay`` (the common case, looked at in C). ``delay``
    applies to the messages without their own ``deliver_at``. With ``strict``, a message
    whose entries would be due at or after their expiry is refused, naming it (a ttl
    counts from ``now``); else (a service's publications, which must not fail its
    completion) it is stored and expires when due."""
    if not delay and not any(map(_TIMING, messages)):
        return None
    later = now + timedelta(seconds=delay) if delay else now
    due: list[datetime] = []
    expires: list[datetime | None] = []
    for i, message in enumerate(messages):
        t: Timing | None = message.timing
        if t is None:
            due.append(later)
            expires.append(None)
            continue
        at = later if t.deliver_at is None else max(t.deliver_at, now)
        end = t.expires_at
        if t.ttl is not None:
            end = now + timedelta(seconds=t.ttl)
        if strict and end is not None and at >= end:
            raise MessageValidationError(
                f"message {i}: due at {at.isoformat()} (deliver_at or delay), not before its "
                f"expiry {end.isoformat()}; nothing of the batch was stored"
            )
        due.append(at)
        expires.append(end)
    return Times(due, expires)


def entry_expiry(
    due: datetime, expires: datetime | None, host_ttl: float | None
) -> datetime | None:
    """An entry's expiry: its message's, or its host's ``message_ttl_seconds`` after it
    is due, whichever comes first."""
    if host_ttl is None:
        return expires
    by_host = due + timedelta(seconds=host_ttl)
    return by_host if expires is None else min(expires, by_host)
