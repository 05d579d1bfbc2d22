"""The parts a host instance is composed of, built together: each is given what it
uses (the box, :class:`messagebox.port.HostBox`; the store's consumer, a
:class:`messagebox.port.HostStore`, typed by what each part calls of it; the clock; the
settings; the shared boards: permits, batches claimed ahead, batches in flight,
wake-ups, counters; callbacks), never the instance."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from messagebox.hosts.ahead import ClaimedAhead
from messagebox.hosts.batch import BatchHandler
from messagebox.hosts.calls import ServiceCalls, Services
from messagebox.hosts.claiming import Claimer
from messagebox.hosts.dequeue import DequeueLoop
from messagebox.hosts.dispatch import InstanceStats, Permits
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.failures import FailureJudge
from messagebox.hosts.flight import InFlight
from messagebox.hosts.handover import HandOver
from messagebox.hosts.housekeeper import Housekeeper
from messagebox.hosts.idle import Idleness, NextDue
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.supervisor import Supervisor
from messagebox.hosts.threads import DequeueThreads
from messagebox.hosts.timers import TimerLoop
from messagebox.hosts.timing import Clock
from messagebox.hosts.wakeups import WakeUps
from messagebox.models import Host, HostSettings, InstanceInfo

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.port import HostBox, HostStore


class Receiver(Protocol):
    """Something a host instance runs beside its dequeue threads: a receive location.

    ``start`` returns at once (the receiver runs on its own threads); ``stop`` stops
    taking input and returns within ``timeout`` seconds, having finished or given back
    what it had taken."""

    def start(self, box: MessageBox, owner: str) -> None: ...

    def stop(self, timeout: float) -> None: ...


def stored_settings(
    stored: Host, overrides: Mapping[str, Any] | None, instance: str
) -> HostSettings:
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


@dataclass(frozen=True)
class Parts:
    """A host instance's parts (see :mod:`messagebox.hosts.instance`)."""

    subscriptions: HostSubscriptions
    wakeups: WakeUps
    in_flight: InFlight
    recorder: OutcomeRecorder
    claimer: Claimer
    batches: BatchHandler
    idleness: Idleness
    dequeue: DequeueLoop
    threads: DequeueThreads
    supervisor: Supervisor
    housekeeper: Housekeeper
    timers: TimerLoop
    workers_ended: threading.Event
    """Set once the dequeue threads have ended (or the stop's time is up)."""
    handover: HandOver | None
    """What publishes in this process hand over (None where the instance runs service
    instances: their claims keep each instance's messages in order)."""

    @classmethod
    def build(
        cls,
        box: HostBox,
        queue: HostStore,
        settings: HostSettings,
        services: Services,
        stats: InstanceStats,
        *,
        clock: Clock,
        events: InstanceLog,
        stopping: threading.Event,
        info: Callable[[], InstanceInfo],
        on_exhausted: Callable[[], None],
    ) -> Parts:
        d = _Delivering.build(box, queue, settings, services, stats, clock, events, stopping)
        idleness = Idleness(queue, clock, busy=lambda: bool(d.ahead) or d.in_flight.busy())
        waiting = (d.wakeups, NextDue(queue.next_available, settings, clock), idleness)
        handover = (
            None if services.uses_instances else _handover(d, settings, events, stopping, clock)
        )
        dequeue = DequeueLoop(
            queue,
            settings,
            d.claimer,
            d.batches,
            d.recorder,
            waiting,
            d.in_flight,
            stopping,
            events,
            handover,
        )
        threads = DequeueThreads(dequeue.run, settings.dequeue_threads, stats, clock, events)
        workers_ended = threading.Event()
        supervisor = Supervisor(
            settings,
            d.batches,
            threads,
            d.recorder,
            d.subscriptions,
            services.flushers,
            stats,
            events,
            clock=clock,
            stopping=stopping,
            workers_ended=workers_ended,
            on_exhausted=on_exhausted,
        )
        housekeeper = Housekeeper(
            box,
            queue,
            settings,
            (d.in_flight, d.ahead, d.recorder, d.subscriptions),
            (d.wakeups, idleness),
            stats,
            info,
            clock=clock,
            stopping=stopping,
            events=events,
        )
        timers = TimerLoop(queue, settings, stats, clock=clock, stopping=stopping, events=events)
        return cls(
            d.subscriptions,
            d.wakeups,
            d.in_flight,
            d.recorder,
            d.claimer,
            d.batches,
            idleness,
            dequeue,
            threads,
            supervisor,
            housekeeper,
            timers,
            workers_ended,
            handover,
        )

    def stop_dequeuing(self, deadline: float) -> bool:
        """Once stopping: take no more hand-overs, wait for the dequeue threads until
        ``deadline`` (whether they ended), then give back the batches claimed ahead or
        handed over that none took."""
        if self.handover is not None:
            self.handover.close(deadline)
        finished = self.threads.join(deadline)
        self.workers_ended.set()
        self.dequeue.give_back_ahead()
        if self.handover is not None:
            self.handover.finish()
            self.dequeue.give_back_ahead()  # handed over since: a publish open past the close
        return finished


@dataclass(frozen=True)
class _Delivering:
    """The parts that claim, deliver and record, and the boards they share."""

    subscriptions: HostSubscriptions
    wakeups: WakeUps
    in_flight: InFlight
    ahead: ClaimedAhead
    recorder: OutcomeRecorder
    claimer: Claimer
    batches: BatchHandler

    @classmethod
    def build(
        cls,
        box: HostBox,
        queue: HostStore,
        settings: HostSettings,
        services: Services,
        stats: InstanceStats,
        clock: Clock,
        events: InstanceLog,
        stopping: threading.Event,
    ) -> _Delivering:
        uses_instances = services.uses_instances
        subs = HostSubscriptions(
            box, events.host, services.handlers, uses_instances=uses_instances, events=events
        )
        wakeups = WakeUps(clock, stopping)
        in_flight = InFlight()
        ahead = ClaimedAhead()
        recorder = OutcomeRecorder(queue, settings, subs, stats, clock, events)
        judge = FailureJudge(settings, subs, stats, events)
        calls = ServiceCalls(
            box, events.instance, services, queue.completing, subs, judge, settings, stats
        )
        claims_ahead = queue.claims_serialised or uses_instances
        permits = Permits(settings.in_flight(ahead=claims_ahead), clock)
        claimer = Claimer(
            box,
            queue,
            settings,
            subs,
            recorder,
            (permits, ahead, in_flight, wakeups, stats),
            uses_instances=uses_instances,
            stopping=stopping,
            clock=clock,
            events=events,
        )
        batches = BatchHandler(
            box,
            queue,
            settings,
            calls,
            judge,
            recorder,
            (in_flight, permits, claimer.reads),
            stopping,
            clock,
            events,
        )
        return cls(subs, wakeups, in_flight, ahead, recorder, claimer, batches)


def _handover(
    d: _Delivering,
    settings: HostSettings,
    events: InstanceLog,
    stopping: threading.Event,
    clock: Clock,
) -> HandOver:
    """What publishes in this process hand the instance over."""
    return HandOver(
        events.instance,
        settings,
        d.claimer,
        stopping,
        clock,
        give_back=lambda claims: d.recorder.record_batch([], [], claims),
    )
