"""A host instance: dequeuing threads that claim entries of one host's queue under a
lease, hand each to its service, and complete or fail it (DESIGN.md §8).

    instance = HostInstance(box, "shipping", services={"ship": ship})
    instance.run()          # until SIGINT/SIGTERM; or start() ... stop()

Threads:
- ``dequeue_threads`` workers: claim up to ``claim_batch`` entries (bounded by
  ``max_in_flight`` across the instance), handle them one by one, then complete and
  fail the whole batch in one transaction. Idle workers poll from ``poll_min_seconds``
  backing off to ``poll_max_seconds``; a publish wakes them at once (in-process, and on
  PostgreSQL through ``LISTEN/NOTIFY`` from any process).
- a housekeeper: heartbeat (which also extends this instance's leases), releasing the
  leases of dead instances of the host, refreshing the subscriptions, and running the
  cleanup job every ``cleanup_interval_seconds``.
- on PostgreSQL, a listener on its own connection.

Stopping is graceful: workers stop claiming, in-flight handlers get ``timeout`` seconds
to finish, claimed entries never handed to a service are given back (their attempt not
counted), and the instance unregisters.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa

from hosts.orchestration import timer_channel
from hosts.service import Delivery, Handler, MessageBatch, as_handler
from messagebox import clock, delivery, instances, metrics, notify
from messagebox.delivery import Claim, Failure
from messagebox.engine import MessageBox
from messagebox.errors import (
    InstanceCompleted,
    MessageBoxError,
    PermanentFailure,
    RetryLater,
)
from messagebox.models import (
    SUBSCRIPTION_REMOVED,
    HostSettings,
    InstanceInfo,
    Kind,
    OnFailure,
    Subscription,
)

log = logging.getLogger("messagebox.hosts")

FINISH_TRIES = 5


class _Settled:
    """A delivery the service completed itself (an orchestration step)."""


SETTLED = _Settled()


@dataclass
class Counters:
    """Thread-safe counters: subclasses declare them as ``int`` fields."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


@dataclass
class InstanceStats(Counters):
    """Counters of one host instance (read them any time; they only grow)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    """Handler errors (each is retried or suspended)."""
    retried: int = 0
    suspended: int = 0
    redelivered: int = 0
    """Claims of an entry delivered before (attempt > 1): a retry or a lost lease."""
    lost_leases: int = 0
    """Completions or failures that found the entry leased by another instance."""
    given_back: int = 0
    zombies: int = 0
    """Messages that reached a completed service instance (suspended, not resumable)."""
    timers_fired: int = 0


class _Permits:
    """At most ``max_in_flight`` claimed-but-unfinished entries per instance."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._cond = threading.Condition()

    def take(self, most: int, stopping: threading.Event) -> int:
        with self._cond:
            while self._free == 0 and not stopping.is_set():
                self._cond.wait(0.2)
            n = min(most, self._free)
            self._free -= n
            return n

    def give(self, n: int) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify_all()


class Receiver(Protocol):
    """Something a host instance runs beside its dequeue threads: a receive location.

    ``start`` returns at once (the receiver runs on its own threads); ``stop`` stops
    taking input and returns within ``timeout`` seconds, having finished or given back
    what it had taken."""

    def start(self, box: MessageBox, owner: str) -> None: ...

    def stop(self, timeout: float) -> None: ...


