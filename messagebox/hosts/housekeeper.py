"""A host instance's housekeeper thread, every ``heartbeat_seconds``: the heartbeat
(which extends the leases of the entries in flight, and only those), outcomes that
could not be written before or wait for a claim that does not come, the leases of dead
instances of the host, the subscriptions, expired entries, the queue depth's samples
(rollups) and the cleanup job every ``cleanup_interval_seconds``."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from messagebox import upkeep
from messagebox.errors import MessageBoxError
from messagebox.hosts.ahead import ClaimedAhead
from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.flight import InFlight
from messagebox.hosts.idle import Idleness
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.timing import Clock
from messagebox.hosts.wakeups import WakeUps
from messagebox.models import HostSettings, InstanceInfo

if TYPE_CHECKING:
    from messagebox.port import HostBox

EXPIRE_BATCHES = 10
"""Sweep transactions (of ``upkeep.EXPIRY_BATCH`` entries) a heartbeat at most: a backlog of
expired entries takes several beats rather than delaying one."""


class KeepingQueue(Protocol):
    """What housekeeping needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    def heartbeat(
        self, lease_seconds: float, in_flight: Sequence[int], info: InstanceInfo
    ) -> bool: ...

    def release_dead(self, dead_after_seconds: float) -> tuple[list[str], int]: ...

    def expire(self, batch: int = ...) -> upkeep.Swept: ...


class Housekeeper:
    """The housekeeping beat; owns when the depth was last sampled and the cleanup last
    ran."""

    def __init__(
        self,
        box: HostBox,
        queue: KeepingQueue,
        settings: HostSettings,
        parts: tuple[InFlight, ClaimedAhead, OutcomeRecorder, HostSubscriptions],
        waking: tuple[WakeUps, Idleness],
        stats: InstanceStats,
        info: Callable[[], InstanceInfo],
        *,
        clock: Clock,
        stopping: threading.Event,
        events: InstanceLog,
    ) -> None:
        self._box = box
        self._queue = queue
        self._settings = settings
        self._in_flight, self._ahead, self._recorder, self._subscriptions = parts
        self._wakeups, self._idleness = waking
        self._stats = stats
        self._info = info
        self._clock = clock
        self._stopping = stopping
        self._events = events
        self._last_cleanup = clock.monotonic()
        self._last_depth = 0.0

    def run(self) -> None:
        while not self._clock.wait(self._stopping, self._settings.heartbeat_seconds):
            try:
                self.beat()
            except MessageBoxError as exc:
                self._events.store_failed("housekeeping", exc, "housekeeping-failed")

    def beat(self) -> None:
        self._heartbeat()
        if self._recorder.has_unwritten():
            self._recorder.retry_unwritten()
        deferred = self._ahead.take_deferred_outcomes(None)  # no claim came: threads are busy
        if deferred is not None:
            self._recorder.record(deferred)
        self._release_dead()
        self._subscriptions.refresh()
        self._expire()
        if self._clock.monotonic() - self._last_depth >= upkeep.DEPTH_SECONDS:
            self._last_depth = self._clock.monotonic()
            self._box.operations.sample_depth(self._events.host, self._events.instance)
        interval = self._settings.cleanup_interval_seconds
        if interval and self._clock.monotonic() - self._last_cleanup >= interval:
            self._last_cleanup = self._clock.monotonic()
            self._clean_up()

    def _heartbeat(self) -> None:
        lease = self._settings.lease_seconds
        if not self._queue.heartbeat(lease, self._in_flight.entry_ids(), self._info()):
            log.warning(
                "host instance %s was declared dead (no heartbeat for %.0f s); "
                "re-registered, its leases were released",
                self._events.instance,
                self._settings.dead_after_seconds,
                extra=self._events.fields("declared-dead"),
            )

    def _release_dead(self) -> None:
        dead, released = self._queue.release_dead(self._settings.dead_after_seconds)
        if dead or released:
            log.warning(
                "host instance %s: released %d leases of dead instances %s",
                self._events.instance,
                released,
                ", ".join(dead) or "-",
                extra=self._events.fields(
                    "leases-released", released=released, dead_instances=dead
                ),
            )
            self._idleness.found_work()  # not idle: what was released is to be claimed
            self._wakeups.wake()

    def _expire(self) -> None:
        """Sweep the host's expired entries off its queue (suspended or dropped, as
        their subscriptions say), up to :data:`EXPIRE_BATCHES` transactions a beat."""
        total = upkeep.Swept()
        for _ in range(EXPIRE_BATCHES):
            swept = self._queue.expire()
            total.suspended += swept.suspended
            total.dropped += swept.dropped
            if swept.total < upkeep.EXPIRY_BATCH:
                break
        if total.total:
            self._stats.add(expired=total.total)
            log.info(
                "host instance %s: %d entries expired (%d suspended, %d dropped)",
                self._events.instance,
                total.total,
                total.suspended,
                total.dropped,
                extra=self._events.fields(
                    "expired", suspended=total.suspended, dropped=total.dropped
                ),
            )

    def _clean_up(self) -> None:
        report = self._box.cleanup(batch=upkeep.HOST_BATCH, stop=self._stopping.is_set)
        if report.messages:
            log.info(
                "host instance %s: cleanup deleted %d messages, %d parts and %d reference rows",
                self._events.instance,
                report.messages,
                report.parts,
                report.reference_rows,
                extra=self._events.fields("cleanup", **dataclasses.asdict(report)),
            )
