"""Recording a host instance's outcomes (one transaction a batch, tried again a few
times), counting what recording did, and keeping what cannot be written yet, for the
housekeeper to try again until the entries' leases would have lapsed."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from messagebox.claims import Claim, Failure
from messagebox.errors import MessageBoxError
from messagebox.hosts.dispatch import InstanceStats, Pending
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.timing import Clock
from messagebox.models import HostSettings
from messagebox.order_keys import describe
from messagebox.outcomes import Outcomes, Recorded

RECORD_TRIES = 5
"""Tries to record a batch's outcomes before they are left to the housekeeper."""
FIRST_PAUSE_SECONDS = 0.05
"""The pause after the first failed try, doubled after each one."""


class RecordingQueue(Protocol):
    """What recording needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> Recorded: ...


class OutcomeRecorder:
    """Writes outcomes; owns those that could not be written yet (:meth:`retry_unwritten`)."""

    def __init__(
        self,
        queue: RecordingQueue,
        settings: HostSettings,
        subscriptions: HostSubscriptions,
        stats: InstanceStats,
        clock: Clock,
        events: InstanceLog,
    ) -> None:
        self._queue = queue
        self._settings = settings
        self._subscriptions = subscriptions
        self._stats = stats
        self._clock = clock
        self._events = events
        self._lock = threading.Lock()
        self._unwritten: list[Pending] = []

    def outcomes(
        self, done: Sequence[Claim], failed: Sequence[Failure], unstarted: Sequence[Claim]
    ) -> Outcomes:
        """A batch's outcomes, to record."""
        stop_on_failure = self._subscriptions.stopping_on_failure()
        return Outcomes(done, failed, unstarted, self._settings, stop_on_failure)

    def record_batch(
        self, done: list[Claim], failed: list[Failure], unstarted: list[Claim]
    ) -> None:
        """Record a batch's outcomes (:meth:`record`)."""
        self.record(self.outcomes(done, failed, unstarted))

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> None:
        """Record outcomes, tried again a few times; those that still cannot be written
        are kept for :meth:`retry_unwritten` (their leases are no longer extended:
        another delivery follows). ``recheck``: only those of entries still leased for
        the delivery claimed (the store may have been lost since the claim); after a
        failed try, always."""
        if not outcomes:
            return  # every step committed its own outcome (orchestrations)
        pause = FIRST_PAUSE_SECONDS
        for attempt in range(1, RECORD_TRIES + 1):
            try:
                recorded = self._queue.record(outcomes, recheck=recheck)
                break
            except MessageBoxError as exc:
                recheck = True
                if attempt == RECORD_TRIES:
                    self._keep_unwritten(outcomes, exc)
                    return
                self._clock.sleep(pause)
                pause *= 2
        self.account(recorded)

    def _keep_unwritten(self, outcomes: Outcomes, exc: MessageBoxError) -> None:
        log.error(
            "host instance %s: could not record %d outcomes (%s); retrying "
            "in the background, else delivered again once their leases lapse "
            "(within %.0f s)",
            self._events.instance,
            outcomes.size,
            exc,
            self._settings.lease_seconds,
            extra=self._events.fields("record-failed", count=outcomes.size, error=str(exc)),
        )
        with self._lock:
            self._unwritten.append(Pending(outcomes, self._clock.monotonic()))

    def has_unwritten(self) -> bool:
        return bool(self._unwritten)

    def retry_unwritten(self) -> None:
        """Write the outcomes that could not be written before; give up on those whose
        leases have lapsed by now (they are delivered again)."""
        with self._lock:
            unwritten, self._unwritten = self._unwritten, []
        for p in unwritten:
            try:
                recorded = self._queue.record(p.outcomes, recheck=True)
            except MessageBoxError as exc:
                if self._clock.monotonic() - p.since < self._settings.lease_seconds:
                    with self._lock:
                        self._unwritten.append(p)
                else:
                    log.error(
                        "host instance %s: gave up recording %d outcomes (%s); their "
                        "entries are delivered again",
                        self._events.instance,
                        p.outcomes.size,
                        exc,
                        extra=self._events.fields(
                            "outcomes-abandoned", count=p.outcomes.size, error=str(exc)
                        ),
                    )
                continue
            log.info(
                "host instance %s: recorded %d outcomes that had failed to be written",
                self._events.instance,
                p.outcomes.size,
                extra=self._events.fields("outcomes-recorded-late", count=p.outcomes.size),
            )
            self.account(recorded)

    def account(self, recorded: Recorded) -> None:
        """Count what recording did; log what it suspended, held or stopped."""
        result, given = recorded.finished, recorded.given
        self._stats.add(
            completed=result.completed,
            retried=result.retried,
            suspended=result.suspended,
            lost_leases=result.lost,
            given_back=given,
        )
        instance = self._events.instance
        if result.suspended:
            log.warning(
                "host instance %s: suspended %d entries",
                instance,
                result.suspended,
                extra=self._events.fields("suspended", count=result.suspended),
            )
        if result.held_keys:
            log.warning(
                "host instance %s: keys held after a suspended message (ordered_by, "
                "on_failure=stop): %s; resume or terminate it to release its key",
                instance,
                ", ".join(f"{describe(k)} of subscription {sub}" for sub, k in result.held_keys),
                extra=self._events.fields(
                    "keys-held", keys=[[sub, describe(k)] for sub, k in result.held_keys]
                ),
            )
        if result.stopped_subscriptions:
            log.warning(
                "host instance %s: ordered subscriptions %s stopped after a suspended "
                "message (on_failure=stop); resume or terminate it, then start the service",
                instance,
                ", ".join(map(str, result.stopped_subscriptions)),
                extra=self._events.fields(
                    "subscriptions-stopped", subscriptions=list(result.stopped_subscriptions)
                ),
            )
            self._subscriptions.refresh()
