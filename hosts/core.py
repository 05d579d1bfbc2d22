"""What every part of a host instance shares: its settings, store, subscriptions and
wake-ups, the entries it has in flight, and the recording of outcomes (one transaction a
batch, retried; what cannot be written yet is kept and retried by the housekeeper)."""

from __future__ import annotations

import difflib
import functools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from messagebox import clock, upkeep
from messagebox.claims import Claim, Failure
from messagebox.engine import MessageBox, StoreURL
from messagebox.errors import BackendUnavailable, MessageBoxError
from messagebox.hosts.dispatch import (
    Ahead,
    InstanceStats,
    Pace,
    Pending,
    Permits,
    Run,
    SharedReads,
)
from messagebox.hosts.idle import NextDue
from messagebox.hosts.service import Delivery, Handler, as_handler
from messagebox.models import (
    Host,
    HostSettings,
    InstanceInfo,
    Kind,
    OnFailure,
    State,
    Subscription,
)
from messagebox.order_keys import describe
from messagebox.outcomes import Outcomes, Recorded

log = logging.getLogger("messagebox.hosts")

FINISH_TRIES = 5

EXPIRE_BATCHES = 10
"""Sweep transactions (of ``upkeep.EXPIRY_BATCH`` entries) a heartbeat at most: a backlog of
expired entries takes several beats rather than delaying one."""


class Receiver(Protocol):
    """Something a host instance runs beside its dequeue threads: a receive location.

    ``start`` returns at once (the receiver runs on its own threads); ``stop`` stops
    taking input and returns within ``timeout`` seconds, having finished or given back
    what it had taken."""

    def start(self, box: MessageBox, owner: str) -> None: ...

    def stop(self, timeout: float) -> None: ...


def _settings(stored: Host, overrides: Mapping[str, Any] | None, instance: str) -> HostSettings:
    """The host's stored settings with this instance's ``overrides``; a bad stored value
    (read as its default) is logged."""
    for repair in stored.repairs:
        log.error(
            "host instance %s: host %r stored a bad setting: %s (repair it with "
            "`messagebox hosts set`)",
            instance,
            stored.name,
            repair,
            extra={"event": "bad-stored-setting", "host": stored.name, "problem": repair},
        )
    if not overrides:
        return stored.settings
    return HostSettings.checked(
        f"host instance of {stored.name!r}", {**stored.settings.model_dump(), **overrides}
    )


KEYED_REST_SECONDS = 0.02
"""How long a thread whose claim found no free key claims no keyed runs (every thread,
where one claim serves them all: DuckDB), where its host has other subscriptions
beside those ordered by a property; twice as long after each such claim in a row, up
to :data:`KEYED_REST_MOST`. Looking for them costs a claim as much as a plain claim
costs on DuckDB (the planning of its statement: 2.5 ms), 0.2 ms on PostgreSQL: a
tenth and more of the rest of the host's rate when there are none. A keyed entry then
waits that much more for a claim, at most (on PostgreSQL the thread that holds a key
claims its next run as it completes the last, resting or not)."""
KEYED_REST_MOST = 0.16


