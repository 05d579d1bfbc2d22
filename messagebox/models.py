"""Value objects the API returns and takes: hosts, subscriptions, results, settings."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from predicates import Filter


class Kind(StrEnum):
    """Activation subscriptions start work; instance subscriptions feed a running instance."""

    ACTIVATION = "activation"
    INSTANCE = "instance"


class State(StrEnum):
    """Service states, as in BizTalk (DESIGN.md §4)."""

    STARTED = "started"
    """Messages are routed and delivered."""
    STOPPED = "stopped"
    """Enlisted but stopped: messages are routed and held until the service starts."""
    UNENLISTED = "unenlisted"
    """No active subscription: messages do not route to it."""


class RoutingPolicy(StrEnum):
    """What to do with a message that matches no subscription."""

    SUSPEND = "suspend"
    """Store it suspended (not resumable) with a routing-failure report; the default."""
    DROP = "drop"
    """Store nothing for it."""
    RAISE = "raise"
    """Raise :class:`~messagebox.errors.RoutingFailure`; the whole batch is rolled back."""


class Outcome(StrEnum):
    ROUTED = "routed"
    SUSPENDED = "suspended"
    DROPPED = "dropped"


class HostSettings(BaseModel):
    """A host's settings, with the defaults a new host gets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dequeue_threads: int = Field(4, ge=1, le=256)
    claim_batch: int = Field(10, ge=1, le=10_000)
    poll_min_seconds: float = Field(0.05, gt=0)
    poll_max_seconds: float = Field(2.0, gt=0)
    lease_seconds: float = Field(60.0, gt=0)
    max_in_flight: int = Field(100, ge=1)
    max_attempts: int = Field(5, ge=1)
    retry_backoff_seconds: float = Field(1.0, ge=0)
    throttle_queue_depth: int = Field(100_000, ge=1)


@dataclass(frozen=True)
class Host:
    name: str
    settings: HostSettings
    created_at: datetime


@dataclass(frozen=True)
class Subscription:
    id: int
    name: str
    service: str
    host: str
    filter: Filter
    kind: Kind
    instance_id: str | None
    priority: int
    state: State
    ordered: bool
    created_at: datetime


@dataclass(frozen=True)
class Routed:
    """What publish did with one message."""

    message_id: uuid.UUID
    outcome: Outcome
    subscriptions: tuple[int, ...]


@dataclass(frozen=True)
class QueueDepth:
    host: str
    subscription: int
    state: str
    depth: int


@dataclass(frozen=True)
class SuspendedEntry:
    id: int
    message_id: uuid.UUID
    subscription: int | None
    host: str | None
    resumable: bool
    reason: str
    error: str | None
    report: dict[str, Any] | None
    attempts: int
    suspended_at: datetime


ROUTING_FAILURE = "routing-failure"
