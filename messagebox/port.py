"""The storage port of a host instance: what :mod:`messagebox.hosts` calls on its store,
and nothing more. :class:`HostStore` is one instance's queue:
:class:`messagebox.delivery.consumer.Consumer` implements it over SQL (DuckDB, PostgreSQL),
:class:`messagebox.memory.MemoryConsumer` in memory, with the same semantics
(``tests/contract`` drives both through the same scenarios). :class:`HostBox` is the
box a host instance is given (its settings, subscriptions, each instance's
:class:`HostStore`, and what its services read and publish):
:class:`messagebox.engine.MessageBox` and :class:`messagebox.memory.MemoryBox`.

Only value types here (claims, outcomes, steps, upkeep, models): no SQL, so a host
names the port without importing storage.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from messagebox.claims import Claim
from messagebox.message import Message, MessageSummary, StoredMessage
from messagebox.models import Host, InstanceInfo, Routed, RoutingPolicy, Subscription
from messagebox.outcomes import Outcomes, Recorded
from messagebox.steps import Step, Stored
from messagebox.upkeep import CleanupReport, Swept


class Taker(Protocol):
    """A host instance that takes the entries a publish in this process hands over
    (:mod:`messagebox.storage.handover`; :class:`messagebox.hosts.handover.HandOver`)."""

    @property
    def owner(self) -> str:
        """The lease owner its claims set."""
        ...

    @property
    def lease_seconds(self) -> float: ...

    def reserve(self, n: int, *, busy: bool = False) -> int:
        """Permits for up to ``n`` entries, without waiting; 0 unless it has no backlog
        and (unless ``busy``) a thread free."""
        ...

    def accept(self, claims: list[Claim], age: float) -> None:
        """The entries reserved for, stored leased to it (committed), their lease set
        ``age`` seconds ago."""
        ...

    def cancel(self, n: int) -> None:
        """``n`` reserved permits back: the transaction stored nothing."""
        ...


class HostStore(Protocol):
    """The store as one host instance of one host uses it, one transaction a call."""

    @property
    def outages(self) -> int:
        """How many times the store was found lost since it opened."""
        ...

    @property
    def claims_serialised(self) -> bool:
        """Whether claims are serialised in-process: one claim for several threads'
        batches then does the same work in fewer statements."""
        ...

    @property
    def listens(self) -> bool:
        """Whether other processes' publications arrive as wake-ups (:meth:`listen`)."""
        ...

    @property
    def timers_set_here(self) -> bool:
        """Whether every timer is set by a step in this process, so that
        :meth:`timer_set_before` knows of each one."""
        ...

    # --- wake-ups ---

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when this process queues work for the host; returns the
        function that stops watching."""
        ...

    def watch_timers(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when a step in this process sets a timer on the host."""
        ...

    def hand_over_to(self, taker: Taker) -> Callable[[], None] | None:
        """Have this process's publishes hand the host's entries to ``taker`` while it
        is idle, where one process holds the database; returns the function that stops
        it (None: nothing is handed over)."""
        ...

    def listen(self, wake: Callable[[], None], stop: threading.Event) -> None:
        """Call ``wake`` when another process queues work for the host, until ``stop``
        (blocks; only where :attr:`listens`)."""
        ...

    # --- membership ---

    def register(self, info: InstanceInfo) -> list[str]:
        """Register the instance; returns warnings about the store."""
        ...

    def unregister(self) -> int:
        """Unregister; returns the leases released (kept interrupted)."""
        ...

    def heartbeat(self, lease_seconds: float, in_flight: Sequence[int], info: InstanceInfo) -> bool:
        """Prove the instance alive and extend the leases in flight; re-registers and
        returns False if it had been declared dead meanwhile."""
        ...

    def release_dead(self, dead_after_seconds: float) -> tuple[list[str], int]:
        """Unregister the host's dead instances (never this one) and release their
        leases: their ids and the number of leases released."""
        ...

    def held_elsewhere(self) -> bool:
        """Whether entries of the host are leased by an instance not of this process."""
        ...

    # --- the queue ---

    def claim(
        self,
        n: int,
        lease_seconds: float,
        *,
        ordered: bool,
        instances: bool,
        outcomes: Outcomes | None = None,
        ordered_most: int | None = None,
        rest_most: int | None = None,
        keyed: int = 0,
        per_key: int = 0,
        keyed_only: bool = False,
    ) -> tuple[list[Claim], Recorded | None]:
        """Record ``outcomes`` (if any), then lease up to ``n`` ready entries: an ordered
        run first (``ordered``, at most ``ordered_most``), then at most ``rest_most``
        others, of which at most ``keyed`` of keyed runs (``per_key`` a key; only those
        with ``keyed_only``), service instances' heads (``instances``) and plain ones."""
        ...

    def mark_started(self, claims: Sequence[Claim]) -> None:
        """Record that these deliveries start: should the instance end before their
        outcome, the next claim charges them an attempt."""
        ...

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> Recorded:
        """Complete, fail and give back in one transaction (``recheck``: only entries
        whose delivery is still the one claimed)."""
        ...

    def completing(self, claim: Callable[[], Claim]) -> AbstractContextManager[Any]:
        """A transaction for a service's own writes that completes ``claim()`` when
        the block ends; :class:`~messagebox.errors.Conflict` if the entry is no longer
        this instance's."""
        ...

    def next_available(self) -> float | None:
        """Seconds until the host's next entry not due yet becomes due, or None."""
        ...

    def expire(self, batch: int = ...) -> Swept:
        """Suspend or drop up to ``batch`` of the host's expired entries not in hand."""
        ...

    # --- service instances (orchestrations) ---

    def next_due(self) -> float | None:
        """Seconds until the host's next timer is due (0 if one is), or None."""
        ...

    def timer_set_before(self, at: float) -> bool:
        """Whether a step in this process set a timer of the host due before ``at``
        (seconds since the epoch) since the timers were last looked at."""
        ...

    def fire_timers(self) -> Counter[str]:
        """Queue the host's due timeouts; returns the entries queued per host."""
        ...

    def load(self, instance_ids: Sequence[str]) -> tuple[datetime, dict[str, Stored], set[str]]:
        """The store's time, the saved instances of these ids, and which of the missing
        ones are convoys still being created."""
        ...

    def commit_steps(self, steps: Sequence[Step], publisher: str) -> int:
        """Commit steps at once; returns the messages discarded by completions."""
        ...


