"""How a dequeue thread claims: how many entries (its batch; beyond it, batches for the
other threads where one claim serves them all; a longer ordered run at its handlers'
pace), the claim itself with the outcomes it records in the same transaction, and the
batches it leaves for the other threads (:class:`~messagebox.hosts.dispatch.ClaimedAhead`)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

from messagebox import metrics
from messagebox.claims import Claim
from messagebox.errors import MessageBoxError
from messagebox.hosts.ahead import ClaimedAhead
from messagebox.hosts.cutting import KeyedRests, cut_into_batches
from messagebox.hosts.dispatch import InstanceStats, Pace, Permits, SharedReads
from messagebox.hosts.events import InstanceLog
from messagebox.hosts.flight import InFlight
from messagebox.hosts.recording import OutcomeRecorder
from messagebox.hosts.service import MessageBatch
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.hosts.timing import Clock
from messagebox.hosts.wakeups import WakeUps
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes, Recorded

if TYPE_CHECKING:
    from messagebox.port import HostBox

READ_BATCHES = 16
"""Batches of plain entries of one claim for several threads that read their messages in
one query. On DuckDB, services that read each message's body (``bench.orchestrate``'s
``plain reading``, 4 threads of 50) ran 6.8-7.2k msgs/s reading a batch at a time,
9.3-10.1k four at a time; later, on a faster machine, 23.0-24.6k four at a time, 26.8-30.3k
eight, 28.6-36.6k sixteen. A batch lets go of its messages when it ends (unless another
batch of the read wants them: ``MessageBatch.done``), so the batches of one read hold no
more than each would alone, beside the one chunk of at most ``BATCH_READ_TOTAL`` that a
read brings at a time."""

AHEAD_BATCHES = 4
"""Where claims are serialised in-process (DuckDB), a claim for several threads takes
entries until the instance holds this many batches a thread (elsewhere one, what an
instance held before claiming ahead), or ``max_in_flight`` if less..."""
AHEAD_SECONDS = 0.5
"""...and beyond, up to ``max_in_flight``, only as many entries as its threads finished
in this many seconds lately: entries claimed ahead wait for a thread no longer than
that, at the pace of the instance's handlers (slow handlers are not claimed for deep)."""


class ClaimingQueue(Protocol):
    """What claiming needs of the store (:class:`messagebox.delivery.consumer.Consumer`)."""

    @property
    def claims_serialised(self) -> bool: ...

    def claim(
        self,
        n: int,
        lease_seconds: float,
        *,
        ordered: bool,
        instances: bool,
        outcomes: Outcomes | None = None,
        ordered_most: int | None = None,
        rest_most: int | None = None,
        keyed: int = 0,
        per_key: int = 0,
        keyed_only: bool = False,
    ) -> tuple[list[Claim], Recorded | None]: ...


