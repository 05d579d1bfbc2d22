"""A host instance's supervisor thread: it abandons handlers past
``handler_timeout_seconds`` (their entries fail, the rest of their batch is given back)
and keeps ``dequeue_threads`` dequeue threads running; when hung handlers have taken
every thread it may start, it stops the instance (exhausted), to be restarted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Protocol

from messagebox.claims import Claim, Failure
from messagebox.hosts.dispatch import InstanceStats, Run
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.threads import DequeueThreads
from messagebox.hosts.timing import Clock
from messagebox.models import HostSettings


class RunsInHand(Protocol):
    """The batches being delivered (:class:`~messagebox.hosts.batch.BatchHandler`)."""

    def in_hand(self) -> list[Run]: ...

    def release(self, run: Run) -> None: ...


class Supervisor:
    """Watches the batches in hand and the dequeue threads; owns why the instance
    stopped itself (:attr:`exhausted`)."""

    def __init__(
        self,
        settings: HostSettings,
        batches: RunsInHand,
        threads: DequeueThreads,
        recorder: OutcomeRecorder,
        subscriptions: HostSubscriptions,
        flushing: Collection[str],
        stats: InstanceStats,
        events: InstanceLog,
        *,
        clock: Clock,
        stopping: threading.Event,
        workers_ended: threading.Event,
        on_exhausted: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._batches = batches
        self._threads = threads
        self._recorder = recorder
        self._subscriptions = subscriptions
        self._flushing = flushing
        """Services that make their work durable at a batch's end (``flush``)."""
        self._stats = stats
        self._events = events
        self._clock = clock
        self._stopping = stopping
        self._workers_ended = workers_ended
        self._on_exhausted = on_exhausted
        self.exhausted: str | None = None
        """Why the instance stopped itself: its handlers hung past what its threads can
        take (:meth:`_stop_exhausted`); None while it runs as it should."""

    def run(self) -> None:
        """Abandon handlers past ``handler_timeout_seconds``, and keep
        ``dequeue_threads`` dequeue threads running. While the instance stops, handlers
        are still abandoned at their time-out (their entries fail, charged, rather than
        wait out the stop and come back as a crashed delivery), until the dequeue
        threads have ended."""
        timeout = self._settings.handler_timeout_seconds
        interval = min(1.0, timeout / 4) if timeout else 1.0
        while not self._clock.wait(self._workers_ended, interval):
            try:
                self._abandon_overdue()
                if not self._stopping.is_set():
                    self._keep_threads_running()
            except Exception as exc:  # the supervisor itself must not die
                log.error(
                    "host instance %s: supervisor failed: %s",
                    self._events.instance,
                    exc,
                    exc_info=True,
                    extra=self._events.fields("supervisor-failed", error=str(exc)),
                )

    def _abandon_overdue(self) -> None:
        now = self._clock.monotonic()
        for run in self._batches.in_hand():
            taken = run.abandon_if_overdue(now)
            if taken is None:
                continue
            self._threads.abandon(run.worker)
            try:
                self._record_abandoned(*taken)
            finally:
                self._batches.release(run)

    def _record_abandoned(
        self,
        timed_out: list[Claim],
        done: list[Claim],
        failed: list[Failure],
        unstarted: list[Claim],
    ) -> None:
        """Record an abandoned batch: its timed-out entries fail, what it had done is
        recorded, what it had not started is given back."""
        seconds = self._settings.handler_timeout_seconds
        subs = self._subscriptions.known()  # no lookup in the store here: this must not fail
        self._stats.add(timed_out=len(timed_out), failed=len(timed_out))
        for c in timed_out:
            sub = subs.get(c.sub)
            service = sub.service if sub is not None else "?"
            log.error(
                "host instance %s: the handler of service %r has not returned entry %d "
                "after %.3g s: it fails; %d unstarted entries of its batch are given back "
                "and another thread takes its place",
                self._events.instance,
                service,
                c.id,
                seconds,
                len(unstarted),
                extra=self._events.fields(
                    "handler-timeout", service=service, entry=c.id, message_id=str(c.msg)
                ),
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
            if sub is not None and sub.service in self._flushing:
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
        self._recorder.record_batch(kept, failed, unstarted)

    def _keep_threads_running(self) -> None:
        """Replace dequeue threads that failed or whose handler was abandoned; when
        abandoned handlers still running leave no thread to start, stop the instance
        (:meth:`_stop_exhausted`) rather than live on delivering less, or nothing."""
        short = self._threads.replace_ended(self._stopping)
        if short is not None:
            self._stop_exhausted(*short)

    def _stop_exhausted(self, want: int, abandoned: int) -> None:
        """Stop the instance, loudly, because its hung handlers have taken every thread
        it may start: claims stop, the entries in hand are given back, it unregisters,
        and ``HostInstance.run`` (``messagebox host run``) ends with an error, so that
        whatever supervises the process starts it again (which is what frees hung
        threads)."""
        if self.exhausted is not None:
            return
        self.exhausted = (
            f"host instance {self._events.instance}: {abandoned} handlers abandoned past "
            f"handler_timeout_seconds ({self._settings.handler_timeout_seconds} s) are "
            f"still running, and {want} dequeue threads is all it may add: it stops, "
            "giving its entries back, to be restarted"
        )
        log.critical(
            self.exhausted,
            extra=self._events.fields("instance-exhausted", abandoned=abandoned, wanted=want),
        )
        self._on_exhausted()
