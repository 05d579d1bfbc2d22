"""A host instance's threads other than the handlers: the dequeue loop (claim, handle,
record), the supervisor (handler time-outs, replacing dead threads), the housekeeper
(heartbeats, pending outcomes, dead instances, cleanup), the timer loop and the
listener (wake-ups from other processes)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time

from messagebox import clock, metrics, upkeep
from messagebox.claims import Claim, Failure, in_claim_order
from messagebox.errors import (
    MessageBoxError,
)
from messagebox.hosts.handling import Handling
from messagebox.hosts.service import MessageBatch
from messagebox.outcomes import Outcomes, merged

log = logging.getLogger("messagebox.hosts")

STEP_BATCHES = 16
"""Where one claim serves several threads (DuckDB; orchestrations on PostgreSQL), its
orchestration steps go to a thread together, up to this many ``claim_batch`` at a time:
one read, one load and one commit for them all (at 4 threads of 50,
``bench.orchestrate`` on DuckDB: split by ``claim_batch``, 829 steps/s; up to 4
batches, 1,564; on a faster machine, up to 4 gave 3,800-4,300 and up to 16, with claims
ahead at the handlers' pace, 5,100-6,500. On PostgreSQL, alternating five runs each:
a batch a thread, 1,309-2,102 steps/s (median 1,493); claims ahead at the handlers'
pace and up to 16 batches, 2,511-3,593 (2,975)). Their messages are
read together, a chunk of ``hosts.service.BATCH_READ_TOTAL`` bytes at a time."""

READ_BATCHES = 16
"""Batches of plain entries of one claim for several threads that read their messages in
one query. On DuckDB, services that read each message's body (``bench.orchestrate``'s
``plain reading``, 4 threads of 50) ran 6.8-7.2k msgs/s reading a batch at a time,
9.3-10.1k four at a time; later, on a faster machine, 23.0-24.6k four at a time, 26.8-30.3k
eight, 28.6-36.6k sixteen. A batch lets go of its messages when it ends (unless another
batch of the read wants them: ``MessageBatch.done``), so the batches of one read hold no
more than each would alone, beside the one chunk of at most ``BATCH_READ_TOTAL`` that a
read brings at a time."""

TIMERS_LOOK_SECONDS = 60.0
"""Where every timer is set by a step in this process (DuckDB: one process), which
wakes the timer loop when it sets one due sooner than the loop looks, the loop looks
at the timers at most this long apart (rather than every ``poll_max_seconds``): a look
cost a statement, 11% of the statement time of a ``bench.orchestrate`` run that set no
timers."""

AHEAD_BATCHES = 4
"""Where claims are serialised in-process (DuckDB), a claim for several threads takes
entries until the instance holds this many batches a thread (elsewhere one, what an
instance held before claiming ahead), or ``max_in_flight`` if less..."""
AHEAD_SECONDS = 0.5
"""...and beyond, up to ``max_in_flight``, only as many entries as its threads finished
in this many seconds lately: entries claimed ahead wait for a thread no longer than
that, at the pace of the instance's handlers (slow handlers are not claimed for deep)."""


