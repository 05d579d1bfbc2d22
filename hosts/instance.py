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
- a housekeeper: heartbeat (which extends the leases of the entries in flight, and only
  those), writing outcomes that could not be written before, releasing the leases of
  dead instances of the host, refreshing the subscriptions, and running the cleanup job
  every ``cleanup_interval_seconds``.
- a supervisor: abandons a handler past ``handler_timeout_seconds`` (its entry fails,
  the rest of its batch is given back) and replaces a dequeue thread that timed out or
  ended. Python cannot stop a thread: an abandoned handler runs on until it returns,
  and its outcome is then dropped.

Faults: a handler's exception (``SystemExit`` and ``KeyboardInterrupt`` too) fails its
entry. An entry whose previous delivery ended with no outcome (its process crashed or
was killed) is delivered alone, marked started in storage first: when host processes
have ended while handling it ``max_attempts`` times it is suspended (``crashed-host``),
and entries that were merely claimed alongside it are not charged. A store failure while
a message is read is the engine's: retried without using up an attempt.
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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa

from hosts.dispatch import (
    ALONE,
    ALONE_WAIT_SECONDS,
    DONE,
    SETTLED,
    Abandoned,
    Done,
    InstanceStats,
    Pending,
    Permits,
    Run,
    Settled,
)
from hosts.orchestration import timer_channel
from hosts.service import Delivery, Handler, MessageBatch, as_handler
from messagebox import clock, delivery, instances, metrics, notify
from messagebox.delivery import Claim, Failure
from messagebox.engine import MessageBox
from messagebox.errors import (
    BackendUnavailable,
    InstanceCompleted,
    MessageBoxError,
    PermanentFailure,
    RetryLater,
)
from messagebox.models import (
    CRASHED_HOST,
    SUBSCRIPTION_REMOVED,
    HostSettings,
    InstanceInfo,
    Kind,
    OnFailure,
    Subscription,
)

log = logging.getLogger("messagebox.hosts")

