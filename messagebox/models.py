"""Value objects the API returns and takes: hosts, subscriptions, results, settings."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from messagebox.errors import ValidationError
from messagebox.predicates import Filter, FilterExplanation
from messagebox.properties import Value
from messagebox.suggest import did_you_mean
from messagebox.timing import YEAR_SECONDS


class Kind(StrEnum):
    """Activation subscriptions start work; instance subscriptions feed a running instance."""

    ACTIVATION = "activation"
    INSTANCE = "instance"


class State(StrEnum):
    """Service states, as in BizTalk (docs/concepts.md: Kinds)."""

    STARTED = "started"
    """Messages are routed and delivered."""
    STOPPED = "stopped"
    """Enlisted but stopped: messages are routed and held until the service starts."""
    UNENLISTED = "unenlisted"
    """No active subscription: messages do not route to it."""


SERVICE_ACTIONS = {"start": State.STARTED, "stop": State.STOPPED, "unenlist": State.UNENLISTED}
"""The state each service action (command line, console) puts a service in."""


class QueueState(StrEnum):
    """A queue entry's state (``mb_queue.state``)."""

    READY = "ready"
    """Its subscription is started: the entry may be claimed."""
    HELD = "held"
    """Its subscription is stopped: the entry waits until the service starts."""


class InstanceState(StrEnum):
    """A service instance's state (``mb_service_instance.state``; docs/concepts.md:
    Orchestrations)."""

    RUNNING = "running"
    """Handling its messages, one at a time."""
    SUSPENDED = "suspended"
    """A step failed past its retries: its other messages wait (the claim skips it)
    until the failed entry is resumed or terminated."""
    COMPLETED = "completed"
    """Done: its convoy, timers and instance subscriptions are gone."""
    TERMINATED = "terminated"
    """Ended by an operator (``MessageBox.terminate_instance``): as completed, and its
    queued and suspended messages were terminated."""


ENDED = frozenset({InstanceState.COMPLETED.value, InstanceState.TERMINATED.value})
"""The states of a service instance that has ended: no step runs on it again."""


class OnFailure(StrEnum):
    """What an ordered subscription does when a message exhausts its retries."""

    SUSPEND = "suspend"
    """Suspend that message (resumable) and go on with the next; the default."""
    STOP = "stop"
    """Suspend that message and stop the service: later messages are held, in order,
    until the message is resumed or terminated and the service started again. Ordered
    by a property (``ordered_by``): hold only that message's key, until it is resumed
    or terminated; the other keys go on."""


class OnExpiry(StrEnum):
    """What becomes of a subscription's queue entry that expires before it is delivered
    (docs/concepts.md: Expiry)."""

    SUSPEND = "suspend"
    """Move it to the suspended queue, reason ``expired`` (resumable with a new
    expiry, or terminable); the default."""
    DROP = "drop"
    """Delete it and release its reference (cleanup then deletes the message if
    nothing else refers to it)."""

    @classmethod
    def of(cls, value: object) -> OnExpiry:
        """``value`` as an :class:`OnExpiry`; else ``ValueError`` naming the choices."""
        if isinstance(value, str) and value in cls._value2member_map_:
            return cls(value)
        choices = " or ".join(e.value for e in cls)
        raise ValueError(f"on_expiry must be {choices}, not {value!r}")


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


PREFETCH_BATCHES = 16
"""Batches per dequeue thread that a host instance may hold by default where one claim
takes them for all its threads: where claims are serialised in-process (DuckDB, where a
statement costs milliseconds whatever its size), and where the instance runs
orchestrations (a thread then takes many steps together). How far it claims ahead also
follows its handlers' pace (``hosts.claiming.AHEAD_SECONDS``). At 4 threads of 50
(``bench.orchestrate``, DuckDB): 1 (200) gave 5.6k msgs/s of plain delivery and 700
orchestration steps/s; 4 (800) 8.8k and 1.6k; on a faster machine 4 gave 30-32k and
3.8-4.3k, 16 (3,200, at the handlers' pace) 33-37k and 5.1-6.5k. On PostgreSQL,
orchestrations: a batch a thread, 1,309-2,102 steps/s; 16 at the handlers' pace,
2,511-3,593 (alternating, five runs each)."""


DAY = 86_400.0
"""The longest any time setting may be (seconds): a longer one is a typo, and past the
range a database's clock arithmetic can take (``lease_seconds=1e308`` made every claim
fail on PostgreSQL)."""

YEAR = YEAR_SECONDS
"""The longest a time to live may be (seconds): :data:`messagebox.timing.YEAR_SECONDS`."""

DEFAULT_HANDLER_TIMEOUT = 300.0
"""The default ``handler_timeout_seconds``: five minutes, as Azure Service Bus renews a
message's lock by default and an Azure Function may run. Long enough for any handler
that calls a slow service with its own time-outs; short enough that a hung one gives its
batch back, and its entry is retried and in the end suspended, within minutes."""


