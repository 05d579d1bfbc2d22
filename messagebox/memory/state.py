"""The in-memory store's rows and its database-level operations: hosts, subscriptions,
publishing (routing by the pure-Python filter evaluator), wake-ups, and what a test
inspects. The rows mirror the SQL tables (``mb_queue``, ``mb_suspended``, ``mb_timer``,
``mb_service_instance``, ``mb_instance``); every change happens under :attr:`MemoryStore.lock`,
one "transaction" a call."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from messagebox import order_keys
from messagebox.errors import RoutingFailure, UnknownHost, ValidationError
from messagebox.memory.clocks import Clock, SystemClock
from messagebox.message import Message
from messagebox.models import (
    INSTANCE_COMPLETED,
    ROUTING_FAILURE,
    SUBSCRIPTION_REMOVED,
    HostSettings,
    InstanceInfo,
    Kind,
    OnExpiry,
    OnFailure,
    Outcome,
    Routed,
    RoutingPolicy,
    State,
    Subscription,
)
from messagebox.predicates import filter_matches, to_filter
from messagebox.steps import TIMER_PUBLISHER, Stored
from messagebox.timing import batch_times, entry_expiry

READY, HELD = "ready", "held"
NOT_RESUMABLE = frozenset({SUBSCRIPTION_REMOVED, INSTANCE_COMPLETED, ROUTING_FAILURE})
"""Suspended reasons that are never resumed (rerouted or terminated instead)."""


@dataclass
class Entry:
    """A queue entry (``mb_queue``'s columns)."""

    id: int
    msg: uuid.UUID
    sub: int
    host: str
    priority: int
    state: str
    available_at: datetime
    enqueued_at: datetime
    ordered: bool
    instance_id: str | None = None
    order_key: str | None = None
    expires_at: datetime | None = None
    attempts: int = 0
    charges: int = 0
    lease_owner: str | None = None
    lease_expires: datetime | None = None
    claimed_at: datetime | None = None
    interrupted: bool = False
    started_by: str | None = None
    crashed_by: str | None = None

    def leased(self, now: datetime) -> bool:
        """In hand: its lease has not lapsed (``lease_expires >= now()``)."""
        return self.lease_expires is not None and self.lease_expires >= now

    def free(self, now: datetime) -> bool:
        """Not in hand (``lease_expires IS NULL OR lease_expires < now()``)."""
        return self.lease_expires is None or self.lease_expires < now

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


@dataclass
class Suspended:
    """A suspended entry (``mb_suspended``'s columns that delivery reads)."""

    id: int
    msg: uuid.UUID
    sub: int | None
    host: str | None
    reason: str
    error: str
    resumable: bool
    suspended_at: datetime
    instance_id: str | None = None
    order_key: str | None = None
    holds_key: bool = False
    attempts: int = 0


@dataclass
class Timer:
    """A service instance's timer (``mb_timer``)."""

    id: int
    instance_id: str
    service: str
    host: str
    sub: int
    name: str
    due_at: datetime


@dataclass
class Registered:
    """A registered host instance (``mb_instance``)."""

    info: InstanceInfo
    heartbeat_at: datetime


@dataclass
class Rows:
    """Every table of the store."""

    hosts: dict[str, HostSettings] = field(default_factory=dict)
    subs: dict[int, Subscription] = field(default_factory=dict)
    queue: dict[int, Entry] = field(default_factory=dict)
    suspended: dict[int, Suspended] = field(default_factory=dict)
    messages: dict[uuid.UUID, tuple[Message, str, datetime]] = field(default_factory=dict)
    """Each stored message, with its publisher and when it was published."""
    instances: dict[str, Stored] = field(default_factory=dict)
    timers: dict[int, Timer] = field(default_factory=dict)
    registered: dict[str, Registered] = field(default_factory=dict)


class MemoryStore:
    """A message box held in this process's memory, with the SQL stores' delivery
    semantics; time comes from ``clock`` (a :class:`~messagebox.memory.ManualClock` in
    tests). Host instances use it through :class:`~messagebox.memory.MemoryConsumer`."""

    def __init__(self, clock: Clock | None = None, publisher: str = "memory") -> None:
        self.clock: Clock = clock or SystemClock()
        self.publisher = publisher
        self.lock = threading.RLock()
        self.rows = Rows()
        self.live: set[str] = set()
        """The host instances registered through this store (this process's)."""
        self.timer_hints: dict[str, float] = {}
        """Per host, the earliest due time (epoch seconds) of the timers set since its
        timers were last looked at."""
        self._ids = itertools.count(1)
        self._watchers: dict[str, list[Callable[[], None]]] = {}
        self._watch_lock = threading.Lock()

    def now(self) -> datetime:
        return self.clock.now()

    def next_id(self) -> int:
        return next(self._ids)

    # --- set-up ---

    def create_host(self, name: str, settings: HostSettings | None = None, **options: Any) -> None:
        """Create a host (``options``: :class:`HostSettings` fields)."""
        with self.lock:
            if name in self.rows.hosts:
                raise ValidationError(f"host {name!r} exists already")
            base = settings or HostSettings()
            self.rows.hosts[name] = base.model_copy(update=options) if options else base

    def subscribe(
        self,
        service: str,
        *,
        host: str,
        filter: object,
        name: str | None = None,
        kind: Kind | str = Kind.ACTIVATION,
        instance_id: str | None = None,
        priority: int = 0,
        state: State | str = State.STARTED,
        ordered: bool = False,
        on_failure: OnFailure | str = OnFailure.SUSPEND,
        on_expiry: OnExpiry | str = OnExpiry.SUSPEND,
        ordered_by: str | None = None,
    ) -> Subscription:
        """Subscribe ``service`` (in ``host``) to messages matching ``filter``, as
        ``MessageBox.subscribe`` does (correlation and convoys are not supported here)."""
        with self.lock:
            if host not in self.rows.hosts:
                raise UnknownHost(f"no host {host!r}")
            if ordered and ordered_by is not None:
                raise ValidationError("give ordered or ordered_by, not both")
            sub_id = self.next_id()
            made = Subscription(
                id=sub_id,
                name=name or f"{service}-{sub_id}",
                service=service,
                host=host,
                filter=to_filter(filter),
                kind=Kind(kind),
                instance_id=instance_id,
                priority=priority,
                state=State(state),
                ordered=ordered,
                created_at=self.now(),
                on_failure=OnFailure(on_failure),
                on_expiry=OnExpiry(on_expiry),
                ordered_by=ordered_by,
            )
            self.rows.subs[sub_id] = made
            return made

    def set_state(self, sub_ids: Iterable[int], state: State) -> None:
        """Set subscriptions' state; their waiting entries follow (held while stopped)."""
        with self.lock:
            ids = set(sub_ids)
            for i in ids:
                self.rows.subs[i] = dataclasses.replace(self.rows.subs[i], state=state)
            was, now = (READY, HELD) if state is State.STOPPED else (HELD, READY)
            for e in self.rows.queue.values():
                if e.sub in ids and e.state == was:
                    e.state = now

    # --- publishing ---

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
        publisher: str | None = None,
        delay: float | None = None,
        strict: bool = True,
        ids: Sequence[uuid.UUID] | None = None,
    ) -> list[Routed]:
        """Route and store a batch at once (see ``MessageBox.publish``); ``ids``: the
        messages' ids (else their own, else new ones)."""
        batch = list(messages)
        with self.lock:
            now = self.now()
            times = batch_times(batch, now, delay, strict=strict)
            routes = [self._route(m) for m in batch]
            unrouted = [i for i, r in enumerate(routes) if not r]
            if unrouted and RoutingPolicy(policy) is RoutingPolicy.RAISE:
                raise RoutingFailure(f"message {unrouted[0]} matched no subscription")
            results, queued = [], Counter[str]()
            for i, (message, subs) in enumerate(zip(batch, routes, strict=True)):
                msg_id = ids[i] if ids is not None else message.id or uuid.uuid4()
                if subs or RoutingPolicy(policy) is RoutingPolicy.SUSPEND:
                    self.rows.messages[msg_id] = (message, publisher or self.publisher, now)
                due = now if times is None else times.due[i]
                ends = None if times is None else times.expires[i]
                for sub in subs:
                    self._enqueue(msg_id, sub, message, due, ends, now)
                    queued[sub.host] += 1
                results.append(self._routed(msg_id, subs, policy, now))
        self.signal(sorted(queued))
        return results

    def _route(self, message: Message) -> list[Subscription]:
        """The enlisted subscriptions ``message`` matches, by id, one per instance."""
        found, seen = [], set()
        for sub in sorted(self.rows.subs.values(), key=lambda s: s.id):
            if sub.state is State.UNENLISTED or not filter_matches(sub.filter, message.promoted):
                continue
            if sub.instance_id is not None:
                if sub.instance_id in seen:
                    continue
                seen.add(sub.instance_id)
            found.append(sub)
        return found

    def _routed(
        self, msg_id: uuid.UUID, subs: Sequence[Subscription], policy: object, now: datetime
    ) -> Routed:
        if subs:
            return Routed(msg_id, Outcome.ROUTED, tuple(s.id for s in subs))
        if RoutingPolicy(str(policy)) is RoutingPolicy.SUSPEND:
            entry_id = self.next_id()
            self.rows.suspended[entry_id] = Suspended(
                entry_id, msg_id, None, None, ROUTING_FAILURE,
                "the message matched no subscription", False, now,
            )  # fmt: skip
            return Routed(msg_id, Outcome.SUSPENDED, ())
        return Routed(msg_id, Outcome.DROPPED, ())

    def _enqueue(
        self,
        msg_id: uuid.UUID,
        sub: Subscription,
        message: Message,
        due: datetime,
        ends: datetime | None,
        now: datetime,
        instance_id: str | None = None,
    ) -> Entry:
        ttl = self.rows.hosts[sub.host].message_ttl_seconds if sub.host in self.rows.hosts else None
        key = None
        if sub.ordered_by is not None:
            key = order_keys.encode(message.promoted.get(sub.ordered_by))
        entry = Entry(
            id=self.next_id(),
            msg=msg_id,
            sub=sub.id,
            host=sub.host,
            priority=sub.priority,
            state=HELD if sub.state is State.STOPPED else READY,
            available_at=due,
            enqueued_at=now,
            ordered=sub.ordered,
            instance_id=instance_id or sub.instance_id,
            order_key=key,
            expires_at=entry_expiry(due, ends, ttl),
        )
        self.rows.queue[entry.id] = entry
        return entry

    def enqueue_direct(
        self,
        message: Message,
        msg_id: uuid.UUID,
        sub: Subscription,
        instance_id: str,
        now: datetime,
    ) -> None:
        """Store ``message`` and queue it for ``sub``'s ``instance_id`` alone, neither
        ordered nor keyed (a timeout, as ``router.enqueue_direct`` queues it)."""
        self.rows.messages[msg_id] = (message, TIMER_PUBLISHER, now)
        direct = dataclasses.replace(sub, ordered=False, ordered_by=None)
        self._enqueue(msg_id, direct, message, now, None, now, instance_id)

    def suspend(self, e: Entry, reason: str, error: str, *, holds_key: bool = False) -> None:
        """Move an entry (already off the queue) to the suspended queue."""
        sub = self.rows.subs.get(e.sub)
        self.rows.suspended[e.id] = Suspended(
            e.id, e.msg, e.sub if sub else None, e.host, reason, error,
            reason not in NOT_RESUMABLE, self.now(), e.instance_id, e.order_key,
            holds_key, e.attempts,
        )  # fmt: skip

    # --- wake-ups ---

    def watch(self, channel: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` on every :meth:`signal` of ``channel``; returns the unwatch."""
        with self._watch_lock:
            self._watchers.setdefault(channel, []).append(wake)

        def stop() -> None:
            with self._watch_lock:
                found = self._watchers.get(channel, [])
                if wake in found:
                    found.remove(wake)

        return stop

    def signal(self, channels: Sequence[str]) -> None:
        with self._watch_lock:
            wakes = [w for c in channels for w in self._watchers.get(c, [])]
        for wake in wakes:
            wake()

    # --- inspection ---

    def entries(self, host: str | None = None) -> list[Entry]:
        """Copies of the queue entries (of ``host``), by id."""
        with self.lock:
            return [
                dataclasses.replace(e)
                for _, e in sorted(self.rows.queue.items())
                if host is None or e.host == host
            ]

    def suspended(self) -> list[Suspended]:
        """Copies of the suspended entries, by id."""
        with self.lock:
            return [dataclasses.replace(s) for _, s in sorted(self.rows.suspended.items())]

    def subscription(self, sub_id: int) -> Subscription:
        return self.rows.subs[sub_id]

    def instance(self, instance_id: str) -> Stored | None:
        with self.lock:
            return self.rows.instances.get(instance_id)

    def timers(self, host: str | None = None) -> list[Timer]:
        with self.lock:
            return [t for t in self.rows.timers.values() if host is None or t.host == host]

    def message(self, msg_id: uuid.UUID) -> Message:
        return self.rows.messages[msg_id][0]

    def later(self, seconds: float) -> datetime:
        """The store's time ``seconds`` from now."""
        return self.now() + timedelta(seconds=seconds)
