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

Faults: a handler's exception (``SystemExit`` and ``KeyboardInterrupt`` too) fails its
entry. An entry whose previous delivery ended with no outcome (its process crashed or
was killed) is delivered alone, marked started in storage first: when host processes
have ended while handling it ``max_attempts`` times it is suspended (``crashed-host``),
and entries that were merely claimed alongside it are not charged. A store failure while
a message is read is the engine's: retried without using up an attempt.
- on PostgreSQL, a listener on its own connection.

The parts, each a class the next extends: :mod:`messagebox.hosts.core` (state, wake-ups,
outcome recording), :mod:`messagebox.hosts.handling` (handing batches to services),
:mod:`messagebox.hosts.supervision` (the dequeue loop and the service threads), and this
module (start, stop, run).

Stopping is graceful: workers stop claiming, in-flight handlers get ``timeout`` seconds
to finish, claimed entries never handed to a service are given back (their attempt not
counted), and the instance unregisters.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from messagebox.errors import Conflict, HostExhausted, MessageBoxError
from messagebox.hosts import collector
from messagebox.hosts.core import Receiver
from messagebox.hosts.supervision import Supervision
from messagebox.models import State

log = logging.getLogger("messagebox.hosts")

JOIN_SLICE_SECONDS = 0.05
"""How often a stop waiting for a dequeue thread looks again at which are left."""
STOP_WAIT_MARGIN = 10.0
"""Beyond its ``timeout``, how long a second :meth:`HostInstance.stop` waits for the
stop already running (the store's last writes after the handlers' time)."""

__all__ = ["HostInstance", "Receiver"]


class HostInstance(Supervision):
    """One running instance of a host: several processes or machines may run instances
    of the same host (PostgreSQL); each queue entry is handled by exactly one of them.

    ``services`` maps service names (as subscriptions name them) to handlers; see
    :mod:`messagebox.hosts.service`. ``settings`` overrides the host's stored settings for this
    instance only (e.g. ``{"dequeue_threads": 2}``). ``close_box`` closes the box on
    stop (the default when the instance opened it from a URL).
    """

    _frozen = False
    """Whether this instance holds the collector's freeze (:mod:`messagebox.hosts.collector`)."""

    def start(self) -> HostInstance:
        """Register and start the threads; returns at once."""
        if self._started:
            raise MessageBoxError(f"host instance {self.id} is started already")
        self._started = True
        self._refresh_subscriptions()
        if self.settings.unserved == "refuse":
            self._refuse_unserved()
        for warning in self.queue.register(self._info()):
            log.warning(
                "host instance %s: %s",
                self.id,
                warning,
                extra={"event": "store-warning", "host_instance": self.id, "host": self.host},
            )
        self._unwatch = self.queue.watch(self.wake)
        self._pace.begin()  # paced from the start of the work
        self._run_pace.begin()
        for n in range(self.settings.dequeue_threads):
            t = threading.Thread(target=self._worker, name=f"{self.host}-dequeue-{n}", daemon=True)
            self._threads.append(t)
        self._service_threads.append(
            threading.Thread(target=self._housekeeper, name=f"{self.host}-housekeeper", daemon=True)
        )
        self._service_threads.append(
            threading.Thread(target=self._supervisor, name=f"{self.host}-supervisor", daemon=True)
        )
        if self.queue.listens:
            self._service_threads.append(
                threading.Thread(target=self._listener, name=f"{self.host}-listener", daemon=True)
            )
        if self._uses_instances:
            self._unwatch_timers = self.queue.watch_timers(self._wake_timers)
            self._service_threads.append(
                threading.Thread(target=self._timers, name=f"{self.host}-timers", daemon=True)
            )
        collector.instance_started()
        self._frozen = True
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

    def _refuse_unserved(self) -> None:
        """Raise (unstarted) when a subscription of the host names a service this
        instance does not run (the host's ``unserved="refuse"``)."""
        with self._subs_lock:
            missing = [
                s
                for s in self._subs.values()
                if s.service not in self.handlers and s.state is not State.UNENLISTED
            ]
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
            return self._stopped.wait(timeout + STOP_WAIT_MARGIN)
        deadline = time.monotonic() + timeout
        for r in reversed(self.receivers):  # take nothing more in before draining
            try:
                r.stop(max(deadline - time.monotonic(), 1.0))
            except Exception as exc:
                log.error(
                    "host instance %s: receiver %r failed to stop: %s",
                    self.id,
                    r,
                    exc,
                    extra=self._event("receiver-stop-failed", error=str(exc)),
                )
        self._stopping.set()
        self._timer_wake.set()
        self.wake()
        finished = self._join_workers(deadline)
        self._workers_ended.set()
        self._settle_ahead()
        for t in self._service_threads:  # a cleanup ends after its current batch
            t.join(max(deadline - time.monotonic(), 5.0))
        if self._unwatch is not None:
            self._unwatch()
        if self._unwatch_timers is not None:
            self._unwatch_timers()
        if self._pending:  # known outcomes, rather than deliveries again
            self._retry_pending()
        try:
            released = self.queue.unregister()
        except MessageBoxError as exc:
            log.error(
                "host instance %s could not unregister: %s",
                self.id,
                exc,
                extra=self._event("unregister-failed", error=str(exc)),
            )
            released = 0
        if not finished:
            log.warning(
                "host instance %s: handlers still running after %.1f s; %d entries released "
                "for redelivery",
                self.id,
                timeout,
                released,
                extra=self._event("stopped-with-handlers-running", released=released),
            )
        log.info(
            "host instance %s stopped: %s",
            self.id,
            self.stats.snapshot(),
            extra=self._event("instance-stopped", counts=self.stats.snapshot()),
        )
        for callback in self.on_stop:
            try:
                callback()
            except Exception as exc:
                log.error(
                    "host instance %s: on_stop callback failed: %s",
                    self.id,
                    exc,
                    extra=self._event("on-stop-failed", error=str(exc)),
                )
        if self._frozen:
            self._frozen = False
            collector.instance_stopped()
        if self._owns_box:
            self.box.close()
        self._stopped.set()
        return finished

    def _join_workers(self, deadline: float) -> bool:
        """Wait for the dequeue threads to end, until ``deadline``; whether they did. A
        thread whose handler the supervisor abandons meanwhile is not waited for."""
        while True:
            with self._runs_lock:
                live = [t for t in self._threads if t.is_alive()]
            left = deadline - time.monotonic()
            if not live or left <= 0:
                return not live
            live[0].join(min(left, JOIN_SLICE_SECONDS))

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
            deadline = None if duration is None else time.monotonic() + duration
            while not self._stop_requested.wait(0.2):
                if deadline is not None and time.monotonic() >= deadline:
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