class InstanceCore:
    """A host instance's state, and the outcome recording its threads share."""

    def __init__(
        self,
        box: MessageBox | StoreURL | None,
        host: str,
        services: Mapping[str, object],
        *,
        settings: Mapping[str, Any] | None = None,
        name: str | None = None,
        close_box: bool | None = None,
        receivers: Sequence[Receiver] = (),
    ) -> None:
        self._owns_box = not isinstance(box, MessageBox) if close_box is None else close_box
        self.box = box if isinstance(box, MessageBox) else MessageBox(box)
        self.host = host
        self.id = name or f"{host}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.settings: HostSettings = _settings(self.box.host(host), settings, self.id)
        self.queue = self.box.consumer(host, self.id)
        """The store as this instance uses it."""
        self.handlers: dict[str, Handler] = {n: as_handler(n, s) for n, s in services.items()}
        self._uses_instances = any(getattr(s, "uses_instances", False) for s in services.values())
        self._flushers: dict[str, Callable[[], None]] = _methods(services, "flush")
        """Services that make a batch's work durable at its end (file send ports)."""
        self._batchers: dict[str, Callable[[list[Delivery]], list[Exception | None]]] = _methods(
            services, "handle_many"
        )
        self.stats = InstanceStats()
        self._subs: dict[int, Subscription] = {}
        self._subs_lock = threading.Lock()
        self._warned_unserved: set[int] = set()
        """Subscriptions already logged as naming a service this instance does not run."""
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._workers_ended = threading.Event()
        """Set by :meth:`stop` once the dequeue threads have ended (or its time is up)."""
        self._stopped = threading.Event()
        """Set when :meth:`stop` has finished (given back, unregistered)."""
        self.exhausted: str | None = None
        """Why the instance stopped itself: its handlers hung past what its threads can
        take (:meth:`Supervision._exhaust`); None while it runs as it should."""
        self._wake_cond = threading.Condition()
        self._wakes = 0
        self._permits = Permits(self.settings.in_flight(ahead=self._claims_ahead()))
        self._threads: list[threading.Thread] = []
        """The dequeue threads (one that timed out or failed is replaced here)."""
        self._generation = 0
        self._abandoned: list[threading.Thread] = []
        """Threads whose handler was abandoned and still runs (they end when it returns)."""
        self._runs: set[Run] = set()
        self._runs_lock = threading.Lock()
        self._in_flight: dict[int, Sequence[Claim]] = {}
        """Claimed batches not yet recorded, by ``id()`` of the batch's list: the only
        leases heartbeats extend. (A batch in and out is one dict operation each; an
        entry may be in two batches, delivered again meanwhile.)"""
        self._pending: list[Pending] = []
        self._claim_turn = threading.Lock()  # see Supervision._claim_for_all
        self._ahead = Ahead()
        """Batches claimed for other dequeue threads, and outcomes owed to a claim."""
        self._pace = Pace()  # entries the threads finished lately: how deep to claim ahead
        self._run_pace = Pace()  # ordered runs' entries finished lately: how long a run
        self._reads = SharedReads()  # batches claimed ahead reading their messages together
        self._flight_lock = threading.Lock()
        self._claiming = 0  # claims running now (under _flight_lock): idle_seconds
        self._service_threads: list[threading.Thread] = []
        self._unwatch: Callable[[], None] | None = None
        self._unwatch_timers: Callable[[], None] | None = None
        self._timer_wake = threading.Event()
        self._timers_look_at = math.inf
        """When the timer loop looks next (seconds since the epoch; inf while it looks)."""
        self._started = False
        self._empty_since: float | None = None  # since no work, monotonic (idle_seconds)
        self._elsewhere_checked: tuple[float, bool] = (-math.inf, False)  # when, and what
        self._last_cleanup = time.monotonic()
        self._last_depth = 0.0
        self._next_due = NextDue(self.queue.next_available, self.settings)
        """When an idle thread claims again: its back-off, or the next entry's due time."""
        self.receivers: list[Receiver] = list(receivers)
        """Receive locations this instance runs (started after it registers, stopped
        first)."""
        self.on_stop: list[Callable[[], None]] = []
        """Called once the instance has stopped (closing send ports' connections)."""

    def wake(self) -> None:
        """Wake idle workers (a publish touched this host)."""
        with self._wake_cond:
            self._wakes += 1
            self._wake_cond.notify_all()

    def _event(self, name: str, **fields: object) -> dict[str, object]:
        """The ``extra`` of a log line (see docs/operations.md, Structured logs): its
        event, this instance and its host, and the event's own fields."""
        return {"event": name, "host_instance": self.id, "host": self.host, **fields}

    def _info(self) -> InstanceInfo:
        stamp = clock.local_now()
        return InstanceInfo(
            id=self.id,
            host=self.host,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=stamp,
            heartbeat_at=stamp,
            state="running",
        )

    def _store_failed(self, what: str, exc: MessageBoxError, event: str) -> None:
        """Log a failed store call: an error, unless the store was unreachable (its
        ``store-lost`` line says so once, and ``store-back`` when it answers again):
        then at debug level, rather than a line for each try until it is back."""
        level = logging.DEBUG if isinstance(exc, BackendUnavailable) else logging.ERROR
        log.log(
            level,
            "host instance %s: %s failed: %s",
            self.id,
            what,
            exc,
            extra=self._event(event, error=str(exc)),
        )

    def _expire(self) -> None:
        """Sweep the host's expired entries off its queue (suspended or dropped, as
        their subscriptions say), up to :data:`EXPIRE_BATCHES` transactions a beat."""
        total = upkeep.Swept()
        for _ in range(EXPIRE_BATCHES):
            swept = self.queue.expire()
            total.suspended += swept.suspended
            total.dropped += swept.dropped
            if swept.total < upkeep.EXPIRY_BATCH:
                break
        if total.total:
            self.stats.add(expired=total.total)
            log.info(
                "host instance %s: %d entries expired (%d suspended, %d dropped)",
                self.id,
                total.total,
                total.suspended,
                total.dropped,
                extra=self._event("expired", suspended=total.suspended, dropped=total.dropped),
            )

    def _refresh_subscriptions(self) -> None:
        subs = {s.id: s for s in self.box.subscriptions(host=self.host)}
        with self._subs_lock:
            self._subs = subs
            unserved = [
                s
                for s in subs.values()
                if s.service not in self.handlers
                and s.state is not State.UNENLISTED
                and s.id not in self._warned_unserved
            ]
            self._warned_unserved.update(s.id for s in unserved)
        for sub in unserved:
            log.warning(
                "host instance %s: subscription %r (id %d) routes to service %r, which this "
                "instance does not run; its messages fail and are suspended after their "
                "attempts. %s",
                self.id,
                sub.name,
                sub.id,
                sub.service,
                self.unserved_hint(sub.service),
                extra={
                    "event": "unserved-subscription",
                    "host_instance": self.id,
                    "host": self.host,
                    "subscription": sub.id,
                    "service": sub.service,
                },
            )

    def unserved_hint(self, service: str) -> str:
        """What this instance runs instead of ``service``, and the likeliest misspelling."""
        runs = sorted(self.handlers)
        close = difflib.get_close_matches(service, runs, n=1, cutoff=0.6)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        return hint + f"It runs: {', '.join(runs) or 'no service'}."

    def _subscription(self, sub_id: int) -> Subscription | None:
        found = self._subs.get(sub_id)  # replaced whole, never changed in place: no lock
        if found is None:
            self._refresh_subscriptions()
            with self._subs_lock:
                found = self._subs.get(sub_id)
        return found

    def _has_ordered(self) -> bool:
        with self._subs_lock:
            return any(s.ordered for s in self._subs.values())

    def _keyed_claim(self, n: int) -> tuple[int, bool]:
        """:meth:`_keyed_share` for this thread's claim: none while keyed claims rest
        (:meth:`_keyed_claimed`), unless they are all there is."""
        keyed, only = self._keyed_share(n)
        rest = self._keyed_rest.get(self._rest_slot(), (0.0, 0.0))
        resting = time.monotonic() < rest[0]
        return (0, False) if keyed and not only and resting else (keyed, only)

    def _keyed_claimed(self, asked: int, only: bool, claims: Sequence[Claim]) -> None:
        """After a claim that asked for keyed runs beside other entries: one that found
        none rests keyed claims (this thread's; every thread's where claims are
        serialised) for :data:`KEYED_REST_SECONDS`, twice as long after each such claim
        in a row up to :data:`KEYED_REST_MOST`; one that found some ends the rest.
        (:attr:`_keyed_rest`: per thread, or 0, no keyed claim before when, and how
        long the last rest was.)"""
        if not asked or only:
            return
        slot, rests = self._rest_slot(), self._keyed_rest
        if any(c.key is not None for c in claims):
            rests.pop(slot, None)
            return
        last = rests.get(slot, (0.0, 0.0))[1]
        rest = min(KEYED_REST_MOST, 2 * last) if last else KEYED_REST_SECONDS
        rests[slot] = (time.monotonic() + rest, rest)

    def _rest_slot(self) -> int:
        return 0 if self.queue.claims_serialised else threading.get_ident()

    @functools.cached_property
    def _keyed_rest(self) -> dict[int, tuple[float, float]]:
        """The rests of keyed claims (see :meth:`_keyed_claimed`)."""
        return {}

    def _keyed_share(self, n: int) -> tuple[int, bool]:
        """How many of a claim of ``n`` may be keyed runs (subscriptions ordered by a
        property), and whether nothing else is to be claimed: none without such a
        subscription; all of it when every other subscription of the host is one too
        (nothing else then); else half (at least one), so that neither the keyed
        entries nor the others wait for all of the other kind."""
        with self._subs_lock:
            subs = [s for s in self._subs.values() if s.state is not State.UNENLISTED]
        keyed = sum(1 for s in subs if s.ordered_by)
        if not keyed:
            return 0, False
        only = keyed == len(subs) and not self._uses_instances
        return (n, True) if only else (max(1, n // 2), False)

    def _claims_ahead(self) -> bool:
        """Whether one claim takes batches for the other dequeue threads too: where
        claims are serialised in-process (DuckDB), and where the instance runs
        orchestrations (a thread takes many steps together: one read, one load and one
        commit for them all)."""
        return self.queue.claims_serialised or self._uses_instances

    def _has_instances(self) -> bool:
        """Whether entries of this host can be for a service instance (claimed one at
        a time per instance)."""
        if self._uses_instances:
            return True
        with self._subs_lock:
            return any(s.kind is Kind.INSTANCE or s.correlation for s in self._subs.values())

    def _stop_on_failure(self) -> set[int]:
        with self._subs_lock:
            return {s.id for s in self._subs.values() if s.on_failure is OnFailure.STOP}

    def idle_seconds(self) -> float:
        """How long the instance has had nothing to do: its claims came back empty and
        no batch is in hand (0.0 while it has work, and until its first empty claim),
        and no other process holds entries of its host (one at work, or one that ended,
        whose leases come to this one after ``dead_after_seconds``). An entry waiting
        for its retry, or a timer not yet due, is not work yet."""
        since = self._empty_since
        if since is None or self._ahead:
            return 0.0
        with self._flight_lock:
            if self._in_flight or self._claiming:
                return 0.0
        if self._held_elsewhere():
            return 0.0
        return max(0.0, time.monotonic() - since)

    def _held_elsewhere(self) -> bool:
        """Whether another process holds entries of the host (asked of the store at most
        once a second; a store that cannot say is taken to say yes)."""
        now = time.monotonic()
        if now - self._elsewhere_checked[0] >= 1.0:
            try:
                held = self.queue.held_elsewhere()
            except MessageBoxError:
                held = True
            self._elsewhere_checked = (now, held)
        return self._elsewhere_checked[1]

    def _found_work(self) -> None:
        self._empty_since = None

    def _found_nothing(self) -> None:
        if self._empty_since is None:
            self._empty_since = time.monotonic()

    def _wait(self, seen: int, seconds: float) -> None:
        with self._wake_cond:
            if self._wakes == seen and not self._stopping.is_set():
                self._wake_cond.wait(seconds)

    def _forget(self, claims: Sequence[Claim]) -> None:
        """These deliveries are over (once per claimed batch): heartbeats stop extending
        their leases. An entry may be in flight twice (delivered again meanwhile)."""
        with self._flight_lock:
            self._in_flight.pop(id(claims), None)

    def _flying(self) -> list[int]:
        """The ids of the entries in flight, each once, in order."""
        with self._flight_lock:
            return sorted({c.id for claims in self._in_flight.values() for c in claims})

    def _outcomes(
        self, done: Sequence[Claim], failed: Sequence[Failure], unstarted: Sequence[Claim]
    ) -> Outcomes:
        return Outcomes(done, failed, unstarted, self.settings, self._stop_on_failure())

    def _finish(self, done: list[Claim], failed: list[Failure], unstarted: list[Claim]) -> None:
        """Record a batch's outcomes, retried a few times on error; outcomes that still
        cannot be written are retried by the housekeeper until their leases would have
        lapsed (they are no longer extended: another delivery follows)."""
        self._finish_outcomes(self._outcomes(done, failed, unstarted))

    def _finish_outcomes(self, outcomes: Outcomes, *, recheck: bool = False) -> None:
        """Record outcomes, tried again a few times. ``recheck``: only those of entries
        still leased for the delivery claimed (the store may have been lost since the
        claim); after a failed try, always."""
        if not outcomes:
            return  # every step committed its own outcome (orchestrations)
        pause = 0.05
        for attempt in range(1, FINISH_TRIES + 1):
            try:
                recorded = self.queue.record(outcomes, recheck=recheck)
                break
            except MessageBoxError as exc:
                recheck = True
                if attempt == FINISH_TRIES:
                    log.error(
                        "host instance %s: could not record %d outcomes (%s); retrying "
                        "in the background, else delivered again once their leases lapse "
                        "(within %.0f s)",
                        self.id,
                        outcomes.size,
                        exc,
                        self.settings.lease_seconds,
                        extra=self._event("record-failed", count=outcomes.size, error=str(exc)),
                    )
                    with self._flight_lock:
                        self._pending.append(Pending(outcomes, time.monotonic()))
                    return
                time.sleep(pause)
                pause *= 2
        self._account(recorded)

    def _account(self, recorded: Recorded) -> None:
        result, given = recorded.finished, recorded.given
        self.stats.add(
            completed=result.completed,
            retried=result.retried,
            suspended=result.suspended,
            lost_leases=result.lost,
            given_back=given,
        )
        if result.suspended:
            log.warning(
                "host instance %s: suspended %d entries",
                self.id,
                result.suspended,
                extra={
                    "event": "suspended",
                    "host_instance": self.id,
                    "host": self.host,
                    "count": result.suspended,
                },
            )
        if result.held_keys:
            log.warning(
                "host instance %s: keys held after a suspended message (ordered_by, "
                "on_failure=stop): %s; resume or terminate it to release its key",
                self.id,
                ", ".join(f"{describe(k)} of subscription {sub}" for sub, k in result.held_keys),
                extra=self._event(
                    "keys-held", keys=[[sub, describe(k)] for sub, k in result.held_keys]
                ),
            )
        if result.stopped_subscriptions:
            log.warning(
                "host instance %s: ordered subscriptions %s stopped after a suspended "
                "message (on_failure=stop); resume or terminate it, then start the service",
                self.id,
                ", ".join(map(str, result.stopped_subscriptions)),
                extra=self._event(
                    "subscriptions-stopped", subscriptions=list(result.stopped_subscriptions)
                ),
            )
            self._refresh_subscriptions()

    def _retry_pending(self) -> None:
        """Write the outcomes that could not be written before; give up on those whose
        leases have lapsed by now (they are delivered again)."""
        with self._flight_lock:
            pending, self._pending = self._pending, []
        for p in pending:
            try:
                recorded = self.queue.record(p.outcomes, recheck=True)
            except MessageBoxError as exc:
                if time.monotonic() - p.since < self.settings.lease_seconds:
                    with self._flight_lock:
                        self._pending.append(p)
                else:
                    log.error(
                        "host instance %s: gave up recording %d outcomes (%s); their "
                        "entries are delivered again",
                        self.id,
                        p.outcomes.size,
                        exc,
                        extra=self._event(
                            "outcomes-abandoned", count=p.outcomes.size, error=str(exc)
                        ),
                    )
                continue
            log.info(
                "host instance %s: recorded %d outcomes that had failed to be written",
                self.id,
                p.outcomes.size,
                extra=self._event("outcomes-recorded-late", count=p.outcomes.size),
            )
            self._account(recorded)


def _methods(services: Mapping[str, object], name: str) -> dict[str, Any]:
    """The method ``name`` of each service that has one, by service name."""
    return {n: getattr(s, name) for n, s in services.items() if callable(getattr(s, name, None))}