class HostSettings(BaseModel):
    """A host's settings, with the defaults a new host gets (docs/concepts.md: Hosts).

    Every value is bounded and finite (a time at most :data:`DAY`, a time to live at
    most :data:`YEAR`); a store that holds a bad value written by an older version
    reads it as the default (:meth:`from_stored`)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    dequeue_threads: int = Field(4, ge=1, le=256)
    """Threads per host instance that claim and handle messages."""
    claim_batch: int = Field(10, ge=1, le=10_000)
    """Entries one claim takes; they are completed together in one transaction."""
    poll_min_seconds: float = Field(0.05, ge=0.001, le=60)
    """Wait after an empty claim; doubled on each further empty claim..."""
    poll_max_seconds: float = Field(2.0, ge=0.001, le=3600)
    """...up to this. On PostgreSQL a publish wakes idle instances at once (NOTIFY)."""
    lease_seconds: float = Field(60.0, ge=0.01, le=DAY)
    """How long a claim lasts without a heartbeat; heartbeats extend live leases."""
    heartbeat_seconds: float = Field(5.0, ge=0.01, le=3600)
    """How often an instance proves it is alive (and extends the leases of the entries
    it has in flight)."""
    dead_after_seconds: float = Field(30.0, ge=0.02, le=DAY)
    """An instance whose heartbeat is older than this is dead: its leases are released."""
    max_in_flight: int | None = Field(None, ge=1, le=1_000_000)
    """Claimed but unfinished entries per instance, across its threads. On DuckDB one
    claim takes entries for all the threads: up to four batches a thread, and beyond,
    up to this, as many as the threads finished in the last half second
    (docs/concepts.md, Hosts). On PostgreSQL an instance that runs orchestrations does
    the same from one batch a thread. ``None``: a batch for every dequeue thread
    (``dequeue_threads * claim_batch``), at least 100; sixteen batches for every thread
    where one claim serves them all (DuckDB; orchestrations on PostgreSQL)."""
    max_attempts: int = Field(5, ge=1, le=1000)
    """Failed deliveries of one entry before it is suspended (resumable); a delivery
    during which its host process ended counts too (``crashed-host``)."""
    handler_timeout_seconds: float | None = Field(DEFAULT_HANDLER_TIMEOUT, ge=0.01, le=DAY)
    """A handler still running after this long is abandoned: its entry fails (retried,
    then suspended), the rest of its batch is given back and its thread is replaced.
    Python cannot stop a thread: an instance with more than ``dequeue_threads``
    handlers abandoned and still running has no thread left to give; it stops itself,
    to be restarted (docs/concepts.md: Hosts). ``None``: no limit (a hung handler then
    holds its batch for ever)."""
    retry_backoff_seconds: float = Field(1.0, ge=0, le=DAY)
    """Wait before retry n is ``retry_backoff_seconds * 2**(n-1)``, at most an hour."""
    throttle_queue_depth: int = Field(100_000, ge=1, le=1_000_000_000)
    """Publishing to this host waits (or raises Throttled) while its queue is deeper."""
    cleanup_interval_seconds: float = Field(60.0, ge=0, le=DAY)
    """How often an instance runs the cleanup job in-process (0: never)."""
    message_ttl_seconds: float | None = Field(None, ge=0.01, le=YEAR)
    """Every entry queued on the host after this is set expires this long after it is
    due (or sooner, by its message's own expiry): past it, it is never delivered but
    suspended (``expired``) or dropped, as its subscription says (docs/concepts.md:
    Expiry). ``None``: entries expire only by their messages' expiry."""
    unserved: Literal["warn", "refuse"] = "warn"
    """A subscription of the host whose service an instance does not run (a misspelt
    name, say): ``warn`` logs it (``event: unserved-subscription``) and its messages fail
    and are suspended; ``refuse`` also makes the instance refuse to start."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name != "unserved":
            raise ValueError("must be a number")  # True is not 1 thread
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HostSettings:
        if self.poll_max_seconds < self.poll_min_seconds:
            raise ValueError("poll_max_seconds must be at least poll_min_seconds")
        if self.dead_after_seconds <= self.heartbeat_seconds:
            raise ValueError("dead_after_seconds must be longer than heartbeat_seconds")
        return self

    def in_flight(self, *, ahead: bool = False) -> int:
        """``max_in_flight``, or its default when unset: a batch for every thread, or
        :data:`PREFETCH_BATCHES` where one claim takes batches for several threads
        (``ahead``)."""
        if self.max_in_flight is not None:
            return self.max_in_flight
        batches = PREFETCH_BATCHES if ahead else 1
        return max(100, batches * self.dequeue_threads * self.claim_batch)

    @classmethod
    def checked(cls, what: str, values: Mapping[str, Any]) -> HostSettings:
        """Settings from ``values``; anything wrong is one ``ValidationError`` naming
        ``what`` and each bad setting (``max_attempts: ... not 'abc'``)."""
        try:
            return cls.model_validate(dict(values))
        except pydantic.ValidationError as exc:
            problems = "; ".join(_settings_problem(e) for e in exc.errors())
            raise ValidationError(f"{what}: bad settings: {problems}") from None

    @classmethod
    def from_stored(cls, text: str) -> tuple[HostSettings, tuple[str, ...]]:
        """Settings as a store holds them (JSON), and what was wrong with them. A value
        that an older version let in and this one refuses (``null`` for an infinite
        time, ``1e308``) is read as its default, and said: the store still opens and
        lists, and ``hosts set`` repairs it."""
        try:
            return cls.model_validate_json(text), ()
        except pydantic.ValidationError:
            pass
        try:
            stored = json.loads(text)
        except ValueError:
            stored = None
        if not isinstance(stored, dict):
            return cls(), (f"unreadable settings {text[:80]!r}: every setting at its default",)
        kept: dict[str, Any] = {}
        notes: list[str] = []
        for name, value in stored.items():
            if name not in cls.model_fields:
                notes.append(f"{name!r} is not a setting: ignored")
                continue
            try:
                cls.model_validate({name: value})
            except pydantic.ValidationError as exc:
                mine = [e for e in exc.errors() if tuple(e["loc"]) == (name,)]
                if mine:
                    default = cls.model_fields[name].default
                    notes.append(f"{_settings_problem(mine[0])}: read as {default!r}")
                    continue
            kept[name] = value  # only a rule across settings failed, with the defaults
        try:
            return cls.model_validate(kept), tuple(notes)
        except pydantic.ValidationError as exc:
            rules = "; ".join(_settings_problem(e) for e in exc.errors())
            timing = {f for f in kept if f.startswith(("poll_", "heartbeat_", "dead_after_"))}
            notes.append(f"{rules}: {', '.join(sorted(timing))} read as the defaults")
            return cls.model_validate({k: v for k, v in kept.items() if k not in timing}), tuple(
                notes
            )


def setting_values(items: Iterable[str]) -> dict[str, Any]:
    """``SETTING=VALUE`` texts (command line ``--set``, console lines) as settings: each
    value read as JSON, else as text. ``ValueError`` names a text without ``=``."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected SETTING=VALUE, not {item!r}")
        try:
            settings[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key.strip()] = raw.strip()
    return settings


