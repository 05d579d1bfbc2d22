"""How a host instance hands a claimed batch to its services: one by one or together
(batching services), interrupted entries alone, outcomes held with the batch until its
services flush, failures classified (retry, permanent, uncharged engine failures)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from typing import Any

from messagebox.claims import MAX_BACKOFF_SECONDS, Claim, Failure
from messagebox.errors import (
    BackendUnavailable,
    InstanceCompleted,
    MessageBoxError,
    PermanentFailure,
    RetryLater,
)
from messagebox.hosts.core import InstanceCore
from messagebox.hosts.dispatch import (
    ALONE,
    ALONE_WAIT_SECONDS,
    DONE,
    SETTLED,
    Abandoned,
    Done,
    Run,
    Settled,
)
from messagebox.hosts.service import Delivery, MessageBatch
from messagebox.models import (
    CRASHED_HOST,
    SUBSCRIPTION_REMOVED,
    Subscription,
)
from messagebox.outcomes import Outcomes

log = logging.getLogger("messagebox.hosts")


class Handling(InstanceCore):
    """Delivering claimed batches (run on the dequeue threads)."""

    def _handle_batch(self, claims: list[Claim]) -> tuple[bool, Outcomes | None]:
        """Handle a claimed batch. Returns whether this thread goes on (False when the
        supervisor took the batch over, a handler having timed out: the thread then
        ends) and the batch's outcomes when they are left to record with the next claim
        (else they are recorded)."""
        run = Run(claims, timed=self.settings.handler_timeout_seconds is not None)
        with self._runs_lock:
            self._runs.add(run)
        try:
            return True, self._handle_run(run)
        except Abandoned:
            return False, None
        except BaseException:
            self._salvage(run)
            raise
        finally:
            if not run.abandoned:
                self._release_run(run)

    def _release_run(self, run: Run) -> None:
        with self._runs_lock:
            self._runs.discard(run)
        self._forget(run.claims)
        self._permits.give(len(run.claims))
        ALONE.release(run)

    def _salvage(self, run: Run) -> None:
        """After an unexpected error: record what the batch holds and give back what
        it never started."""
        try:
            done, failed = run.take()
            self._finish(done, failed, run.unseen())
        except BaseException as exc:
            log.error(
                "host instance %s: could not record a failed batch: %s",
                self.id,
                exc,
                extra=self._event("record-failed", error=str(exc)),
            )

    def _handle_run(self, run: Run) -> Outcomes | None:
        """Deliver the batch; returns its outcomes, to record with the next claim (None
        when recorded already, as when stopping)."""
        shared = self._reads.take(run.claims)
        try:
            own = shared or MessageBatch(self.box, [c.msg for c in run.claims])
            return self._deliver_all(run, own)
        finally:
            if shared is not None:  # its messages are let go unless another batch wants them
                shared.done([c.msg for c in run.claims])

    def _deliver_all(self, run: Run, batch: MessageBatch) -> Outcomes | None:
        """:meth:`_handle_run` with the batch's messages to read from."""
        unstarted: list[Claim] = []
        # ordered subscriptions (key None) and keys whose run stopped at a failure
        blocked: set[tuple[int, str | None]] = set()
        most = self.settings.max_attempts
        # an ordered subscription's entries (and a key's) go one by one, in order, even
        # to a service that takes batches: a failure stops the rest (in a batch, they
        # had been handed over before it was known)
        fresh = [
            c
            for c in run.claims
            if not c.interrupted and c.charges < most and not c.ordered and c.key is None
        ]
        together = {} if self._stopping.is_set() else self._handle_together(run, fresh, batch)
        # a run longer than a batch a thread (Supervision._run_most) records its outcomes
        # that many at a time: a crash delivers again no more of it than of the plain
        # batches the instance's threads hold unrecorded
        size = self.settings.claim_batch * self.settings.dequeue_threads
        unrecorded = 0
        for c in run.claims:
            if c.run and unrecorded >= size:
                self._record(run)
                unrecorded = 0
            unrecorded += 1
            outcome: Failure | Settled | Done | None
            if c.id in together:
                outcome = together[c.id]
            elif c.charges >= most:
                outcome = self._used_up(c)
                self._note(run, c, outcome)
            elif self._stopping.is_set() or (c.sub, c.key) in blocked:
                unstarted.append(c)
                continue
            elif c.interrupted:
                outcome = self._handle_alone(run, c, batch)
                if outcome is None:
                    unstarted.append(c)  # given back, still interrupted
                    if c.ordered or c.key is not None:
                        blocked.add((c.sub, c.key))
                    continue
            else:
                outcome = self._deliver(run, c, batch)
            if isinstance(outcome, Failure) and (c.ordered or c.key is not None):
                blocked.add((c.sub, c.key))
        outcomes = self._taken(run, unstarted)
        if self._stopping.is_set():
            self._finish_outcomes(outcomes)
            return None
        return outcomes

    def _deliver(self, run: Run, c: Claim, batch: MessageBatch) -> Failure | Settled | Done:
        """Hand one claim to its service; its outcome is held with the batch's."""
        if self._batchers:
            together = self._handle_together(run, [c], batch)
            if c.id in together:
                return together[c.id]
        return self._handle(run, c, batch)

    def _note(self, run: Run, c: Claim, outcome: Failure | Settled | Done) -> None:
        self._note_many(run, [(c, outcome)])

    def _note_many(self, run: Run, held: list[tuple[Claim, Failure | Settled | Done]]) -> None:
        settled = sum(1 for _, outcome in held if isinstance(outcome, Settled))
        if settled:
            self.stats.add(completed=settled)
        run.add_many(held)

    def _record(self, run: Run) -> None:
        """Record the outcomes the batch holds so far."""
        self._finish_outcomes(self._taken(run))

    def _taken(self, run: Run, unstarted: Sequence[Claim] = ()) -> Outcomes:
        """The outcomes the batch holds so far, taken from it (after its services'
        flush), with the entries it gives back unstarted."""
        done, failed = run.take()
        return self._outcomes(self._flush(done, failed), failed, unstarted)

    def _handle_alone(
        self, run: Run, c: Claim, batch: MessageBatch
    ) -> Failure | Settled | Done | None:
        """Deliver an entry whose previous delivery ended with no outcome: alone, one at
        a time per process, marked started in storage first and recorded at once, so
        that a message that makes its host end is charged for it and nothing else is
        (``crashed-host`` past ``max_attempts``). None: not started (another is being
        delivered alone, or stopping); it is given back, still interrupted."""
        self._record(run)  # what came before it must not be lost if it ends the process
        if self._stopping.is_set() or not ALONE.acquire(run, ALONE_WAIT_SECONDS):
            return None
        try:
            if self._stopping.is_set():
                return None
            try:
                self.queue.mark_started([c])
            except MessageBoxError as exc:
                outcome: Failure | Settled | Done = self._engine_failure(c, exc)
                self._note(run, c, outcome)
            else:
                outcome = self._deliver(run, c, batch)
            self._record(run)
            return outcome
        finally:
            ALONE.release(run)

    def _used_up(self, c: Claim) -> Failure:
        """An entry charged ``max_attempts`` before this delivery: suspended unseen, as
        ``crashed-host`` when its host ended during its last delivery."""
        if not (c.interrupted and c.crashed_by):  # max_attempts was lowered since
            return Failure(
                c,
                f"it was charged {c.charges} attempts, max_attempts is "
                f"{self.settings.max_attempts}",
                permanent=True,
            )
        self.stats.add(crashed=1)
        error = (
            f"a host process ended while handling it (the last time: instance "
            f"{c.crashed_by}); with its failures that makes {c.charges} attempts, and it "
            "is suspended so that it does not end another"
        )
        log.error(
            "host instance %s: entry %d (message %s): %s",
            self.id,
            c.id,
            c.msg,
            error,
            extra={
                "event": "crashed-host",
                "host_instance": self.id,
                "host": self.host,
                "entry": c.id,
                "message_id": str(c.msg),
                "crashed_by": c.crashed_by,
            },
        )
        return Failure(c, error, permanent=True, reason=CRASHED_HOST)

    def _flush(self, done: list[Claim], failed: list[Failure]) -> list[Claim]:
        """Have the services that defer durability to the end of a batch (``flush``)
        make it durable before the batch's completions are recorded; the entries of a
        service whose flush fails are failed instead (and delivered again)."""
        if not self._flushers or not done:
            return done
        subs: dict[int, Subscription] = {}
        for c in done:
            sub = self._subscription(c.sub)
            if sub is not None and sub.service in self._flushers:
                subs[c.id] = sub
        broken: dict[str, BaseException] = {}
        for service in sorted({sub.service for sub in subs.values()}):
            try:
                self._flushers[service]()
            except BaseException as exc:
                broken[service] = exc
        if not broken:
            return done
        kept = []
        for c in done:
            sub = subs.get(c.id)
            if sub is not None and sub.service in broken:
                failed.append(self._failure(c, sub, broken[sub.service]))
            else:
                kept.append(c)
        return kept

    def _handle_together(
        self, run: Run, claims: list[Claim], batch: MessageBatch
    ) -> dict[int, Failure | Settled | Done]:
        """Hand the claims of services that take a batch (``handle_many``, as
        orchestrations do: their steps commit in one transaction) to them at once."""
        if not self._batchers:
            return {}
        by_service: dict[str, list[tuple[Claim, Delivery]]] = {}
        for c in claims:
            sub = self._subscription(c.sub)
            if sub is not None and sub.service in self._batchers:
                d = self._delivery(c, sub, batch)
                by_service.setdefault(sub.service, []).append((c, d))
        outcomes: dict[int, Failure | Settled | Done] = {}
        timeout = self.settings.handler_timeout_seconds
        for service, pairs in by_service.items():
            run.begin([c for c, _ in pairs], None if timeout is None else timeout * len(pairs))
            try:
                errors: list[BaseException | None] = list(
                    self._batchers[service]([d for _, d in pairs])
                )
            except BaseException as exc:  # never lose the thread (and strand its claims)
                errors = [exc] * len(pairs)
            run.end()
            held: list[tuple[Claim, Failure | Settled | Done]] = []
            for (c, d), error in zip(pairs, errors, strict=True):
                outcome = (
                    (SETTLED if d.settled else DONE)
                    if error is None
                    else self._failure(c, d.subscription, error, d)
                )
                held.append((_with_outbox(c, d) if outcome is DONE else c, outcome))
                outcomes[c.id] = outcome
            self._note_many(run, held)  # held at once: a time-out elsewhere keeps them
        return outcomes

    def _delivery(self, c: Claim, sub: Subscription, batch: MessageBatch) -> Delivery:
        return Delivery(
            self.box,
            entry_id=c.id,
            message_id=c.msg,
            subscription=sub,
            attempt=c.attempts,
            host_instance=self.id,
            batch=batch,
            instance_id=c.instance_id,
            claim=c,
            completing=self.queue.completing,
        )

    def _handle(self, run: Run, c: Claim, batch: MessageBatch) -> Failure | Settled | Done:
        """Hand one claim to its handler (the hot path: one call per message); the
        outcome is held with the batch's."""
        sub = self._subscription(c.sub)
        handler = None if sub is None else self.handlers.get(sub.service)
        if sub is None or handler is None:
            outcome: Failure | Settled | Done = self._undeliverable(c, sub)
            self._note(run, c, outcome)
            return outcome
        d = self._delivery(c, sub, batch)
        run.begin_one(c, self.settings.handler_timeout_seconds)
        try:
            handler(d)
        except BaseException as exc:  # SystemExit too: a service cannot end its host
            run.end()
            outcome = self._failure(c, sub, exc, d)
            self._note(run, c, outcome)
            return outcome
        if d.settled:
            self.stats.add(completed=1)
        outcome = SETTLED if d.settled else DONE
        run.end_with(_with_outbox(c, d), outcome)  # ended and held at once
        return outcome

    def _undeliverable(self, c: Claim, sub: Subscription | None) -> Failure:
        """The failure of an entry whose subscription is gone or whose service this
        instance does not run."""
        if sub is None:
            return Failure(
                c,
                "its subscription was removed before it was delivered",
                permanent=True,
                reason=SUBSCRIPTION_REMOVED,
            )
        return Failure(
            c,
            f"service {sub.service!r} is not registered in host instance {self.id}. "
            + self.unserved_hint(sub.service),
        )

    def _engine_failure(self, c: Claim, exc: BaseException) -> Failure:
        """The store failed during a delivery: retried, without using up an attempt."""
        self.stats.add(engine_failures=1)
        log.warning(
            "host instance %s: the store failed while delivering entry %d (%s); it is "
            "delivered again, not counted as an attempt",
            self.id,
            c.id,
            exc,
            extra=self._event("store-failed", entry=c.id, error=str(exc)),
        )
        return Failure(
            c,
            f"{type(exc).__name__}: {exc}",
            charge=False,
            retry_after=min(
                self.settings.retry_backoff_seconds * 2 ** min(c.attempts - 1, 10),
                MAX_BACKOFF_SECONDS,
            ),
        )

    def _failure(
        self, c: Claim, sub: Subscription, exc: BaseException, d: Delivery | None = None
    ) -> Failure:
        """What a service's exception means for its entry."""
        if isinstance(exc, BackendUnavailable) or (
            d is not None and isinstance(d.storage_error, BackendUnavailable)
        ):
            return self._engine_failure(c, exc)
        self.stats.add(failed=1)
        if isinstance(exc, PermanentFailure):
            if isinstance(exc, InstanceCompleted):
                self.stats.add(zombies=1)
                log.warning(
                    "host instance %s: zombie message %s: %s",
                    self.id,
                    c.msg,
                    exc,
                    extra=self._fields("zombie", c, sub, exc),
                )
            return Failure(c, f"{type(exc).__name__}: {exc}", permanent=True, reason=exc.reason)
        if isinstance(exc, RetryLater):
            log.info(
                "host instance %s: service %r retries entry %d in %.3g s (attempt %d): %s",
                self.id,
                sub.service,
                c.id,
                exc.delay,
                c.attempts,
                exc,
                extra=self._fields("retry-later", c, sub, exc),
            )
            return Failure(c, f"RetryLater: {exc}", retry_after=exc.delay, charge=False)
        if not isinstance(exc, Exception):
            log.error(
                "host instance %s: service %r raised %s on entry %d (attempt %d): a "
                "service cannot end its host instance; the entry fails",
                self.id,
                sub.service,
                type(exc).__name__,
                c.id,
                c.attempts,
                extra=self._fields("delivery-failed", c, sub, exc),
            )
        else:
            log.warning(
                "host instance %s: service %r failed entry %d (attempt %d): %s",
                self.id,
                sub.service,
                c.id,
                c.attempts,
                exc,
                extra=self._fields("delivery-failed", c, sub, exc),
            )
        return Failure(c, "".join(traceback.format_exception(exc)))

    def _fields(
        self, event: str, c: Claim, sub: Subscription, exc: BaseException
    ) -> dict[str, Any]:
        """Structured log fields of an event about one queue entry."""
        return {
            "event": event,
            "host_instance": self.id,
            "host": self.host,
            "service": sub.service,
            "subscription": sub.id,
            "entry": c.id,
            "message_id": str(c.msg),
            "attempt": c.attempts,
            "error": f"{type(exc).__name__}: {exc}",
        }


def _with_outbox(c: Claim, d: Delivery) -> Claim:
    """The claim of a delivery that succeeded, with what its service published with its
    completion (:meth:`Delivery.publish_on_completion`), to publish when it is recorded."""
    return c._replace(publish=tuple(d.outbox)) if d.outbox else c