class HostInstance:
    """One running instance of a host: several processes or machines may run instances
    of the same host (PostgreSQL); each queue entry is handled by exactly one of them.

    ``services`` maps service names (as subscriptions name them) to handlers; see
    :mod:`hosts.service`. ``settings`` overrides the host's stored settings for this
    instance only (e.g. ``{"dequeue_threads": 2}``). ``close_box`` closes the box on
    stop (the default when the instance opened it from a URL).
    """

    def __init__(
        self,
        box: MessageBox | str | sa.URL | None,
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
        stored = self.box.host(host)
        self.settings: HostSettings = (
            HostSettings.checked(
                f"host instance of {host!r}", {**stored.settings.model_dump(), **settings}
            )
            if settings
            else stored.settings
        )
        self.host = host
        self.id = name or f"{host}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.handlers: dict[str, Handler] = {n: as_handler(n, s) for n, s in services.items()}
        self._uses_instances = any(getattr(s, "uses_instances", False) for s in services.values())
        self._flushers: dict[str, Callable[[], None]] = {
            n: getattr(s, "flush")  # noqa: B009
            for n, s in services.items()
            if callable(getattr(s, "flush", None))
        }
        """Services that make a batch's work durable at its end (file send ports)."""
        self._batchers: dict[str, Callable[[list[Delivery]], list[Exception | None]]] = {
            n: getattr(s, "handle_many")  # noqa: B009
            for n, s in services.items()
            if callable(getattr(s, "handle_many", None))
        }
        self.stats = InstanceStats()
        self._subs: dict[int, Subscription] = {}
        self._subs_lock = threading.Lock()
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._wake_cond = threading.Condition()
        self._wakes = 0
        self._permits = _Permits(self.settings.max_in_flight)
        self._threads: list[threading.Thread] = []
        self._service_threads: list[threading.Thread] = []
        self._unwatch: Callable[[], None] | None = None
        self._unwatch_timers: Callable[[], None] | None = None
        self._timer_wake = threading.Event()
        self._started = False
        self._last_cleanup = time.monotonic()
        self.receivers: list[Receiver] = list(receivers)
        """Receive locations this instance runs (started after it registers, stopped
        first)."""
        self.on_stop: list[Callable[[], None]] = []
        """Called once the instance has stopped (closing send ports' connections)."""

    # --- lifecycle ---

    def start(self) -> HostInstance:
        """Register and start the threads; returns at once."""
        if self._started:
            raise MessageBoxError(f"host instance {self.id} is started already")
        self._started = True
        self._refresh_subscriptions()
        with self.box.store.transaction(serial=True) as conn:
            delivery.register(conn, self._info())
        self._unwatch = notify.watch(self.box.store.key, self.host, self.wake)
        for n in range(self.settings.dequeue_threads):
            t = threading.Thread(target=self._worker, name=f"{self.host}-dequeue-{n}", daemon=True)
            self._threads.append(t)
        self._service_threads.append(
            threading.Thread(target=self._housekeeper, name=f"{self.host}-housekeeper", daemon=True)
        )
        if self.box.store.dialect.supports_notify:
            self._service_threads.append(
                threading.Thread(target=self._listener, name=f"{self.host}-listener", daemon=True)
            )
        if self._uses_instances:
            self._unwatch_timers = notify.watch(
                self.box.store.key, timer_channel(self.host), self._wake_timers
            )
            self._service_threads.append(
                threading.Thread(target=self._timers, name=f"{self.host}-timers", daemon=True)
            )
        for t in (*self._threads, *self._service_threads):
            t.start()
        for n, r in enumerate(self.receivers):
            try:
                r.start(self.box, self.id)
            except BaseException:
                for started in reversed(self.receivers[:n]):
                    started.stop(5.0)
                self.receivers = self.receivers[:0]
                self.stop(5.0)
                raise
        log.info(
            "host instance %s started: %d dequeue threads, claim batch %d",
            self.id,
            self.settings.dequeue_threads,
            self.settings.claim_batch,
            extra={"event": "instance-started", "host_instance": self.id, "host": self.host},
        )
        return self

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully: no new claims, in-flight work gets ``timeout`` seconds, then
        unregister. Returns False if some handler was still running (its entry will be
        delivered again, by another instance or after a restart)."""
        if not self._started or self._stopping.is_set():
            return True
        deadline = time.monotonic() + timeout
        for r in reversed(self.receivers):  # take nothing more in before draining
            try:
                r.stop(max(deadline - time.monotonic(), 1.0))
            except Exception as exc:
                log.error("host instance %s: receiver %r failed to stop: %s", self.id, r, exc)
        self._stopping.set()
        self._timer_wake.set()
        self.wake()
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0))
        finished = not any(t.is_alive() for t in self._threads)
        for t in self._service_threads:
            t.join(5.0)
        if self._unwatch is not None:
            self._unwatch()
        if self._unwatch_timers is not None:
            self._unwatch_timers()
        try:
            with self.box.store.transaction(serial=True) as conn:
                released = delivery.unregister(conn, self.id)
                if released:
                    self.box.store.dialect.notify(conn, [self.host])
        except MessageBoxError as exc:
            log.error("host instance %s could not unregister: %s", self.id, exc)
            released = 0
        if not finished:
            log.warning(
                "host instance %s: handlers still running after %.1f s; %d entries released "
                "for redelivery",
                self.id,
                timeout,
                released,
            )
        log.info(
            "host instance %s stopped: %s",
            self.id,
            self.stats.snapshot(),
            extra={
                "event": "instance-stopped",
                "host_instance": self.id,
                "host": self.host,
                "counts": self.stats.snapshot(),
            },
        )
        for callback in self.on_stop:
            try:
                callback()
            except Exception as exc:
                log.error("host instance %s: on_stop callback failed: %s", self.id, exc)
        if self._owns_box:
            self.box.close()
        return finished

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (safe from a signal handler or another thread)."""
        self._stop_requested.set()

    def run(self, *, stop_timeout: float = 30.0, duration: float | None = None) -> None:
        """Start, then block until SIGINT/SIGTERM, :meth:`request_stop` or ``duration``
        seconds; then stop gracefully."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda _s, _f: self.request_stop())
        try:
            self.start()
            deadline = None if duration is None else time.monotonic() + duration
            while not self._stop_requested.wait(0.2):
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            self.stop(stop_timeout)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def __enter__(self) -> HostInstance:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wake(self) -> None:
        """Wake idle workers (a publish touched this host)."""
        with self._wake_cond:
            self._wakes += 1
            self._wake_cond.notify_all()

    def _info(self) -> InstanceInfo:
        stamp = datetime.now(UTC)
        return InstanceInfo(
            id=self.id,
            host=self.host,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_at=stamp,
            heartbeat_at=stamp,
            state="running",
        )

    # --- subscriptions ---

    def _refresh_subscriptions(self) -> None:
        subs = {s.id: s for s in self.box.subscriptions(host=self.host)}
        with self._subs_lock:
            self._subs = subs

    def _subscription(self, sub_id: int) -> Subscription | None:
        with self._subs_lock:
            found = self._subs.get(sub_id)
        if found is None:
            self._refresh_subscriptions()
            with self._subs_lock:
                found = self._subs.get(sub_id)
        return found

    def _has_ordered(self) -> bool:
        with self._subs_lock:
            return any(s.ordered for s in self._subs.values())

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

    # --- the dequeue loop ---

    def _wait(self, seen: int, seconds: float) -> None:
        with self._wake_cond:
            if self._wakes == seen and not self._stopping.is_set():
                self._wake_cond.wait(seconds)

    def _worker(self) -> None:
        idle = self.settings.poll_min_seconds
        while not self._stopping.is_set():
            with self._wake_cond:
                seen = self._wakes
            want = self._permits.take(self.settings.claim_batch, self._stopping)
            if self._stopping.is_set():
                self._permits.give(want)
                break
            try:
                claims = self._claim(want)
            except MessageBoxError as exc:
                self._permits.give(want)
                log.error("host instance %s: claim failed: %s", self.id, exc)
                self._wait(seen, self.settings.poll_max_seconds)
                continue
            self._permits.give(want - len(claims))
            if not claims:
                self._wait(seen, idle)
                idle = min(idle * 2, self.settings.poll_max_seconds)
                continue
            idle = self.settings.poll_min_seconds
            try:
                self._handle_batch(claims)
            finally:
                self._permits.give(len(claims))

    def _claim(self, n: int) -> list[Claim]:
        started = time.perf_counter()
        with self.box.store.transaction(serial=True) as conn:
            claims = delivery.claim(
                conn,
                self.box.store.dialect,
                host=self.host,
                owner=self.id,
                n=n,
                lease_seconds=self.settings.lease_seconds,
                ordered=self._has_ordered(),
                instances=self._has_instances(),
            )
        seconds = time.perf_counter() - started
        waits = [c.waited for c in claims if c.waited is not None]
        metrics.observe_claim(self.host, seconds, waits)
        if claims:
            self.stats.add(
                claimed=len(claims), redelivered=sum(1 for c in claims if c.attempts > 1)
            )
        return claims

    def _handle_batch(self, claims: list[Claim]) -> None:
        done: list[Claim] = []
        failed: list[Failure] = []
        unstarted: list[Claim] = []
        blocked: set[int] = set()  # ordered subscriptions whose run stopped at a failure
        batch = MessageBatch(self.box, [c.msg for c in claims])
        together = self._handle_together(claims, batch)
        for c in claims:
            if c.id in together:
                outcome = together[c.id]
            elif self._stopping.is_set() or c.sub in blocked:
                unstarted.append(c)
                continue
            else:
                outcome = self._handle(c, batch)
            if outcome is None:
                done.append(c)
            elif isinstance(outcome, _Settled):
                self.stats.add(completed=1)
            else:
                failed.append(outcome)
                if c.ordered:
                    blocked.add(c.sub)
        done = self._flush(done, failed)
        self._finish(done, failed, unstarted)

    def _flush(self, done: list[Claim], failed: list[Failure]) -> list[Claim]:
        """Have the services that defer durability to the end of a batch (``flush``)
        make it durable before the batch's completions are recorded; the entries of a
        service whose flush fails are failed instead (and delivered again)."""
        if not self._flushers or not done:
            return done
        subs: dict[int, Subscription] = {}
        for c in done:
            sub = self._subscription(c.sub)
            if sub is not None and sub.service in self._flushers:
                subs[c.id] = sub
        broken: dict[str, Exception] = {}
        for service in sorted({sub.service for sub in subs.values()}):
            try:
                self._flushers[service]()
            except Exception as exc:
                broken[service] = exc
        if not broken:
            return done
        kept = []
        for c in done:
            sub = subs.get(c.id)
            if sub is not None and sub.service in broken:
                failed.append(self._failure(c, sub, broken[sub.service]))
            else:
                kept.append(c)
        return kept

    def _handle_together(
        self, claims: list[Claim], batch: MessageBatch
    ) -> dict[int, Failure | _Settled | None]:
        """Hand the claims of services that take a batch (``handle_many``, as
        orchestrations do: their steps commit in one transaction) to them at once."""
        if not self._batchers or self._stopping.is_set():
            return {}
        by_service: dict[str, list[tuple[Claim, Delivery]]] = {}
        for c in claims:
            sub = self._subscription(c.sub)
            if sub is not None and sub.service in self._batchers:
                d = self._delivery(c, sub, batch)
                by_service.setdefault(sub.service, []).append((c, d))
        outcomes: dict[int, Failure | _Settled | None] = {}
        for service, pairs in by_service.items():
            try:
                errors = self._batchers[service]([d for _, d in pairs])
            except Exception as exc:  # never lose the thread (and strand its claims)
                errors = [exc] * len(pairs)
            for (c, d), error in zip(pairs, errors, strict=True):
                if error is None:
                    outcomes[c.id] = SETTLED if d.settled else None
                else:
                    outcomes[c.id] = self._failure(c, d.subscription, error)
        return outcomes

    def _delivery(self, c: Claim, sub: Subscription, batch: MessageBatch) -> Delivery:
        return Delivery(
            self.box,
            entry_id=c.id,
            message_id=c.msg,
            subscription=sub,
            attempt=c.attempts,
            host_instance=self.id,
            batch=batch,
            instance_id=c.instance_id,
        )

    def _handle(self, c: Claim, batch: MessageBatch) -> Failure | _Settled | None:
        sub = self._subscription(c.sub)
        if sub is None:
            return Failure(
                c,
                "its subscription was removed before it was delivered",
                permanent=True,
                reason=SUBSCRIPTION_REMOVED,
            )
        handler = self.handlers.get(sub.service)
        if handler is None:
            return Failure(
                c,
                f"service {sub.service!r} is not registered in host instance {self.id} "
                f"(it runs: {', '.join(sorted(self.handlers)) or 'no service'})",
            )
        d = self._delivery(c, sub, batch)
        try:
            handler(d)
        except Exception as exc:
            return self._failure(c, sub, exc)
        return SETTLED if d.settled else None

    def _failure(self, c: Claim, sub: Subscription, exc: Exception) -> Failure:
        """What a service's exception means for its entry."""
        self.stats.add(failed=1)
        if isinstance(exc, PermanentFailure):
            if isinstance(exc, InstanceCompleted):
                self.stats.add(zombies=1)
                log.warning(
                    "host instance %s: zombie message %s: %s",
                    self.id,
                    c.msg,
                    exc,
                    extra=self._fields("zombie", c, sub, exc),
                )
            return Failure(c, f"{type(exc).__name__}: {exc}", permanent=True, reason=exc.reason)
        if isinstance(exc, RetryLater):
            log.info(
                "host instance %s: service %r retries entry %d in %.3g s (attempt %d): %s",
                self.id,
                sub.service,
                c.id,
                exc.delay,
                c.attempts,
                exc,
                extra=self._fields("retry-later", c, sub, exc),
            )
            return Failure(c, f"RetryLater: {exc}", retry_after=exc.delay)
        log.warning(
            "host instance %s: service %r failed entry %d (attempt %d): %s",
            self.id,
            sub.service,
            c.id,
            c.attempts,
            exc,
            extra=self._fields("delivery-failed", c, sub, exc),
        )
        return Failure(c, "".join(traceback.format_exception(exc)))

    def _fields(self, event: str, c: Claim, sub: Subscription, exc: Exception) -> dict[str, Any]:
        """Structured log fields of an event about one queue entry."""
        return {
            "event": event,
            "host_instance": self.id,
            "host": self.host,
            "service": sub.service,
            "subscription": sub.id,
            "entry": c.id,
            "message_id": str(c.msg),
            "attempt": c.attempts,
            "error": f"{type(exc).__name__}: {exc}",
        }

    def _finish(self, done: list[Claim], failed: list[Failure], unstarted: list[Claim]) -> None:
        """Complete, fail and give back a batch in one transaction, retried on error.
        If it cannot be written, the leases expire and the entries are delivered again."""
        if not (done or failed or unstarted):
            return  # every step committed its own outcome (orchestrations)
        stop_subs = self._stop_on_failure()
        pause = 0.05
        for attempt in range(1, FINISH_TRIES + 1):
            try:
                with self.box.store.transaction(serial=True) as conn:
                    result = delivery.finish(
                        conn,
                        self.box.store.dialect,
                        self.id,
                        done,
                        failed,
                        self.settings,
                        stop_subs,
                    )
                    given = delivery.give_back(conn, self.id, unstarted)
                    if given:
                        self.box.store.dialect.notify(conn, [self.host])
                break
            except MessageBoxError as exc:
                if attempt == FINISH_TRIES:
                    log.error(
                        "host instance %s: could not record %d outcomes (%s); their "
                        "entries will be delivered again when the leases expire",
                        self.id,
                        len(done) + len(failed),
                        exc,
                    )
                    return
                time.sleep(pause)
                pause *= 2
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
        if result.stopped_subscriptions:
            log.warning(
                "host instance %s: ordered subscriptions %s stopped after a suspended "
                "message (on_failure=stop); resume or terminate it, then start the service",
                self.id,
                list(result.stopped_subscriptions),
            )
            self._refresh_subscriptions()

    # --- housekeeping ---

    def _housekeeper(self) -> None:
        while not self._stopping.wait(self.settings.heartbeat_seconds):
            try:
                self._beat()
            except MessageBoxError as exc:
                log.error("host instance %s: housekeeping failed: %s", self.id, exc)

    def _beat(self) -> None:
        store = self.box.store
        with store.transaction(serial=True) as conn:
            alive = delivery.heartbeat(conn, store.dialect, self.id, self.settings.lease_seconds)
            if not alive:
                log.warning(
                    "host instance %s was declared dead (no heartbeat for %.0f s); "
                    "re-registering, its leases were released",
                    self.id,
                    self.settings.dead_after_seconds,
                )
                delivery.register(conn, self._info())
        with store.transaction(serial=True) as conn:
            dead, released = delivery.release_dead(
                conn, store.dialect, self.host, self.settings.dead_after_seconds
            )
        if dead or released:
            log.warning(
                "host instance %s: released %d leases of dead instances %s",
                self.id,
                released,
                dead,
            )
            self.wake()
        self._refresh_subscriptions()
        interval = self.settings.cleanup_interval_seconds
        if interval and time.monotonic() - self._last_cleanup >= interval:
            self._last_cleanup = time.monotonic()
            report = self.box.cleanup()
            if report.messages:
                log.info("cleanup: %s", report)

    def _wake_timers(self) -> None:
        self._timer_wake.set()

    def _timers(self) -> None:
        """Fire the host's due timers (service instances' timeouts): sleep until the
        next is due, at most ``poll_max_seconds`` (another process may set one), or
        until a step in this process sets one."""
        store = self.box.store
        while not self._stopping.is_set():
            wait = self.settings.poll_max_seconds
            try:
                with store.transaction() as conn:  # a read: no serial lock while idle
                    due = instances.next_due(conn, self.host)
                if due is not None and due <= 0:
                    with store.transaction(serial=True) as conn:
                        hosts = instances.fire_timers(
                            conn, store.dialect, self.host, clock.now(conn)
                        )
                    if hosts:
                        self.stats.add(timers_fired=sum(hosts.values()))
                        notify.signal(store.key, hosts)
                        continue
                if due is not None:
                    wait = min(wait, max(due, self.settings.poll_min_seconds))
            except MessageBoxError as exc:
                log.error("host instance %s: firing timers failed: %s", self.id, exc)
            self._timer_wake.wait(wait)
            self._timer_wake.clear()
            # steps that set timers wake this loop; look again at most this often
            self._stopping.wait(self.settings.poll_min_seconds)

    def _listener(self) -> None:
        """Wake the workers on NOTIFY from any process (PostgreSQL)."""
        import psycopg

        dialect: Any = self.box.store.dialect
        dsn = dialect.listen_dsn(self.box.store.url)
        while not self._stopping.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("LISTEN messagebox")
                    row = conn.execute("SELECT current_schema()").fetchone()
                    target = f"{row[0] if row else 'public'}/{self.host}"
                    self.wake()  # anything published while not listening
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == target:
                                self.wake()
            except psycopg.Error as exc:
                log.error("host instance %s: LISTEN connection failed: %s", self.id, exc)
                self._stopping.wait(1.0)
