"""How a dequeue thread delivers a claimed batch: one by one or together (batching
services), an ordered subscription's and a key's entries in order (a failure stops the
rest), interrupted entries alone, and its outcomes held with the batch until its
services flush, to record with the thread's next claim."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from messagebox.claims import Claim, Failure
from messagebox.errors import MessageBoxError
from messagebox.hosts.calls import Outcome, ServiceCalls
from messagebox.hosts.dispatch import (
    ALONE,
    ALONE_WAIT_SECONDS,
    Abandoned,
    Permits,
    Run,
    SharedReads,
)
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.failures import FailureJudge
from messagebox.hosts.flight import InFlight
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.service import MessageBatch
from messagebox.hosts.timing import Clock
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes

if TYPE_CHECKING:
    from messagebox.port import HostBox


class StartMarking(Protocol):
    """What delivering needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    def mark_started(self, claims: Sequence[Claim]) -> None: ...


class BatchHandler:
    """Delivers claimed batches; owns the batches in hand (:class:`Run`), which the
    supervisor reads to abandon a handler past its time-out."""

    def __init__(
        self,
        box: HostBox,
        queue: StartMarking,
        settings: HostSettings,
        calls: ServiceCalls,
        judge: FailureJudge,
        recorder: OutcomeRecorder,
        shared: tuple[InFlight, Permits, SharedReads],
        stopping: threading.Event,
        clock: Clock,
        events: InstanceLog,
    ) -> None:
        self._box = box
        self._queue = queue
        self._settings = settings
        self._calls = calls
        self._judge = judge
        self._recorder = recorder
        self._in_flight, self._permits, self._reads = shared
        self._stopping = stopping
        self._clock = clock
        self._events = events
        self._runs: set[Run] = set()
        self._runs_lock = threading.Lock()

    def in_hand(self) -> list[Run]:
        """The batches being delivered now."""
        with self._runs_lock:
            return list(self._runs)

    def handle(self, claims: list[Claim]) -> tuple[bool, Outcomes | None]:
        """Handle a claimed batch. Returns whether this thread goes on (False when the
        supervisor took the batch over, a handler having timed out: the thread then
        ends) and the batch's outcomes when they are left to record with the next claim
        (else they are recorded)."""
        timed = self._settings.handler_timeout_seconds is not None
        run = Run(claims, timed=timed, clock=self._clock)
        with self._runs_lock:
            self._runs.add(run)
        try:
            return True, self._deliver_run(run)
        except Abandoned:
            return False, None
        except BaseException:
            self._salvage(run)
            raise
        finally:
            if not run.abandoned:
                self.release(run)

    def release(self, run: Run) -> None:
        """The batch is over: out of hand and out of flight, its permits given back."""
        with self._runs_lock:
            self._runs.discard(run)
        self._in_flight.remove(run.claims)
        self._permits.give(len(run.claims))
        ALONE.release(run)

    def _salvage(self, run: Run) -> None:
        """After an unexpected error: record what the batch holds and give back what
        it never started."""
        try:
            done, failed = run.take()
            self._recorder.record_batch(done, failed, run.unseen())
        except BaseException as exc:
            log.error(
                "host instance %s: could not record a failed batch: %s",
                self._events.instance,
                exc,
                extra=self._events.fields("record-failed", error=str(exc)),
            )

    def _deliver_run(self, run: Run) -> Outcomes | None:
        """Deliver the batch; returns its outcomes, to record with the next claim (None
        when recorded already, as when stopping)."""
        shared = self._reads.take(run.claims)
        try:
            own = shared or MessageBatch(self._box, [c.msg for c in run.claims])
            return self._deliver_all(run, own)
        finally:
            if shared is not None:  # its messages are let go unless another batch wants them
                shared.done([c.msg for c in run.claims])

    def _deliver_all(self, run: Run, batch: MessageBatch) -> Outcomes | None:
        """:meth:`_deliver_run` with the batch's messages to read from."""
        unstarted: list[Claim] = []
        # ordered subscriptions (key None) and keys whose run stopped at a failure
        blocked: set[tuple[int, str | None]] = set()
        most = self._settings.max_attempts
        # an ordered subscription's entries (and a key's) go one by one, in order, even
        # to a service that takes batches: a failure stops the rest (in a batch, they
        # had been handed over before it was known)
        fresh = [
            c
            for c in run.claims
            if not c.interrupted and c.charges < most and not c.ordered and c.key is None
        ]
        stopping = self._stopping.is_set()
        together = {} if stopping else self._calls.deliver_together(run, fresh, batch)
        # a run longer than a batch a thread (Claimer.longest_run) records its outcomes
        # that many at a time: a crash delivers again no more of it than of the plain
        # batches the instance's threads hold unrecorded
        size = self._settings.claim_batch * self._settings.dequeue_threads
        unrecorded = 0
        for c in run.claims:
            if c.run and unrecorded >= size:
                self._record_held(run)
                unrecorded = 0
            unrecorded += 1
            outcome: Outcome | None
            if c.id in together:
                outcome = together[c.id]
            elif c.charges >= most:
                outcome = self._judge.used_up(c)
                self._calls.hold(run, [(c, outcome)])
            elif self._stopping.is_set() or (c.sub, c.key) in blocked:
                unstarted.append(c)
                continue
            elif c.interrupted:
                outcome = self._deliver_interrupted(run, c, batch)
                if outcome is None:
                    unstarted.append(c)  # given back, still interrupted
            else:
                outcome = self._calls.deliver(run, c, batch)
            if (outcome is None or isinstance(outcome, Failure)) and (
                c.ordered or c.key is not None
            ):
                blocked.add((c.sub, c.key))
        outcomes = self._take_held(run, unstarted)
        if self._stopping.is_set():
            self._recorder.record(outcomes)
            return None
        return outcomes

    def _record_held(self, run: Run) -> None:
        """Record the outcomes the batch holds so far."""
        self._recorder.record(self._take_held(run))

    def _take_held(self, run: Run, unstarted: Sequence[Claim] = ()) -> Outcomes:
        """The outcomes the batch holds so far, taken from it (after its services'
        flush), with the entries it gives back unstarted."""
        done, failed = run.take()
        return self._recorder.outcomes(self._calls.flush(done, failed), failed, unstarted)

    def _deliver_interrupted(self, run: Run, c: Claim, batch: MessageBatch) -> Outcome | None:
        """Deliver an entry whose previous delivery ended with no outcome: alone, one at
        a time per process, marked started in storage first and recorded at once, so
        that a message that makes its host end is charged for it and nothing else is
        (``crashed-host`` past ``max_attempts``). None: not started (another is being
        delivered alone, or stopping); it is given back, still interrupted."""
        self._record_held(run)  # what came before it must not be lost if it ends the process
        if self._stopping.is_set() or not ALONE.acquire(run, ALONE_WAIT_SECONDS, self._clock):
            return None
        try:
            if self._stopping.is_set():
                return None
            try:
                self._queue.mark_started([c])
            except MessageBoxError as exc:
                outcome: Outcome = self._judge.store_failed(c, exc)
                self._calls.hold(run, [(c, outcome)])
            else:
                outcome = self._calls.deliver(run, c, batch)
            self._record_held(run)
            return outcome
        finally:
            ALONE.release(run)
