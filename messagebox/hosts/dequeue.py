"""The dequeue loop each dequeue thread runs: take a batch (one claimed ahead for it,
or claim, recording the last batch's outcomes in the same transaction), hand it to
the services, and keep its outcomes for the next claim; when there is nothing, wait
for a wake-up, the next due entry or the back-off."""

from __future__ import annotations

import threading
from typing import Protocol

from messagebox.claims import Claim
from messagebox.hosts.batch import BatchHandler
from messagebox.hosts.claiming import Claimer
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.flight import InFlight
from messagebox.hosts.handover import HandOver
from messagebox.hosts.idle import Idleness, NextDue
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.wakeups import WakeUps
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes, merged


class OutageCount(Protocol):
    """What the loop needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    @property
    def outages(self) -> int: ...


class DequeueLoop:
    """What every dequeue thread runs (:meth:`run`). A thread's own state lives in its
    frame: the outcomes it carries to its next claim and its back-off."""

    def __init__(
        self,
        queue: OutageCount,
        settings: HostSettings,
        claimer: Claimer,
        batches: BatchHandler,
        recorder: OutcomeRecorder,
        waiting: tuple[WakeUps, NextDue, Idleness],
        in_flight: InFlight,
        stopping: threading.Event,
        events: InstanceLog,
        handover: HandOver | None = None,
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._claimer = claimer
        self._batches = batches
        self._recorder = recorder
        self._wakeups, self._next_due, self._idleness = waiting
        self._in_flight = in_flight
        self._stopping = stopping
        self._events = events
        self._handover = handover

    def run(self) -> None:
        """A dequeue thread; anything that escapes it is logged, and the supervisor
        starts another in its place."""
        try:
            self._loop()
        except BaseException as exc:
            if not self._stopping.is_set():
                log.critical(
                    "host instance %s: dequeue thread %s failed (%s: %s); another takes "
                    "its place, its claimed entries are delivered again",
                    self._events.instance,
                    threading.current_thread().name,
                    type(exc).__name__,
                    exc,
                    exc_info=True,
                    extra=self._events.fields("thread-failed"),
                )

    def _loop(self) -> None:
        idle = self._settings.poll_min_seconds
        carry: Outcomes | None = None  # the last batch's, recorded with the next claim
        try:
            while not self._stopping.is_set():
                seen = self._wakeups.seen()
                outages = self._queue.outages  # before this batch's claim
                claims, carry = self._next_batch(carry, seen)
                if claims is None:
                    continue
                if not claims:
                    self._idleness.found_nothing()
                    self._wakeups.wait(seen, self._next_due.wait(idle, seen))  # due sooner?
                    idle = min(idle * 2, self._settings.poll_max_seconds)
                    continue
                idle = self._settings.poll_min_seconds  # in flight now: not idle
                goes_on, carry = self._batches.handle(claims)
                if carry and self._queue.outages != outages:
                    # the store was lost meanwhile: after a failover that lost the last
                    # commits, the claim may be void, and an entry's id another's now
                    self._recorder.record(carry, recheck=True)
                    carry = None
                self._idleness.found_work()  # its outcomes are recorded with the next claim
                self._claimer.handled(claims)
                if not goes_on:
                    return  # its handler timed out: another thread has taken this one's place
                if carry and self._handover and self._handover.claim_needless(seen, self._wakeups):
                    self._recorder.record(carry)  # alone: the claim would find nothing
                    carry = None
                    self._wakeups.wait(seen, idle)  # a publish hands its entries over
        finally:
            if carry:
                self._recorder.record(carry)

    def _next_batch(
        self, carry: Outcomes | None, seen: int
    ) -> tuple[list[Claim] | None, Outcomes | None]:
        """This thread's next batch (empty: the claim found nothing; None: none this
        turn, nothing claimed), and the outcomes it still carries: a batch claimed ahead
        leaves them to the instance's next claim; a claim records them; with no permit
        free they are recorded before the thread waits for one."""
        ahead = self._claimer.ahead
        taken = ahead.take_with_origin()  # claimed by another thread, permits and all
        if taken is not None:
            claims, handed = taken
            if handed:  # no claim need follow: record what waits for one
                waiting = ahead.take_deferred_outcomes(carry)
                if waiting is not None:
                    self._recorder.record(waiting)
            elif carry:
                ahead.defer_outcomes(carry)
            return claims, None
        permits = self._claimer.permits
        want = permits.take(  # a batch claimed ahead needs none
            self._settings.claim_batch,
            self._stopping,
            wait=not carry,
            unless=self._claimer.ahead.__bool__,
        )
        if self._stopping.is_set() or not want:
            permits.give(want)
            if carry:  # no permit free now: record it before waiting for one
                self._recorder.record(carry)
            return None, None
        outcomes = self._claimer.ahead.take_deferred_outcomes(carry)
        with self._in_flight.claiming():
            return self._claimer.claim_for_all(want, outcomes, seen), None

    def give_back_ahead(self) -> None:
        """At the end: give back the batches claimed ahead that no thread took, and
        record the outcomes deferred to a next claim that will not come."""
        batches, deferred = self._claimer.ahead.drain()
        for batch in batches:
            self._claimer.reads.take(batch)
            self._in_flight.remove(batch)
            self._claimer.permits.give(len(batch))
        unstarted = [c for batch in batches for c in batch]
        if unstarted:
            deferred = [*deferred, self._recorder.outcomes([], [], unstarted)]
        outcomes = merged(deferred)
        if outcomes is not None:
            self._recorder.record(outcomes)
