"""Failure groups: suspended entries that failed the same way, as ServicePulse groups
failed messages, so that an operator handles a hundred alike failures as one.

An entry's group is its reason, its subscription's service, the exception type and the
error's message (the last line of a traceback) with what varies from message to message
masked: UUIDs, hex strings, numbers and quoted values. The group id is a hash of that key,
stable across processes and restarts.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

MAX_MESSAGE = 300

_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX = re.compile(
    r"\b(?:0x)?[0-9a-fA-F]*[0-9][0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b|\b0x[0-9a-fA-F]+\b"
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Failure|Timeout|Exit|Interrupt|Warning|Refused)?):\s*(.*)$"
)


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
    """Suspended entries that failed alike."""

    id: str
    reason: str
    service: str | None
    exception: str | None
    message: str
    entry_ids: list[int] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None
    example: str | None = None
    """One entry's error as it was (its last line)."""

    @property
    def count(self) -> int:
        return len(self.entry_ids)


def last_line(error: str | None) -> str:
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalise(line: str) -> tuple[str | None, str]:
    """(exception type, message with its varying parts masked) of an error's last line."""
    found = _EXCEPTION.match(line)
    exception, message = (found.group(1), found.group(2)) if found else (None, line)
    message = _UUID.sub("<id>", message)
    message = _QUOTED.sub("<value>", message)
    message = _HEX.sub("<hex>", message)
    message = _NUMBER.sub("<n>", message)
    return exception, message[:MAX_MESSAGE]


def group_id(reason: str, service: str | None, exception: str | None, message: str) -> str:
    key = "\x1f".join((reason, service or "", exception or "", message))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def groups(rows: list[FailureRow]) -> list[FailureGroup]:
    """The groups of ``rows``, largest first (then the most recent)."""
    found: dict[str, FailureGroup] = {}
    for r in rows:
        line = last_line(r.error)
        exception, message = normalise(line)
        gid = group_id(r.reason, r.service, exception, message)
        g = found.get(gid)
        if g is None:
            g = found[gid] = FailureGroup(
                gid, r.reason, r.service, exception, message, example=line
            )
        g.entry_ids.append(r.id)
        if r.host:
            g.hosts.add(r.host)
        g.first = r.suspended_at if g.first is None else min(g.first, r.suspended_at)
        g.last = r.suspended_at if g.last is None else max(g.last, r.suspended_at)
    return sorted(found.values(), key=lambda g: (-g.count, -(g.last.timestamp() if g.last else 0)))