class Claimer:
    """Claims for the dequeue threads. Owns what sizes a claim (the permits' use, the
    pace of the threads and of ordered runs, the rests of keyed claims) and what one
    claim leaves for the other threads (batches claimed ahead, reads they share)."""

    def __init__(
        self,
        box: HostBox,
        queue: ClaimingQueue,
        settings: HostSettings,
        subscriptions: HostSubscriptions,
        recorder: OutcomeRecorder,
        shared: tuple[Permits, ClaimedAhead, InFlight, WakeUps, InstanceStats],
        *,
        uses_instances: bool,
        stopping: threading.Event,
        clock: Clock,
        events: InstanceLog,
    ) -> None:
        self._box = box
        self._queue = queue
        self._settings = settings
        self._subscriptions = subscriptions
        self._recorder = recorder
        self.permits, self.ahead, self._in_flight, self._wakeups, self._stats = shared
        self._uses_instances = uses_instances
        self._stopping = stopping
        self._events = events
        self.reads = SharedReads()
        """Batches claimed ahead that read their messages together."""
        self._pace = Pace(clock=clock)  # entries the threads finished lately: how deep ahead
        self._run_pace = Pace(clock=clock)  # ordered runs' entries lately: how long a run
        self._keyed_rests = KeyedRests(clock, shared=queue.claims_serialised)
        self._turn = threading.Lock()  # see claim_for_all
        self.drained = False
        """Whether the last claim took fewer entries than it asked for: none left ready
        then (what a hand-over asks: :mod:`messagebox.hosts.handover`)."""

    def begin(self) -> None:
        """Pace from now (the start of the work)."""
        self._pace.begin()
        self._run_pace.begin()

    def handled(self, claims: list[Claim]) -> None:
        """A thread handled this batch (the pace of the threads, of ordered runs)."""
        self._pace.add(len(claims))
        if claims[0].run:
            self._run_pace.add(len(claims))

    def claims_ahead(self) -> bool:
        """Whether one claim takes batches for the other dequeue threads too: where
        claims are serialised in-process (DuckDB), and where the instance runs
        orchestrations (a thread takes many steps together: one read, one load and one
        commit for them all)."""
        return self._queue.claims_serialised or self._uses_instances

    def claim_for_all(self, want: int, outcomes: Outcomes | None, seen: int) -> list[Claim] | None:
        """Claim this thread's batch of up to ``want`` (its permits taken), recording
        ``outcomes`` in the same transaction, and where claims are serialised
        in-process, batches for the other threads too (:class:`ClaimedAhead`). Returns
        this thread's batch, or None when the claim failed (logged; ``outcomes``
        recorded on their own).

        Where claims ahead are not serialised in-process (orchestrations on PostgreSQL),
        this instance's threads claim one at a time: threads claiming at once chose the
        same instance heads, and all but one came back empty. A thread that waited for
        another's claim takes a batch it left instead, if any."""
        if self._queue.claims_serialised or not self._uses_instances:
            return self.claim_now(want, outcomes, seen)
        with self._turn:
            ahead = self.ahead.take()
            if ahead is None:
                return self.claim_now(want, outcomes, seen)
        self.permits.give(want)  # a batch claimed ahead came with its permits
        if outcomes:
            self.ahead.defer_outcomes(outcomes)
        return ahead

    def claim_now(self, want: int, outcomes: Outcomes | None, seen: int) -> list[Claim] | None:
        """Claim for :meth:`claim_for_all`."""
        extra = self._ahead_permits()
        longer = self._run_permits(want + extra)
        taken = want + extra + longer
        try:
            claims = self._claim(taken, outcomes, rest_most=want + extra if longer else None)
        except BaseException as exc:
            self.permits.give(taken)
            if outcomes:  # rolled back with the claim: recorded on their own
                self._recorder.record(outcomes)
            if not isinstance(exc, MessageBoxError):
                raise
            self._events.store_failed("claim", exc, "claim-failed")
            self._wakeups.wait(seen, self._settings.poll_max_seconds)
            return None
        self.permits.give(taken - len(claims))
        self.drained = len(claims) < taken
        if len(claims) <= want:
            if claims:
                self._in_flight.add(claims)
            return claims
        batches = cut_into_batches(claims, self._settings.claim_batch)
        self._share_reads(batches)
        for batch in batches:
            self._in_flight.add(batch)
        self.ahead.put(batches[1:])
        self.permits.recheck_waiters()  # threads waiting for a permit take these instead,
        self._wakeups.wake()  # and idle ones (an empty claim sleeps up to poll_max_seconds)
        return batches[0]

    def only_plain(self) -> bool:
        """Whether every entry of the host is a plain one (no ordered subscription, no
        key, no service instance): then a claim that took fewer entries than it asked
        for left none ready, and only a publish or time makes one ready (a completion
        frees no run, key or instance for the next claim)."""
        subs = self._subscriptions
        return not (subs.any_ordered() or subs.may_name_instances() or subs.keyed_share(1)[0])

    def thread_free(self) -> bool:
        """Whether a dequeue thread is free for another batch (fewer batches in flight,
        waiting ones included, than threads)."""
        return len(self._in_flight) < self._settings.dequeue_threads

    def handed(self, claims: list[Claim]) -> None:
        """Entries a publish in this process leased to this instance as it stored them
        (:mod:`messagebox.hosts.handover`; their permits reserved): batches for the
        threads, as a claim for them all leaves its batches."""
        batches = cut_into_batches(claims, self._settings.claim_batch)
        self._share_reads(batches)
        for batch in batches:
            self._in_flight.add(batch)
        self.ahead.put(batches, handed=True)
        self._stats.add(claimed=len(claims))
        metrics.observe_handed(self._events.host, len(claims))
        self.permits.recheck_waiters()  # a thread waiting for a permit takes them instead
        self._wakeups.wake()

    def _share_reads(self, batches: list[list[Claim]]) -> None:
        """A claim's batches of plain entries read their messages together,
        :data:`READ_BATCHES` at a time: one query for them all, which costs about what
        one for a batch does where claims are serialised (DuckDB), and less than one
        each elsewhere."""
        plain = [b for b in batches if b and b[0].instance_id is None]
        for i in range(0, len(plain), READ_BATCHES):
            group = plain[i : i + READ_BATCHES]
            if len(group) > 1:
                self.reads.share(group, MessageBatch(self._box, [c.msg for b in group for c in b]))

    def _ahead_permits(self) -> int:
        """Permits for entries to claim for the other dequeue threads (where
        :meth:`claims_ahead`): as many as :meth:`_ahead_room` leaves free
        (``max_in_flight`` bounds what the instance holds, as a broker's prefetch count
        does). An ordered run claimed with them stays with the claiming thread
        (:func:`~messagebox.hosts.cutting.cut_into_batches`)."""
        if not self.claims_ahead():
            return 0
        return self.permits.take(self._ahead_room(), self._stopping, wait=False)

    def _run_permits(self, have: int) -> int:
        """Where a claim takes entries for its own thread only (PostgreSQL), permits
        free now for a longer ordered run (:meth:`longest_run`) than ``have`` allows:
        the claim takes them for its run alone, never for plain entries."""
        if self.claims_ahead() or not self._subscriptions.any_ordered():
            return 0
        need = self.longest_run() - have
        return self.permits.take(need, self._stopping, wait=False) if need > 0 else 0

    def _ahead_room(self) -> int:
        """Entries to claim ahead now: up to a floor in flight (:data:`AHEAD_BATCHES`
        batches a thread where claims are serialised in-process; elsewhere one, what an
        instance held before claiming ahead, so that other processes' instances are not
        starved), and beyond (up to ``max_in_flight``) what the threads finished in the
        last :data:`AHEAD_SECONDS` at their recent pace."""
        s = self._settings
        batches = AHEAD_BATCHES if self._queue.claims_serialised else 1
        floor = max(100, batches * s.dequeue_threads * s.claim_batch)
        target = max(floor, int(self._pace.per_second() * AHEAD_SECONDS))
        return max(0, min(target, s.in_flight(ahead=True)) - self.permits.taken())

    def longest_run(self) -> int:
        """The longest ordered run to claim: ``claim_batch``, or as many entries as runs
        were handled in the last :data:`AHEAD_SECONDS` at their recent pace (up to
        ``max_in_flight``). A run is handled by one thread, in order, so a claim's cost
        (several statements, a few milliseconds on DuckDB) is shared by fewer entries
        than a plain batch's (which the other threads' batches share): with runs of 50,
        ordered delivery on DuckDB ran at a tenth of plain delivery. A slow service's
        runs stay at ``claim_batch``. The claim's permits bound it too (on PostgreSQL,
        where a thread claims for itself, those free when it claims:
        :meth:`_run_permits`)."""
        size = self._settings.claim_batch
        paced = int(self._run_pace.per_second() * AHEAD_SECONDS)
        return max(size, min(paced, self._settings.in_flight(ahead=self.claims_ahead())))

    def _claim(self, n: int, outcomes: Outcomes | None, rest_most: int | None) -> list[Claim]:
        """Claim up to ``n`` entries (at most ``rest_most`` besides an ordered run),
        recording ``outcomes`` in the same transaction."""
        started = time.perf_counter()
        ordered = self._subscriptions.any_ordered()
        keyed, keyed_only = self._keyed_rests.share(
            *self._subscriptions.keyed_share(n if rest_most is None else rest_most)
        )
        claims, recorded = self._queue.claim(
            n,
            self._settings.lease_seconds,
            ordered=ordered,
            ordered_most=self.longest_run() if ordered else None,  # one thread's
            instances=self._subscriptions.may_name_instances(),
            outcomes=outcomes or None,
            rest_most=rest_most,
            keyed=keyed,
            per_key=self._settings.claim_batch,
            keyed_only=keyed_only,
        )
        self._keyed_rests.after_claim(keyed, keyed_only, claims)
        if recorded is not None:
            self._recorder.account(recorded)
        seconds = time.perf_counter() - started
        waits = [c.waited for c in claims if c.waited is not None]
        metrics.observe_claim(self._events.host, seconds, waits)
        if claims:
            self._stats.add(
                claimed=len(claims), redelivered=sum(1 for c in claims if c.attempts > 1)
            )
        return claims