def _settings_problem(error: Any) -> str:
    name = ".".join(str(x) for x in error["loc"])
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(name, HostSettings.model_fields)
        return f"{name!r} is not a setting{hint} (they are: {', '.join(HostSettings.model_fields)})"
    message = str(error["msg"]).removeprefix("Value error, ")
    if not name:  # a rule across settings
        return message
    return f"{name}: {message[:1].lower()}{message[1:]}, not {error['input']!r}"


@dataclass(frozen=True)
class Host:
    name: str
    settings: HostSettings
    created_at: datetime
    repairs: tuple[str, ...] = ()
    """What was wrong with the settings as stored (read as defaults instead):
    :meth:`HostSettings.from_stored`. Empty for a sound store."""


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
    on_failure: OnFailure = OnFailure.SUSPEND
    correlation: tuple[str, ...] = ()
    """Properties whose values pick the running instance this activation subscription
    routes to (a convoy, docs/concepts.md: Orchestrations); empty for a plain subscription."""
    on_expiry: OnExpiry = OnExpiry.SUSPEND
    """What becomes of its entries that expire before delivery: suspended (``expired``)
    or dropped."""
    ordered_by: str | None = None
    """The property whose value orders its entries per key: each key's strictly in
    publish order, one at a time, keys in parallel (docs/concepts.md: Per-key order)."""


@dataclass(frozen=True)
class Suspension:
    """Store a message suspended (not resumable) whatever it matches: a receive
    pipeline refused it. With ``route`` it is also routed, as an error report, to the
    subscriptions it matches; it is stored once either way."""

    reason: str
    error: str
    report: Mapping[str, Any] | None = None
    route: bool = False


@dataclass(frozen=True, slots=True)
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
DELIVERY_FAILURE = "delivery-failure"
"""A service failed the message more than ``max_attempts`` times (resumable)."""
SUBSCRIPTION_REMOVED = "subscription-removed"
"""Its subscription was removed while it waited (can be re-routed)."""
SERVICE_UNENLISTED = "service-unenlisted"
"""Its service was unenlisted while it waited (resumable)."""
RECEIVE_FAILURE = "receive-failure"
"""A receive pipeline refused the input; the message holds its original bytes (not
resumable: fix the cause and submit it again)."""
INSTANCE_COMPLETED = "completed-with-discarded-messages"
"""Its service instance completed before consuming it (not resumable)."""
CRASHED_HOST = "crashed-host"
"""Host processes ended while handling it (a crash, a kill) ``max_attempts`` times: it
is kept from stopping them again (resumable)."""
EXPIRED = "expired"
"""It was not delivered before its expiry (resumable, with a new expiry or none)."""


