"""A service instance's step as values (docs/concepts.md: Orchestrations): the instance
as stored, and what one message did to it, to commit at once. Loading and committing
them is :mod:`messagebox.delivery.service_instances`; no SQL here, so a host takes these without
importing storage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from messagebox.message import Message
from messagebox.models import InstanceState
from messagebox.properties import Value

TIMER_PUBLISHER = "messagebox.timer"
"""The publisher of timeout messages (their spool rows say so)."""
TIMEOUT_TYPE = "messagebox#timeout"
"""``messagebox.MessageType`` of a timeout message."""


@dataclass(frozen=True)
class Stored:
    """A service instance as stored."""

    id: str
    service: str
    host: str
    state: InstanceState
    correlation: dict[str, Value]
    data: dict[str, Any]
    version: int
    completed_at: datetime | None


@dataclass
class TimerSpec:
    name: str
    due_at: datetime


@dataclass
class Step:
    """What one message did to an instance, to commit at once."""

    owner: str
    entry_id: int
    instance_id: str
    service: str
    host: str
    sub: int
    """The subscription that delivered the message (timers come back through it)."""
    version: int | None
    """The version the step started from; None for a new instance."""
    data: dict[str, Any]
    correlation: Mapping[str, Value] = field(default_factory=dict)
    timers: list[TimerSpec] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    publish: list[Message] = field(default_factory=list)
    complete: bool = False
