"""A host instance: dequeuing threads that claim entries of one host's queue under a
lease, hand each to its service, and complete or fail it (docs/concepts.md: Hosts).

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
- where it runs service instances, a timer loop; on PostgreSQL, a listener on its own
  connection.

Faults: a handler's exception (``SystemExit`` and ``KeyboardInterrupt`` too) fails its
entry. An entry whose previous delivery ended with no outcome (its process crashed or
was killed) is delivered alone, marked started in storage first: when host processes
have ended while handling it ``max_attempts`` times it is suspended (``crashed-host``),
and entries that were merely claimed alongside it are not charged. A store failure while
a message is read is the engine's: retried without using up an attempt.

The instance is composed of parts, each owning its state, given what it uses (never the
instance): :mod:`~messagebox.hosts.parts` builds them: the dequeue loop
(:mod:`~messagebox.hosts.dequeue`) with the claimer (:mod:`~messagebox.hosts.claiming`)
and the batch handler (:mod:`~messagebox.hosts.batch`, :mod:`~messagebox.hosts.calls`,
:mod:`~messagebox.hosts.failures`), the dequeue threads (:mod:`~messagebox.hosts.threads`),
the supervisor (:mod:`~messagebox.hosts.supervisor`), the housekeeper
(:mod:`~messagebox.hosts.housekeeper`), the timer loop (:mod:`~messagebox.hosts.timers`),
the outcome recorder (:mod:`~messagebox.hosts.recording`), the subscriptions
(:mod:`~messagebox.hosts.subscriptions`), and the wake-ups, batches in flight and
idleness. They read time from one clock (:mod:`~messagebox.hosts.timing`). This module
starts, stops and runs them.

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
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from messagebox import clock
from messagebox.engine import MessageBox, StoreURL
from messagebox.errors import Conflict, HostExhausted, MessageBoxError, ValidationError
from messagebox.hosts import collector, timing
from messagebox.hosts.calls import Services
from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.events import InstanceLog
from messagebox.hosts.parts import Parts, Receiver, stored_settings
from messagebox.models import HostSettings, InstanceInfo
from messagebox.port import HostBox, HostStore

log = logging.getLogger("messagebox.hosts")

STOP_WAIT_MARGIN = 10.0
"""Beyond its ``timeout``, how long a second :meth:`HostInstance.stop` waits for the
stop already running (the store's last writes after the handlers' time)."""
RUN_LOOK_SECONDS = 0.2
"""How often :meth:`HostInstance.run` looks at its ``duration``."""

__all__ = ["HostInstance", "Receiver"]


class HostInstance:
    """One running instance of a host: several processes or machines may run instances
    of the same host (PostgreSQL); each queue entry is handled by exactly one of them.

    ``services`` maps service names (as subscriptions name them) to handlers; see
    :mod:`messagebox.hosts.service`. ``settings`` overrides the host's stored settings for this
    instance only (e.g. ``{"dequeue_threads": 2}``). ``close_box`` closes the box on
    stop (the default when the instance opened it from a URL). ``box`` is a
    :class:`~messagebox.engine.MessageBox`, a URL to open one, or any
    :class:`~messagebox.port.HostBox` (a :class:`~messagebox.memory.MemoryBox`: no
    receive locations there).
    """

    _frozen = False
    """Whether this instance holds the collector's freeze (:mod:`messagebox.hosts.collector`)."""

    def __init__(
        self,
        box: HostBox | StoreURL | None,
        host: str,
        services: Mapping[str, object],
        *,
        settings: Mapping[str, Any] | None = None,
        name: str | None = None,
        close_box: bool | None = None,
        receivers: Sequence[Receiver] = (),
    ) -> None:
        given = isinstance(box, HostBox)
        self._owns_box = not given if close_box is None else close_box
        self.box: HostBox = box if isinstance(box, HostBox) else MessageBox(box)
        self.host = host
        self.id = name or f"{host}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.settings: HostSettings = stored_settings(self.box.host(host), settings, self.id)
        self.queue: HostStore = self.box.consumer(host, self.id)
        """The store as this instance uses it."""
        self._services = Services.of(services)
        self.handlers = self._services.handlers
        self.stats = InstanceStats()
        self.receivers: list[Receiver] = list(receivers)
        """Receive locations this instance runs (started after it registers, stopped
        first)."""
        self.on_stop: list[Callable[[], None]] = []
        """Called once the instance has stopped (closing send ports' connections)."""
        self._clock = timing.current()
        self._events = InstanceLog(self.id, host)
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._stopped = threading.Event()
        """Set when :meth:`stop` has finished (given back, unregistered)."""
        self._started = False
        self._service_threads: list[threading.Thread] = []
        self._unwatch: Callable[[], None] | None = None
        self._parts = Parts.build(
            self.box,
            self.queue,
            self.settings,
            self._services,
            self.stats,
            clock=self._clock,
            events=self._events,
            stopping=self._stopping,
            info=self._info,
            on_exhausted=self._stop_exhausted,
        )

    @property
    def exhausted(self) -> str | None:
        """Why the instance stopped itself: its handlers hung past what its threads can
        take; None while it runs as it should."""
        return self._parts.supervisor.exhausted

    def wake(self) -> None:
        """Wake idle workers (a publish touched this host)."""
        self._parts.wakeups.wake()

    def idle_seconds(self) -> float:
        """How long the instance has had nothing to do (see
        :meth:`messagebox.hosts.idle.Idleness.seconds`)."""
        return self._parts.idleness.seconds()

    def unserved_hint(self, service: str) -> str:
        """What this instance runs instead of ``service``, and the likeliest misspelling."""
        return self._parts.subscriptions.unserved_hint(service)

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

    def start(self) -> HostInstance:
        """Register and start the threads; returns at once."""
        if self._started:
            raise MessageBoxError(f"host instance {self.id} is started already")
        self._started = True
        self._parts.subscriptions.refresh()
        if self.settings.unserved == "refuse":
            self._refuse_unserved()
        for warning in self.queue.register(self._info()):
            log.warning(
                "host instance %s: %s",
                self.id,
                warning,
                extra=self._events.fields("store-warning"),
            )
        self._unwatch = self.queue.watch(self.wake)
        if self._parts.handover is not None:
            self._parts.handover.watch(self.queue)
        self._parts.claimer.begin()  # paced from the start of the work
        self._service_threads = self._service_threads_to_start()
        collector.instance_started()
        self._frozen = True
        self._parts.threads.start()
        for t in self._service_threads:
            t.start()
        self._start_receivers()
        log.info(
            "host instance %s started: %d dequeue threads, claim batch %d",
            self.id,
            self.settings.dequeue_threads,
            self.settings.claim_batch,
            extra=self._events.fields("instance-started"),
        )
        return self

    def _service_threads_to_start(self) -> list[threading.Thread]:
        """The housekeeper, the supervisor, the listener (where the store notifies) and
        the timer loop (where the instance runs service instances)."""
        parts, host = self._parts, self.host
        targets: list[tuple[str, Callable[[], None]]] = [
            ("housekeeper", parts.housekeeper.run),
            ("supervisor", parts.supervisor.run),
        ]
        if self.queue.listens:
            targets.append(("listener", self._listen))
        if self._services.uses_instances:
            parts.timers.watch()
            targets.append(("timers", parts.timers.run))
        return [
            threading.Thread(target=target, name=f"{host}-{name}", daemon=True)
            for name, target in targets
        ]

    def _listen(self) -> None:
        """Wake the workers on wake-ups from other processes (PostgreSQL's NOTIFY)."""
        self.queue.listen(self.wake, self._stopping)

    def _start_receivers(self) -> None:
        box = self.box
        if not self.receivers:
            return
        if not isinstance(box, MessageBox):
            self.stop(5.0)
            raise ValidationError(f"host instance {self.id}: receive locations need a MessageBox")
        for n, r in enumerate(self.receivers):
            try:
                r.start(box, self.id)
            except BaseException:
                for started in reversed(self.receivers[:n]):
                    started.stop(5.0)
                self.receivers = self.receivers[:0]
                self.stop(5.0)
                raise

    def _refuse_unserved(self) -> None:
        """Raise (unstarted) when a subscription of the host names a service this
        instance does not run (the host's ``unserved="refuse"``)."""
        missing = self._parts.subscriptions.unserved()
        if missing:
            self._started = False
            raise Conflict(
                f"host instance of {self.host!r} refuses to start (unserved='refuse'): "
                + "; ".join(
                    f"subscription {s.name!r} routes to service {s.service!r}, which it does "
                    f"not run ({self.unserved_hint(s.service)})"
                    for s in missing
                )
            )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully: no new claims, in-flight work gets ``timeout`` seconds, then
        unregister. Returns False if some handler was still running (its entry will be
        delivered again, by another instance or after a restart)."""
        if not self._started:
            return True
        if self._stopping.is_set():  # stopping in another thread: wait for it to end
            return self._clock.wait(self._stopped, timeout + STOP_WAIT_MARGIN)
        deadline = self._clock.monotonic() + timeout
        self._stop_receivers(deadline)  # take nothing more in before draining
        self._stopping.set()
        self._parts.timers.wake()
        self.wake()
        self._parts.claimer.permits.recheck_waiters()  # a thread waiting for a permit stops
        finished = self._parts.stop_dequeuing(deadline)
        for t in self._service_threads:  # a cleanup ends after its current batch
            t.join(max(deadline - self._clock.monotonic(), 5.0))
        if self._unwatch is not None:
            self._unwatch()
        self._parts.timers.unwatch()
        if self._parts.recorder.has_unwritten():  # known outcomes, not deliveries again
            self._parts.recorder.retry_unwritten()
        released = self._unregister()
        if not finished:
            log.warning(
                "host instance %s: handlers still running after %.1f s; %d entries released "
                "for redelivery",
                self.id,
                timeout,
                released,
                extra=self._events.fields("stopped-with-handlers-running", released=released),
            )
        log.info(
            "host instance %s stopped: %s",
            self.id,
            self.stats.snapshot(),
            extra=self._events.fields("instance-stopped", counts=self.stats.snapshot()),
        )
        self._after_stop()
        return finished

    def _stop_receivers(self, deadline: float) -> None:
        for r in reversed(self.receivers):
            try:
                r.stop(max(deadline - self._clock.monotonic(), 1.0))
            except Exception as exc:
                log.error(
                    "host instance %s: receiver %r failed to stop: %s",
                    self.id,
                    r,
                    exc,
                    extra=self._events.fields("receiver-stop-failed", error=str(exc)),
                )

    def _unregister(self) -> int:
        """Unregister; the entries it released (0 when it could not)."""
        try:
            return self.queue.unregister()
        except MessageBoxError as exc:
            log.error(
                "host instance %s could not unregister: %s",
                self.id,
                exc,
                extra=self._events.fields("unregister-failed", error=str(exc)),
            )
            return 0

    def _after_stop(self) -> None:
        """The ``on_stop`` callbacks, the collector's freeze let go, the box closed
        (where the instance opened it); then the stop is over."""
        for callback in self.on_stop:
            try:
                callback()
            except Exception as exc:
                log.error(
                    "host instance %s: on_stop callback failed: %s",
                    self.id,
                    exc,
                    extra=self._events.fields("on-stop-failed", error=str(exc)),
                )
        if self._frozen:
            self._frozen = False
            collector.instance_stopped()
        if self._owns_box:
            self.box.close()
        self._stopped.set()

    def _stop_exhausted(self) -> None:
        """The supervisor found the instance exhausted: stop it (from a thread of its own,
        :meth:`run` then raising :class:`~messagebox.errors.HostExhausted`)."""
        self._stop_requested.set()
        threading.Thread(target=self.stop, name=f"{self.host}-exhausted", daemon=True).start()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (safe from a signal handler or another thread)."""
        self._stop_requested.set()

    def run(self, *, stop_timeout: float = 30.0, duration: float | None = None) -> None:
        """Start, then block until SIGINT/SIGTERM, :meth:`request_stop` or ``duration``
        seconds; then stop gracefully. Raises :class:`~messagebox.errors.HostExhausted`
        when the instance stopped itself because hung handlers took its threads (see
        ``handler_timeout_seconds``): restart it."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda _s, _f: self.request_stop())
        try:
            self.start()
            deadline = None if duration is None else self._clock.monotonic() + duration
            while not self._clock.wait(self._stop_requested, RUN_LOOK_SECONDS):
                if deadline is not None and self._clock.monotonic() >= deadline:
                    break
        finally:
            self.stop(stop_timeout)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.exhausted is not None:
            raise HostExhausted(self.exhausted)

    def __enter__(self) -> HostInstance:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