class Supervision(Handling):
    """The dequeue loop and the service threads."""

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
        carry: Outcomes | None = None  # the last batch's, recorded with the next claim
        try:
            while not self._stopping.is_set():
                with self._wake_cond:
                    seen = self._wakes
                outages = self.queue.outages  # before this batch's claim
                claims = self._ahead.take()  # claimed by another thread, permits and all
                if claims is not None:
                    if carry:
                        self._ahead.owe(carry)
                        carry = None
                else:
                    want = self._permits.take(  # a batch claimed ahead needs none
                        self.settings.claim_batch,
                        self._stopping,
                        wait=not carry,
                        unless=self._ahead.__bool__,
                    )
                    if self._stopping.is_set() or not want:
                        self._permits.give(want)
                        if carry:  # no permit free now: record it before waiting for one
                            self._finish_outcomes(carry)
                            carry = None
                        continue
                    outcomes, carry = self._ahead.owed_with(carry), None
                    with self._flight_lock:
                        self._claiming += 1
                    try:
                        claims = self._claim_for_all(want, outcomes, seen)
                    finally:
                        with self._flight_lock:
                            self._claiming -= 1
                    if claims is None:
                        continue
                if not claims:
                    self._found_nothing()
                    self._wait(seen, self._next_due.wait(idle, seen))  # an entry due sooner
                    idle = min(idle * 2, self.settings.poll_max_seconds)
                    continue
                idle = self.settings.poll_min_seconds  # in flight now: not idle
                goes_on, carry = self._handle_batch(claims)
                if carry and self.queue.outages != outages:
                    # the store was lost meanwhile: after a failover that lost the last
                    # commits, the claim may be void, and an entry's id another's now
                    self._finish_outcomes(carry, recheck=True)
                    carry = None
                self._found_work()  # its outcomes are recorded with the next claim
                self._pace.add(len(claims))
                if claims[0].run:
                    self._run_pace.add(len(claims))
                if not goes_on:
                    return  # its handler timed out: another thread has taken this one's place
        finally:
            if carry:
                self._finish_outcomes(carry)

    def _claim_for_all(self, want: int, outcomes: Outcomes | None, seen: int) -> list[Claim] | None:
        """Claim this thread's batch of up to ``want`` (its permits taken), recording
        ``outcomes`` in the same transaction, and where claims are serialised
        in-process, batches for the other threads too (:class:`Ahead`). Returns this
        thread's batch, or None when the claim failed (logged; ``outcomes`` recorded on
        their own).

        Where claims ahead are not serialised in-process (orchestrations on PostgreSQL),
        this instance's threads claim one at a time: threads claiming at once chose the
        same instance heads, and all but one came back empty. A thread that waited for
        another's claim takes a batch it left instead, if any."""
        if self.queue.claims_serialised or not self._uses_instances:
            return self._claim_now(want, outcomes, seen)
        with self._claim_turn:
            ahead = self._ahead.take()
            if ahead is None:
                return self._claim_now(want, outcomes, seen)
        self._permits.give(want)  # a batch claimed ahead came with its permits
        if outcomes:
            self._ahead.owe(outcomes)
        return ahead

    def _claim_now(self, want: int, outcomes: Outcomes | None, seen: int) -> list[Claim] | None:
        """Claim for :meth:`_claim_for_all`."""
        extra = self._ahead_permits()
        longer = self._run_permits(want + extra)
        try:
            claims = self._claim(
                want + extra + longer, outcomes, rest_most=want + extra if longer else None
            )
        except BaseException as exc:
            self._permits.give(want + extra + longer)
            if outcomes:  # rolled back with the claim: recorded on their own
                self._finish_outcomes(outcomes)
            if not isinstance(exc, MessageBoxError):
                raise
            self._store_failed("claim", exc, "claim-failed")
            self._wait(seen, self.settings.poll_max_seconds)
            return None
        self._permits.give(want + extra + longer - len(claims))
        if len(claims) <= want:
            if claims:
                self._fly(claims)
            return claims
        batches = self._batches(claims)
        self._share_reads(batches)
        for batch in batches:
            self._fly(batch)
        self._ahead.put(batches[1:])
        self._permits.nudge()  # threads waiting for a permit take these instead,
        self.wake()  # and idle ones (an empty claim of theirs sleeps up to poll_max_seconds)
        return batches[0]

    def _batches(self, claims: list[Claim]) -> list[list[Claim]]:
        """A claim for several threads cut into their batches: an ordered run (at most
        :meth:`_run_most` entries) alone first, for the claiming
        thread, which handles it in order; keyed runs, each key's whole in one batch
        (:func:`_key_batches`); entries of service instances (orchestration
        steps) together, up to :data:`STEP_BATCHES` batches' worth; then the others in
        batches of ``claim_batch``."""
        size = self.settings.claim_batch
        run = [c for c in claims if c.run]
        if run:
            claims = [c for c in claims if not c.run]
        keyed = [c for c in claims if c.key is not None]
        if keyed:
            claims = [c for c in claims if c.key is None]
        steps = [c for c in claims if c.instance_id is not None]
        rest = [c for c in claims if c.instance_id is None] if steps else claims
        most = STEP_BATCHES * size
        return (
            ([run] if run else [])
            + _key_batches(keyed, size)
            + [steps[i : i + most] for i in range(0, len(steps), most)]
            + [rest[i : i + size] for i in range(0, len(rest), size)]
        )

    def _share_reads(self, batches: list[list[Claim]]) -> None:
        """A claim's batches of plain entries read their messages together,
        :data:`READ_BATCHES` at a time: one query for them all, which costs about what
        one for a batch does where claims are serialised (DuckDB), and less than one
        each elsewhere."""
        plain = [b for b in batches if b and b[0].instance_id is None]
        for i in range(0, len(plain), READ_BATCHES):
            group = plain[i : i + READ_BATCHES]
            if len(group) > 1:
                self._reads.share(group, MessageBatch(self.box, [c.msg for b in group for c in b]))

    def _ahead_permits(self) -> int:
        """Permits for entries to claim for the other dequeue threads (where
        :meth:`_claims_ahead`): as many as :meth:`_ahead_room` leaves free
        (``max_in_flight`` bounds what the instance holds, as a broker's prefetch count
        does). An ordered run claimed with them stays with the claiming thread
        (:meth:`_batches`)."""
        if not self._claims_ahead():
            return 0
        return self._permits.take(self._ahead_room(), self._stopping, wait=False)

    def _run_permits(self, have: int) -> int:
        """Where a claim takes entries for its own thread only (PostgreSQL), permits
        free now for a longer ordered run (:meth:`_run_most`) than ``have`` allows:
        the claim takes them for its run alone, never for plain entries."""
        if self._claims_ahead() or not self._has_ordered():
            return 0
        need = self._run_most() - have
        return self._permits.take(need, self._stopping, wait=False) if need > 0 else 0

    def _ahead_room(self) -> int:
        """Entries to claim ahead now: up to a floor in flight (:data:`AHEAD_BATCHES`
        batches a thread where claims are serialised in-process; elsewhere one, what an
        instance held before claiming ahead, so that other processes' instances are not
        starved), and beyond (up to ``max_in_flight``) what the threads finished in the
        last :data:`AHEAD_SECONDS` at their recent pace."""
        s = self.settings
        batches = AHEAD_BATCHES if self.queue.claims_serialised else 1
        floor = max(100, batches * s.dequeue_threads * s.claim_batch)
        target = max(floor, int(self._pace.per_second() * AHEAD_SECONDS))
        return max(0, min(target, s.in_flight(ahead=True)) - self._permits.taken())

    def _run_most(self) -> int:
        """The longest ordered run to claim: ``claim_batch``, or as many entries as runs
        were handled in the last :data:`AHEAD_SECONDS` at their recent pace (up to
        ``max_in_flight``). A run is handled by one thread, in order, so a claim's cost
        (several statements, a few milliseconds on DuckDB) is shared by fewer entries
        than a plain batch's (which the other threads' batches share): with runs of 50,
        ordered delivery on DuckDB ran at a tenth of plain delivery. A slow service's
        runs stay at ``claim_batch``. The claim's permits bound it too (on PostgreSQL,
        where a thread claims for itself, those free when it claims:
        :meth:`_run_permits`)."""
        size = self.settings.claim_batch
        paced = int(self._run_pace.per_second() * AHEAD_SECONDS)
        return max(size, min(paced, self.settings.in_flight(ahead=self._claims_ahead())))

    def _claim(
        self, n: int, outcomes: Outcomes | None = None, rest_most: int | None = None
    ) -> list[Claim]:
        """Claim up to ``n`` entries (at most ``rest_most`` besides an ordered run),
        recording ``outcomes`` in the same transaction."""
        started = time.perf_counter()
        ordered = self._has_ordered()
        keyed, keyed_only = self._keyed_claim(n if rest_most is None else rest_most)
        claims, recorded = self.queue.claim(
            n,
            self.settings.lease_seconds,
            ordered=ordered,
            ordered_most=self._run_most() if ordered else None,  # one thread's (_batches)
            instances=self._has_instances(),
            outcomes=outcomes or None,
            rest_most=rest_most,
            keyed=keyed,
            per_key=self.settings.claim_batch,
            keyed_only=keyed_only,
        )
        self._keyed_claimed(keyed, keyed_only, claims)
        if recorded is not None:
            self._account(recorded)
        seconds = time.perf_counter() - started
        waits = [c.waited for c in claims if c.waited is not None]
        metrics.observe_claim(self.host, seconds, waits)
        if claims:
            self.stats.add(
                claimed=len(claims), redelivered=sum(1 for c in claims if c.attempts > 1)
            )
        return claims

    def _fly(self, claims: list[Claim]) -> None:
        """A batch is in flight until ``_forget(claims)``: heartbeats extend its leases."""
        with self._flight_lock:
            self._in_flight[id(claims)] = claims

    def _settle_ahead(self) -> None:
        """At the end: give back the batches claimed ahead that no thread took, and
        record the outcomes owed to a next claim that will not come."""
        batches, owed = self._ahead.drain()
        for batch in batches:
            self._reads.take(batch)
            self._forget(batch)
            self._permits.give(len(batch))
        unstarted = [c for batch in batches for c in batch]
        outcomes = merged([*owed, self._outcomes([], [], unstarted)] if unstarted else owed)
        if outcomes is not None:
            self._finish_outcomes(outcomes)

    def _supervisor(self) -> None:
        """Abandon handlers past ``handler_timeout_seconds``, and keep
        ``dequeue_threads`` dequeue threads running. While the instance stops, handlers
        are still abandoned at their time-out (their entries fail, charged, rather than
        wait out the stop and come back as a crashed delivery), until the dequeue
        threads have ended."""
        timeout = self.settings.handler_timeout_seconds
        interval = min(1.0, timeout / 4) if timeout else 1.0
        while not self._workers_ended.wait(interval):
            try:
                self._abandon_overdue()
                if not self._stopping.is_set():
                    self._top_up()
            except Exception as exc:  # the supervisor itself must not die
                log.error(
                    "host instance %s: supervisor failed: %s",
                    self.id,
                    exc,
                    exc_info=True,
                    extra=self._event("supervisor-failed", error=str(exc)),
                )

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
        handlers still running count too, up to ``dequeue_threads`` of them: one more,
        and the instance has no thread left to give (Python cannot stop one, and a
        dependency that hangs every call must not grow the threads without bound), so
        it stops itself (:meth:`_exhaust`) rather than live on delivering less, or
        nothing."""
        with self._runs_lock:
            if self._stopping.is_set():
                return
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            for t in [t for t in self._threads if not t.is_alive()]:
                self._threads.remove(t)
                log.warning(
                    "host instance %s: dequeue thread %s ended",
                    self.id,
                    t.name,
                    extra=self._event("thread-ended", dequeue_thread=t.name),
                )
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
                log.warning(
                    "host instance %s: started dequeue thread %s",
                    self.id,
                    t.name,
                    extra=self._event("thread-started", dequeue_thread=t.name),
                )
            short = len(self._threads) < want
            abandoned = len(self._abandoned)
        if short:
            self._exhaust(want, abandoned)

    def _exhaust(self, want: int, abandoned: int) -> None:
        """Stop the instance, loudly, because its hung handlers have taken every thread
        it may start: claims stop, the entries in hand are given back, it unregisters,
        and :meth:`run` (``messagebox host run``) ends with an error, so that whatever
        supervises the process starts it again (which is what frees hung threads)."""
        if self.exhausted is not None:
            return
        self.exhausted = (
            f"host instance {self.id}: {abandoned} handlers abandoned past "
            f"handler_timeout_seconds ({self.settings.handler_timeout_seconds} s) are "
            f"still running, and {want} dequeue threads is all it may add: it stops, "
            "giving its entries back, to be restarted"
        )
        log.critical(
            self.exhausted,
            extra=self._event("instance-exhausted", abandoned=abandoned, wanted=want),
        )
        self._stop_requested.set()
        threading.Thread(target=self.stop, name=f"{self.host}-exhausted", daemon=True).start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the instance (:meth:`messagebox.hosts.instance.HostInstance.stop`)."""
        raise NotImplementedError

    def _housekeeper(self) -> None:
        while not self._stopping.wait(self.settings.heartbeat_seconds):
            try:
                self._beat()
            except MessageBoxError as exc:
                self._store_failed("housekeeping", exc, "housekeeping-failed")

    def _beat(self) -> None:
        if not self.queue.heartbeat(self.settings.lease_seconds, self._flying(), self._info()):
            log.warning(
                "host instance %s was declared dead (no heartbeat for %.0f s); "
                "re-registered, its leases were released",
                self.id,
                self.settings.dead_after_seconds,
                extra=self._event("declared-dead"),
            )
        if self._pending:
            self._retry_pending()
        owed = self._ahead.owed_with(None)  # no claim came for them: all threads are busy
        if owed is not None:
            self._finish_outcomes(owed)
        dead, released = self.queue.release_dead(self.settings.dead_after_seconds)
        if dead or released:
            log.warning(
                "host instance %s: released %d leases of dead instances %s",
                self.id,
                released,
                ", ".join(dead) or "-",
                extra=self._event("leases-released", released=released, dead_instances=dead),
            )
            self._found_work()  # not idle: what was released is to be claimed
            self.wake()
        self._refresh_subscriptions()
        self._expire()
        if time.monotonic() - self._last_depth >= upkeep.DEPTH_SECONDS:
            self._last_depth = time.monotonic()
            self.box.operations.sample_depth(self.host, self.id)
        interval = self.settings.cleanup_interval_seconds
        if interval and time.monotonic() - self._last_cleanup >= interval:
            self._last_cleanup = time.monotonic()
            report = self.box.cleanup(batch=upkeep.HOST_BATCH, stop=self._stopping.is_set)
            if report.messages:
                log.info(
                    "host instance %s: cleanup deleted %d messages, %d parts and %d reference rows",
                    self.id,
                    report.messages,
                    report.parts,
                    report.reference_rows,
                    extra=self._event("cleanup", **dataclasses.asdict(report)),
                )

    def _wake_timers(self) -> None:
        """A step in this process set timers: look again, unless the loop looks before
        the earliest is due anyway."""
        if self.queue.timer_set_before(self._timers_look_at):
            self._timer_wake.set()

    def _timers(self) -> None:
        """Fire the host's due timers (service instances' timeouts): sleep until the
        next is due, at most ``poll_max_seconds`` (another process may set one; else
        ``TIMERS_LOOK_SECONDS``), or until a step in this process sets one due sooner."""
        longest = self.settings.poll_max_seconds
        if self.queue.timers_set_here:
            longest = max(longest, TIMERS_LOOK_SECONDS)
        while not self._stopping.is_set():
            self._timers_look_at = math.inf  # looking: any timer set now wakes it
            wait = longest
            try:
                due = self.queue.next_due()
                if due is not None and due <= 0:
                    hosts = self.queue.fire_timers()
                    if hosts:
                        self.stats.add(timers_fired=sum(hosts.values()))
                        continue
                if due is not None:
                    wait = min(wait, max(due, self.settings.poll_min_seconds))
            except MessageBoxError as exc:
                self._store_failed("firing timers", exc, "timers-failed")
            look_at = clock.local_now().timestamp() + wait
            self._timers_look_at = look_at
            if not self.queue.timer_set_before(look_at):  # none due sooner set meanwhile
                self._timer_wake.wait(wait)
            self._timer_wake.clear()
            # steps that set timers wake this loop; look again at most this often
            self._stopping.wait(self.settings.poll_min_seconds)

    def _listener(self) -> None:
        """Wake the workers on wake-ups from other processes (PostgreSQL's NOTIFY)."""
        self.queue.listen(self.wake, self._stopping)


def _key_batches(keyed: list[Claim], size: int) -> list[list[Claim]]:
    """Keyed claims (in claim order) in batches of about ``size``, each key's run whole
    in one batch and in publish order: a key is handled by one thread at a time."""
    runs: dict[tuple[int, str | None], list[Claim]] = {}
    for c in keyed:
        runs.setdefault((c.sub, c.key), []).append(c)
    batches: list[list[Claim]] = []
    batch: list[Claim] = []
    for run in runs.values():
        if batch and len(batch) + len(run) > size:
            batches.append(batch)
            batch = []
        batch.extend(run)
    if batch:
        batches.append(batch)
    for b in batches:
        in_claim_order(b)
    return batches
