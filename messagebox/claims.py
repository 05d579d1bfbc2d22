"""Claims and their outcomes as values: a queue entry claimed under a lease, a failed
delivery, what finishing a batch did, and the order a claim hands entries out in. The
storage side (claiming, finishing) is :mod:`messagebox.delivery.leases`; no SQL here, so a host
instance takes these without importing storage."""

from __future__ import annotations

import operator
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from messagebox import clock
from messagebox.models import DELIVERY_FAILURE

if TYPE_CHECKING:
    from messagebox.message import Message

MAX_BACKOFF_SECONDS = 3600.0


class Entry(NamedTuple):
    """A queue entry as tracking records its delivery (a step's:
    :func:`messagebox.delivery.service_instances.commit_steps`)."""

    id: int
    msg: uuid.UUID
    sub: int
    host: str


class Claim(NamedTuple):
    """A queue entry claimed under a lease; ``attempts`` counts this delivery. (A named
    tuple: a host instance makes one per delivery, and a frozen dataclass costs five
    times as much to make.)"""

    id: int
    msg: uuid.UUID
    sub: int
    attempts: int
    priority: int
    instance_id: str | None
    ordered: bool
    enqueued: datetime | int | None = None
    """When it was queued as the claim fetched it (on DuckDB microseconds since the
    epoch): read :attr:`enqueued_at`, made when asked for (few ask)."""
    waited: float | None = None
    """Seconds from enqueue to this claim by the database clock, when this is the
    entry's first claim (not after a give-back or a lapsed lease); else ``None``."""
    charges: int = 0
    """Earlier deliveries charged against ``max_attempts``: failures, and deliveries
    marked started whose host then ended."""
    interrupted: bool = False
    """The previous delivery ended with no outcome (a crash, a kill, a lapsed lease)."""
    crashed_by: str | None = None
    """The last host instance that ended while handling it, if any."""
    run: bool = False
    """Claimed as part of an ordered subscription's run (:func:`messagebox.delivery.leases.claim`
    with ``ordered``): the thread that claimed it handles the run, whole and in order."""
    publish: tuple[Message, ...] = ()
    """Messages its service published with its completion
    (``Delivery.publish_on_completion``): stored and routed in the transaction that
    completes the entry, and only if it does."""
    key: str | None = None
    """Its key, where its subscription is ordered by a property (``ordered_by``): claimed
    with the rest of its key's run (:func:`messagebox.delivery.leases.claim_keyed`), which the
    claiming thread handles in order, one at a time."""

    @property
    def enqueued_at(self) -> datetime | None:
        """When the entry was queued, by the database clock."""
        return None if self.enqueued is None else clock.fetched(self.enqueued)


@dataclass(frozen=True)
class Failure:
    """A failed delivery: the error text, and whether to suspend without retrying."""

    claim: Claim
    error: str
    permanent: bool = False
    reason: str = DELIVERY_FAILURE
    retry_after: float | None = None
    """The service's own retry delay (``RetryLater``): retried however many attempts."""
    charge: bool = True
    """Counted against ``max_attempts``; False for ``RetryLater`` and when the engine,
    not the service, failed (the store was unreachable): then retried after
    ``retry_after`` however many times."""


@dataclass
class Finished:
    """What :func:`messagebox.delivery.leases.finish` did."""

    completed: int = 0
    retried: int = 0
    suspended: int = 0
    lost: int = 0
    stopped_subscriptions: tuple[int, ...] = ()
    held_keys: tuple[tuple[int, str], ...] = ()
    """(subscription, key) of the keys a suspended entry now holds (``ordered_by`` with
    ``on_failure="stop"``)."""
    completed_ids: list[int] = field(default_factory=list)
    """The entries completed (deleted while still the owner's)."""


def in_claim_order(claims: list[Claim]) -> None:
    """Sort by priority (highest first), then age (id): two C-keyed stable sorts, the
    second only when priorities differ."""
    claims.sort(key=_ID)
    priorities = list(map(_PRIORITY, claims))
    if priorities and min(priorities) != max(priorities):
        claims.sort(key=_PRIORITY, reverse=True)  # stable: equal priorities keep id order


_ID = operator.attrgetter("id")
_PRIORITY = operator.attrgetter("priority")