@dataclass(frozen=True)
class InstanceInfo:
    """A registered host instance."""

    id: str
    host: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    state: str


REROUTABLE = (ROUTING_FAILURE, SUBSCRIPTION_REMOVED)
"""Suspended reasons of entries with no destination: rerouted, never resumed."""
RESUMABLE = (DELIVERY_FAILURE, SERVICE_UNENLISTED, CRASHED_HOST)
"""Suspended reasons of entries that can be resumed (a receive failure is resubmitted,
an entry of a completed instance only terminated)."""

SUSPENDED_REASONS = (
    ROUTING_FAILURE,
    DELIVERY_FAILURE,
    SUBSCRIPTION_REMOVED,
    SERVICE_UNENLISTED,
    RECEIVE_FAILURE,
    INSTANCE_COMPLETED,
    CRASHED_HOST,
    EXPIRED,
)
"""The reasons the engine suspends entries with."""


@dataclass(frozen=True)
class SubscriptionExplanation:
    """Why one subscription would or would not receive a message."""

    subscription: Subscription
    routes: bool
    """Whether the message routes to it (what ``would_route`` answers): its filter
    matches and it is enlisted."""
    filter: FilterExplanation
    """Per group: matched, or the first predicate that failed, with the actual value."""

    @property
    def matched(self) -> bool:
        """Whether its filter matches (an unenlisted subscription may match and not route)."""
        return self.filter.matched


@dataclass(frozen=True)
class RouteExplanation:
    """Every subscription against one message's promoted properties."""

    message_id: uuid.UUID | None
    """The stored message explained, or None for properties given directly."""
    properties: dict[str, Value]
    subscriptions: tuple[SubscriptionExplanation, ...]

    @property
    def routes_to(self) -> tuple[Subscription, ...]:
        """The subscriptions the message routes to (``would_route``'s answer)."""
        return tuple(e.subscription for e in self.subscriptions if e.routes)


@dataclass(frozen=True)
class QueueStats:
    """The entries of one subscription on its host's queue."""

    host: str
    subscription: int
    name: str | None
    """The subscription's name and service (None if it was removed meanwhile)."""
    service: str | None
    depth: int
    """Every entry: ready + held + blocked + leased + scheduled."""
    ready: int
    """Waiting to be claimed (or for their retry time)."""
    held: int
    """Held while the service is stopped."""
    blocked: int
    """Blocked behind a suspended entry of their service instance: a suspended step
    holds its instance's later messages until it is resumed or terminated."""
    leased: int
    """Claimed by a host instance whose lease has not expired."""
    oldest_enqueued_at: datetime
    oldest_age_seconds: float
    """Age of the oldest entry, by the database clock."""
    scheduled: int = 0
    """Not due yet and never delivered (``deliver_at``, ``delay``), whether ready or
    held: distinct from entries waiting for a retry, which count as ready."""
    next_due_at: datetime | None = None
    """When the first scheduled entry is due (None when none is)."""


@dataclass(frozen=True)
class HostStats:
    """A host with its settings and what it holds now."""

    name: str
    settings: HostSettings
    created_at: datetime
    instances: int
    """Registered host instances."""
    queued: int
    """Entries on its queue, in every state."""
    suspended: int
    """Suspended entries of its subscriptions."""
    repairs: tuple[str, ...] = ()
    """What was wrong with its settings as stored (:attr:`Host.repairs`)."""


@dataclass(frozen=True)
class Stats:
    """Counts over the whole MessageBox, in one transaction."""

    messages: int
    """Messages in the spool (referenced or waiting for cleanup)."""
    parts: int
    part_bytes: int
    queued: dict[str, int]
    """Queue entries by state: ready, held, blocked, leased, scheduled."""
    suspended: dict[str, int]
    """Suspended entries by reason."""
    subscriptions: dict[str, int]
    """Subscriptions by state: started, stopped, unenlisted."""
    hosts: int
    host_instances: int
    """Registered host instances (live or not yet found dead)."""
    service_instances: dict[str, int]
    """Orchestration instances by state: running, suspended, completed, terminated."""


@dataclass(frozen=True)
class Throughput:
    """Tracked events over a recent window, by the database clock (tracking data,
    docs/concepts.md: Operations: counted only while tracking is enabled)."""

    seconds: float
    """The window: events tracked at most this many seconds ago."""
    events: dict[str, int]
    """Events by kind (every kind of :data:`messagebox.storage.tracking.EVENTS`, zeros included)."""