FINISH_TRIES = 5


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
        self._permits = Permits(self.settings.max_in_flight)
        self._threads: list[threading.Thread] = []
        """The dequeue threads (one that timed out or failed is replaced here)."""
        self._generation = 0
        self._abandoned: list[threading.Thread] = []
        """Threads whose handler was abandoned and still runs (they end when it returns)."""
        self._runs: set[Run] = set()
        self._runs_lock = threading.Lock()
        self._in_flight: Counter[int] = Counter()
        """Entries claimed and not yet recorded: the only leases heartbeats extend."""
        self._pending: list[Pending] = []
        self._flight_lock = threading.Lock()
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
        self._service_threads.append(
            threading.Thread(target=self._supervisor, name=f"{self.host}-supervisor", daemon=True)
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
        with self._runs_lock:
            workers = list(self._threads)
        for t in workers:  # (abandoned handlers are not waited for)
            t.join(max(deadline - time.monotonic(), 0))
        finished = not any(t.is_alive() for t in workers)
        for t in self._service_threads:
            t.join(5.0)
        if self._unwatch is not None:
            self._unwatch()
        if self._unwatch_timers is not None:
            self._unwatch_timers()
        if self._pending:  # known outcomes, rather than deliveries again
            self._retry_pending()
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
        """A dequeue thread; anything that escapes it is logged, and the supervisor
        starts another in its place."""
        try:
            self._work()
        except BaseException as exc:
            if not self._stopping.is_set():
                log.critical(
                    "host instance %s: dequeue thread %s failed (%s: %s); another takes "
                    "its place, its claimed entries are delivered again",
                    self.id,
                    threading.current_thread().name,
                    type(exc).__name__,
                    exc,
                    exc_info=True,
                    extra={"event": "thread-failed", "host_instance": self.id, "host": self.host},
                )

    def _work(self) -> None:
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
            except BaseException:
                self._permits.give(want)
                raise
            self._permits.give(want - len(claims))
            if not claims:
                self._wait(seen, idle)
                idle = min(idle * 2, self.settings.poll_max_seconds)
                continue
            idle = self.settings.poll_min_seconds
            if not self._handle_batch(claims):
                return  # its handler timed out: another thread has taken this one's place

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
            with self._flight_lock:
                self._in_flight.update(c.id for c in claims)  # Counter: adds one each
            self.stats.add(
                claimed=len(claims), redelivered=sum(1 for c in claims if c.attempts > 1)
            )
        return claims

    def _forget(self, claims: Sequence[Claim]) -> None:
        """These deliveries are over (once per claimed batch): heartbeats stop extending
        their leases. An entry may be in flight twice (delivered again meanwhile)."""
        with self._flight_lock:
            self._in_flight.subtract(c.id for c in claims)
            for c in claims:
                if self._in_flight[c.id] <= 0:
                    del self._in_flight[c.id]

    def _handle_batch(self, claims: list[Claim]) -> bool:
        """Handle a claimed batch and record its outcomes. False when the supervisor
        took the batch over (a handler timed out): this thread then ends."""
        run = Run(claims)
        with self._runs_lock:
            self._runs.add(run)
        try:
            self._handle_run(run)
            return True
        except Abandoned:
            return False
        except BaseException:
            self._salvage(run)
            raise
        finally:
            if not run.abandoned:
                self._release_run(run)

    def _release_run(self, run: Run) -> None:
        with self._runs_lock:
            self._runs.discard(run)
        self._forget(run.claims)
        self._permits.give(len(run.claims))
        ALONE.release(run)

    def _salvage(self, run: Run) -> None:
        """After an unexpected error: record what the batch holds and give back what
        it never started."""
        try:
            done, failed = run.take()
            self._finish(done, failed, run.unseen())
        except BaseException as exc:
            log.error("host instance %s: could not record a failed batch: %s", self.id, exc)

    def _handle_run(self, run: Run) -> None:
        unstarted: list[Claim] = []
        blocked: set[int] = set()  # ordered subscriptions whose run stopped at a failure
        batch = MessageBatch(self.box, [c.msg for c in run.claims])
        most = self.settings.max_attempts
        # an ordered subscription with an interrupted entry here goes one by one, in order
        one_by_one = {c.sub for c in run.claims if c.ordered and c.interrupted}
        fresh = [
            c
            for c in run.claims
            if not c.interrupted and c.charges < most and c.sub not in one_by_one
        ]
        together = {} if self._stopping.is_set() else self._handle_together(run, fresh, batch)
        for c in run.claims:
            outcome: Failure | Settled | Done | None
            if c.id in together:
                outcome = together[c.id]
            elif c.charges >= most:
                outcome = self._used_up(c)
                self._note(run, c, outcome)
            elif self._stopping.is_set() or c.sub in blocked:
                unstarted.append(c)
                continue
            elif c.interrupted:
                outcome = self._handle_alone(run, c, batch)
                if outcome is None:
                    unstarted.append(c)  # given back, still interrupted
                    if c.ordered:
                        blocked.add(c.sub)
                    continue
            else:
                outcome = self._deliver(run, c, batch)
            if isinstance(outcome, Failure) and c.ordered:
                blocked.add(c.sub)
        self._record(run, unstarted)

    def _deliver(self, run: Run, c: Claim, batch: MessageBatch) -> Failure | Settled | Done:
        """Hand one claim to its service; its outcome is held with the batch's."""
        together = self._handle_together(run, [c], batch)
        if c.id in together:
            return together[c.id]
        outcome = self._handle(run, c, batch)
        self._note(run, c, outcome)
        return outcome

    def _note(self, run: Run, c: Claim, outcome: Failure | Settled | Done) -> None:
        if isinstance(outcome, Settled):
            self.stats.add(completed=1)
        run.add(c, outcome)

    def _record(self, run: Run, unstarted: Sequence[Claim] = ()) -> None:
        """Record the outcomes the batch holds so far (after its services' flush)."""
        done, failed = run.take()
        done = self._flush(done, failed)
        self._finish(done, failed, list(unstarted))

    def _handle_alone(
        self, run: Run, c: Claim, batch: MessageBatch
    ) -> Failure | Settled | Done | None:
        """Deliver an entry whose previous delivery ended with no outcome: alone, one at
        a time per process, marked started in storage first and recorded at once, so
        that a message that makes its host end is charged for it and nothing else is
        (``crashed-host`` past ``max_attempts``). None: not started (another is being
        delivered alone, or stopping); it is given back, still interrupted."""
        self._record(run)  # what came before it must not be lost if it ends the process
        if self._stopping.is_set() or not ALONE.acquire(run, ALONE_WAIT_SECONDS):
            return None
        try:
            if self._stopping.is_set():
                return None
            try:
                with self.box.store.transaction(serial=True) as conn:
                    delivery.mark_started(conn, self.id, [c])
            except MessageBoxError as exc:
                outcome: Failure | Settled | Done = self._engine_failure(c, exc)
                self._note(run, c, outcome)
            else:
                outcome = self._deliver(run, c, batch)
            self._record(run)
            return outcome
        finally:
            ALONE.release(run)

    def _used_up(self, c: Claim) -> Failure:
        """An entry charged ``max_attempts`` before this delivery: suspended unseen, as
        ``crashed-host`` when its host ended during its last delivery."""
        if not (c.interrupted and c.crashed_by):  # max_attempts was lowered since
            return Failure(
                c,
                f"it was charged {c.charges} attempts, max_attempts is "
                f"{self.settings.max_attempts}",
                permanent=True,
            )
        self.stats.add(crashed=1)
        error = (
            f"a host process ended while handling it (the last time: instance "
            f"{c.crashed_by}); with its failures that makes {c.charges} attempts, and it "
            "is suspended so that it does not end another"
        )
        log.error(
            "host instance %s: entry %d (message %s): %s",
            self.id,
            c.id,
            c.msg,
            error,
            extra={
                "event": "crashed-host",
                "host_instance": self.id,
                "host": self.host,
                "entry": c.id,
                "message_id": str(c.msg),
                "crashed_by": c.crashed_by,
            },
        )
        return Failure(c, error, permanent=True, reason=CRASHED_HOST)

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
        broken: dict[str, BaseException] = {}
        for service in sorted({sub.service for sub in subs.values()}):
            try:
                self._flushers[service]()
            except BaseException as exc:
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
        self, run: Run, claims: list[Claim], batch: MessageBatch
    ) -> dict[int, Failure | Settled | Done]:
        """Hand the claims of services that take a batch (``handle_many``, as
        orchestrations do: their steps commit in one transaction) to them at once."""
        if not self._batchers:
            return {}
        by_service: dict[str, list[tuple[Claim, Delivery]]] = {}
        for c in claims:
            sub = self._subscription(c.sub)
            if sub is not None and sub.service in self._batchers:
                d = self._delivery(c, sub, batch)
                by_service.setdefault(sub.service, []).append((c, d))
        outcomes: dict[int, Failure | Settled | Done] = {}
        timeout = self.settings.handler_timeout_seconds
        for service, pairs in by_service.items():
            run.begin([c for c, _ in pairs], None if timeout is None else timeout * len(pairs))
            try:
                errors: list[BaseException | None] = list(
                    self._batchers[service]([d for _, d in pairs])
                )
            except BaseException as exc:  # never lose the thread (and strand its claims)
                errors = [exc] * len(pairs)
            run.end()
            for (c, d), error in zip(pairs, errors, strict=True):
                outcome = (
                    (SETTLED if d.settled else DONE)
                    if error is None
                    else self._failure(c, d.subscription, error, d)
                )
                self._note(run, c, outcome)  # held at once: a time-out elsewhere keeps it
                outcomes[c.id] = outcome
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

    def _handle(self, run: Run, c: Claim, batch: MessageBatch) -> Failure | Settled | Done:
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
        run.begin([c], self.settings.handler_timeout_seconds)
        try:
            handler(d)
        except BaseException as exc:  # SystemExit too: a service cannot end its host
            run.end()
            return self._failure(c, sub, exc, d)
        run.end()
        return SETTLED if d.settled else DONE

    def _engine_failure(self, c: Claim, exc: BaseException) -> Failure:
        """The store failed during a delivery: retried, without using up an attempt."""
        self.stats.add(engine_failures=1)
        log.warning(
            "host instance %s: the store failed while delivering entry %d (%s); it is "
            "delivered again, not counted as an attempt",
            self.id,
            c.id,
            exc,
        )
        return Failure(
            c,
            f"{type(exc).__name__}: {exc}",
            charge=False,
            retry_after=min(
                self.settings.retry_backoff_seconds * 2 ** min(c.attempts - 1, 10),
                delivery.MAX_BACKOFF_SECONDS,
            ),
        )

    def _failure(
        self, c: Claim, sub: Subscription, exc: BaseException, d: Delivery | None = None
    ) -> Failure:
        """What a service's exception means for its entry."""
        if isinstance(exc, BackendUnavailable) or (
            d is not None and isinstance(d.storage_error, BackendUnavailable)
        ):
            return self._engine_failure(c, exc)
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
            return Failure(c, f"RetryLater: {exc}", retry_after=exc.delay, charge=False)
        if not isinstance(exc, Exception):
            log.error(
                "host instance %s: service %r raised %s on entry %d (attempt %d): a "
                "service cannot end its host instance; the entry fails",
                self.id,
                sub.service,
                type(exc).__name__,
                c.id,
                c.attempts,
                extra=self._fields("delivery-failed", c, sub, exc),
            )
        else:
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

    def _fields(
        self, event: str, c: Claim, sub: Subscription, exc: BaseException
    ) -> dict[str, Any]:
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

    def _write(
        self,
        done: list[Claim],
        failed: list[Failure],
        unstarted: list[Claim],
        *,
        recheck: bool = False,
    ) -> tuple[delivery.Finished, int]:
        """Complete, fail and give back in one transaction. ``recheck``: only entries
        whose delivery is still the one claimed (outcomes written late)."""
        with self.box.store.transaction(serial=True) as conn:
            if recheck:
                mine = delivery.held(
                    conn,
                    self.box.store.dialect,
                    self.id,
                    [*done, *(f.claim for f in failed), *unstarted],
                )
                done = [c for c in done if c.id in mine]
                failed = [f for f in failed if f.claim.id in mine]
                unstarted = [c for c in unstarted if c.id in mine]
            result = delivery.finish(
                conn,
                self.box.store.dialect,
                self.id,
                done,
                failed,
                self.settings,
                self._stop_on_failure(),
            )
            given = delivery.give_back(conn, self.id, unstarted)
            if given:
                self.box.store.dialect.notify(conn, [self.host])
        return result, given

    def _finish(self, done: list[Claim], failed: list[Failure], unstarted: list[Claim]) -> None:
        """Record a batch's outcomes, retried a few times on error; outcomes that still
        cannot be written are retried by the housekeeper until their leases would have
        lapsed (they are no longer extended: another delivery follows)."""
        if not (done or failed or unstarted):
            return  # every step committed its own outcome (orchestrations)
        pause = 0.05
        for attempt in range(1, FINISH_TRIES + 1):
            try:
                result, given = self._write(done, failed, unstarted)
                break
            except MessageBoxError as exc:
                if attempt == FINISH_TRIES:
                    log.error(
                        "host instance %s: could not record %d outcomes (%s); retrying "
                        "in the background, else delivered again once their leases lapse "
                        "(within %.0f s)",
                        self.id,
                        len(done) + len(failed) + len(unstarted),
                        exc,
                        self.settings.lease_seconds,
                    )
                    with self._flight_lock:
                        self._pending.append(Pending(done, failed, unstarted, time.monotonic()))
                    return
                time.sleep(pause)
                pause *= 2
        self._account(result, given)

    def _account(self, result: delivery.Finished, given: int) -> None:
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

    def _retry_pending(self) -> None:
        """Write the outcomes that could not be written before; give up on those whose
        leases have lapsed by now (they are delivered again)."""
        with self._flight_lock:
            pending, self._pending = self._pending, []
        for p in pending:
            done, failed, unstarted = p.done, p.failed, p.unstarted
            try:
                result, given = self._write(done, failed, unstarted, recheck=True)
            except MessageBoxError as exc:
                if time.monotonic() - p.since < self.settings.lease_seconds:
                    with self._flight_lock:
                        self._pending.append(p)
                else:
                    log.error(
                        "host instance %s: gave up recording %d outcomes (%s); their "
                        "entries are delivered again",
                        self.id,
                        len(done) + len(failed) + len(unstarted),
                        exc,
                    )
                continue
            log.info(
                "host instance %s: recorded %d outcomes that had failed to be written",
                self.id,
                len(done) + len(failed) + len(unstarted),
            )
            self._account(result, given)

    # --- the supervisor ---

    def _supervisor(self) -> None:
        """Abandon handlers past ``handler_timeout_seconds``, and keep
        ``dequeue_threads`` dequeue threads running."""
        timeout = self.settings.handler_timeout_seconds
        interval = min(1.0, timeout / 4) if timeout else 1.0
        while not self._stopping.wait(interval):
            try:
                self._abandon_overdue()
                self._top_up()
            except Exception as exc:  # the supervisor itself must not die
                log.error("host instance %s: supervisor failed: %s", self.id, exc, exc_info=True)

    def _abandon_overdue(self) -> None:
        now = time.monotonic()
        with self._runs_lock:
            runs = list(self._runs)
        for run in runs:
            taken = run.abandon_if_overdue(now)
            if taken is None:
                continue
            with self._runs_lock:
                if run.worker in self._threads:
                    self._threads.remove(run.worker)
                    self._abandoned.append(run.worker)
            try:
                self._settle_abandoned(*taken)
            finally:
                self._release_run(run)

    def _settle_abandoned(
        self,
        timed_out: list[Claim],
        done: list[Claim],
        failed: list[Failure],
        unstarted: list[Claim],
    ) -> None:
        """Record an abandoned batch: its timed-out entries fail, what it had done is
        recorded, what it had not started is given back."""
        seconds = self.settings.handler_timeout_seconds
        with self._subs_lock:  # no lookup in the store here: this must not fail
            subs = dict(self._subs)
        self.stats.add(timed_out=len(timed_out), failed=len(timed_out))
        for c in timed_out:
            sub = subs.get(c.sub)
            service = sub.service if sub is not None else "?"
            log.error(
                "host instance %s: the handler of service %r has not returned entry %d "
                "after %.3g s: it fails; %d unstarted entries of its batch are given back "
                "and another thread takes its place",
                self.id,
                service,
                c.id,
                seconds,
                len(unstarted),
                extra={
                    "event": "handler-timeout",
                    "host_instance": self.id,
                    "host": self.host,
                    "service": service,
                    "entry": c.id,
                    "message_id": str(c.msg),
                },
            )
            failed.append(
                Failure(
                    c,
                    f"TimeoutError: the handler of service {service!r} did not return "
                    f"within {seconds:g} s (handler_timeout_seconds); it was abandoned",
                )
            )
        kept = []
        for c in done:  # a service that makes its work durable at the batch's end
            sub = subs.get(c.sub)
            if sub is not None and sub.service in self._flushers:
                failed.append(
                    Failure(
                        c,
                        "its batch was abandoned before its service made it durable",
                        charge=False,
                        retry_after=0.0,
                    )
                )
            else:
                kept.append(c)
        self._finish(kept, failed, unstarted)

    def _top_up(self) -> None:
        """Replace dequeue threads that failed or whose handler was abandoned. Abandoned
        handlers still running count too, up to ``dequeue_threads`` of them: beyond,
        no thread is added until one returns (a dependency that hangs every call must
        not grow the threads without bound)."""
        with self._runs_lock:
            if self._stopping.is_set():
                return
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            for t in [t for t in self._threads if not t.is_alive()]:
                self._threads.remove(t)
                log.warning("host instance %s: dequeue thread %s ended", self.id, t.name)
            want = self.settings.dequeue_threads
            running = len(self._threads)
            room = min(want - running, 2 * want - running - len(self._abandoned))
            for _ in range(max(room, 0)):
                self._generation += 1
                t = threading.Thread(
                    target=self._worker,
                    name=f"{self.host}-dequeue-r{self._generation}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)
                self.stats.add(threads_replaced=1)
                log.warning("host instance %s: started dequeue thread %s", self.id, t.name)
            if len(self._threads) < want:
                log.error(
                    "host instance %s: %d dequeue threads of %d, %d handlers abandoned "
                    "and still running; no more threads until they return",
                    self.id,
                    len(self._threads),
                    want,
                    len(self._abandoned),
                )

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
            with self._flight_lock:
                in_flight = sorted(self._in_flight)
            alive = delivery.heartbeat(
                conn, store.dialect, self.id, self.settings.lease_seconds, in_flight
            )
            if not alive:
                log.warning(
                    "host instance %s was declared dead (no heartbeat for %.0f s); "
                    "re-registering, its leases were released",
                    self.id,
                    self.settings.dead_after_seconds,
                )
                delivery.register(conn, self._info())
        if self._pending:
            self._retry_pending()
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