class DepthSampler(Protocol):
    """Where a host instance records its host's queue depth (the box's operations)."""

    def sample_depth(self, host: str, source: str) -> int:
        """Record ``host``'s queue depth now; returns it."""
        ...


@runtime_checkable
class HostBox(Protocol):
    """The box as host instances and their services use it: the host's settings and
    subscriptions, a :class:`HostStore` per instance, the messages the services read,
    what they publish, and the upkeep an instance runs."""

    @property
    def operations(self) -> DepthSampler: ...

    def host(self, name: str) -> Host:
        """One host, by name."""
        ...

    def subscriptions(self, *, host: str | None = None) -> Sequence[Subscription]:
        """Subscriptions, by id (of one host, if given)."""
        ...

    def consumer(self, host: str, owner: str) -> HostStore:
        """The store as the host instance ``owner`` of ``host`` uses it."""
        ...

    def read_message(self, message_id: uuid.UUID | str) -> StoredMessage:
        """A stored message: its context and parts."""
        ...

    def message_summary(self, message_id: uuid.UUID | str) -> MessageSummary:
        """A stored message's context and part sizes, without its parts."""
        ...

    def read_messages(
        self,
        message_ids: Iterable[uuid.UUID | str],
        *,
        max_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """Several stored messages; past ``max_bytes`` (or ``total_bytes`` in all) a
        message comes as its summary."""
        ...

    def iter_part(self, message_id: uuid.UUID | str, part: str) -> Iterator[bytes]:
        """A part's bytes, a fragment at a time."""
        ...

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str = ...,
        delay: float | None = None,
    ) -> list[Routed]:
        """Publish a batch at once (a service's ``Delivery.publish(..., at_once=True)``)."""
        ...

    def cleanup(self, *, batch: int = ..., stop: Callable[[], bool] | None = None) -> CleanupReport:
        """Run the cleanup job once (a host instance runs it every
        ``cleanup_interval_seconds``)."""
        ...

    def close(self) -> None:
        """Let go of what the box holds."""
        ...
