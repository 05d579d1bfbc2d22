"""Calling a host instance's services: one delivery to its handler (the hot path), the
claims of services that take a batch (``handle_many``) together, and the ``flush`` of
services that make a batch's work durable at its end. Outcomes are held with the batch
(:class:`~messagebox.hosts.dispatch.Run`), which the supervisor may take over."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from messagebox.claims import Claim, Failure
from messagebox.hosts.dispatch import DONE, SETTLED, Done, InstanceStats, Run, Settled
from messagebox.hosts.failures import FailureJudge
from messagebox.hosts.service import Delivery, Handler, MessageBatch, as_handler
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.models import HostSettings, Subscription

if TYPE_CHECKING:
    from messagebox.port import HostBox

Outcome = Failure | Settled | Done
Completing = Callable[[Callable[[], Claim]], AbstractContextManager[Any]]
"""A transaction for a service's own statements that completes its entry
(:meth:`messagebox.delivery.consumer.Consumer.completing`)."""


@dataclass(frozen=True)
class Services:
    """A host instance's services, as it calls them."""

    handlers: dict[str, Handler]
    batchers: dict[str, Callable[[list[Delivery]], list[Exception | None]]]
    """Services that take a batch (``handle_many``: orchestrations)."""
    flushers: dict[str, Callable[[], None]]
    """Services that make a batch's work durable at its end (file send ports)."""
    uses_instances: bool
    """Whether a service runs service instances (orchestrations)."""

    @classmethod
    def of(cls, services: Mapping[str, object]) -> Services:
        return cls(
            {n: as_handler(n, s) for n, s in services.items()},
            _methods(services, "handle_many"),
            _methods(services, "flush"),
            any(getattr(s, "uses_instances", False) for s in services.values()),
        )


class ServiceCalls:
    """Hands claims to services and holds their outcomes with the batch."""

    def __init__(
        self,
        box: HostBox,
        instance: str,
        services: Services,
        completing: Completing,
        subscriptions: HostSubscriptions,
        judge: FailureJudge,
        settings: HostSettings,
        stats: InstanceStats,
    ) -> None:
        self._box = box
        self._instance = instance
        self._services = services
        self._completing = completing
        self._subscriptions = subscriptions
        self._judge = judge
        self._settings = settings
        self._stats = stats

    def deliver(self, run: Run, c: Claim, batch: MessageBatch) -> Outcome:
        """Hand one claim to its service; its outcome is held with the batch's."""
        if self._services.batchers:
            together = self.deliver_together(run, [c], batch)
            if c.id in together:
                return together[c.id]
        return self._call_handler(run, c, batch)

    def hold(self, run: Run, held: list[tuple[Claim, Outcome]]) -> None:
        """Hold these outcomes with the batch, all at once (a time-out elsewhere keeps
        them all or none); count the deliveries their services completed themselves."""
        settled = sum(1 for _, outcome in held if isinstance(outcome, Settled))
        if settled:
            self._stats.add(completed=settled)
        run.add_many(held)

    def flush(self, done: list[Claim], failed: list[Failure]) -> list[Claim]:
        """Have the services that defer durability to the end of a batch (``flush``)
        make it durable before the batch's completions are recorded; the entries of a
        service whose flush fails are failed instead (and delivered again)."""
        flushers = self._services.flushers
        if not flushers or not done:
            return done
        subs: dict[int, Subscription] = {}
        for c in done:
            sub = self._subscriptions.get(c.sub)
            if sub is not None and sub.service in flushers:
                subs[c.id] = sub
        broken: dict[str, BaseException] = {}
        for service in sorted({sub.service for sub in subs.values()}):
            try:
                flushers[service]()
            except BaseException as exc:
                broken[service] = exc
        if not broken:
            return done
        kept = []
        for c in done:
            sub = subs.get(c.id)
            if sub is not None and sub.service in broken:
                failed.append(self._judge.of_error(c, sub, broken[sub.service]))
            else:
                kept.append(c)
        return kept

    def deliver_together(
        self, run: Run, claims: list[Claim], batch: MessageBatch
    ) -> dict[int, Outcome]:
        """Hand the claims of services that take a batch (``handle_many``, as
        orchestrations do: their steps commit in one transaction) to them at once."""
        batchers = self._services.batchers
        if not batchers:
            return {}
        by_service: dict[str, list[tuple[Claim, Delivery]]] = {}
        for c in claims:
            sub = self._subscriptions.get(c.sub)
            if sub is not None and sub.service in batchers:
                d = self._delivery(c, sub, batch)
                by_service.setdefault(sub.service, []).append((c, d))
        outcomes: dict[int, Outcome] = {}
        timeout = self._settings.handler_timeout_seconds
        for service, pairs in by_service.items():
            run.begin([c for c, _ in pairs], None if timeout is None else timeout * len(pairs))
            try:
                errors: list[BaseException | None] = list(batchers[service]([d for _, d in pairs]))
            except BaseException as exc:  # never lose the thread (and strand its claims)
                errors = [exc] * len(pairs)
            run.end()
            held: list[tuple[Claim, Outcome]] = []
            for (c, d), error in zip(pairs, errors, strict=True):
                outcome = (
                    (SETTLED if d.settled else DONE)
                    if error is None
                    else self._judge.of_error(c, d.subscription, error, d)
                )
                held.append((_with_outbox(c, d) if outcome is DONE else c, outcome))
                outcomes[c.id] = outcome
            self.hold(run, held)
        return outcomes

    def _delivery(self, c: Claim, sub: Subscription, batch: MessageBatch) -> Delivery:
        return Delivery(
            self._box,
            entry_id=c.id,
            message_id=c.msg,
            subscription=sub,
            attempt=c.attempts,
            host_instance=self._instance,
            batch=batch,
            instance_id=c.instance_id,
            claim=c,
            completing=self._completing,
        )

    def _call_handler(self, run: Run, c: Claim, batch: MessageBatch) -> Outcome:
        """Hand one claim to its handler (the hot path: one call per message); the
        outcome is held with the batch's."""
        sub = self._subscriptions.get(c.sub)
        handler = None if sub is None else self._services.handlers.get(sub.service)
        if sub is None or handler is None:
            outcome: Outcome = self._judge.undeliverable(c, sub)
            self.hold(run, [(c, outcome)])
            return outcome
        d = self._delivery(c, sub, batch)
        run.begin_one(c, self._settings.handler_timeout_seconds)
        try:
            handler(d)
        except BaseException as exc:  # SystemExit too: a service cannot end its host
            run.end()
            outcome = self._judge.of_error(c, sub, exc, d)
            self.hold(run, [(c, outcome)])
            return outcome
        if d.settled:
            self._stats.add(completed=1)
        outcome = SETTLED if d.settled else DONE
        run.end_with(_with_outbox(c, d), outcome)  # ended and held at once
        return outcome


def _with_outbox(c: Claim, d: Delivery) -> Claim:
    """The claim of a delivery that succeeded, with what its service published with its
    completion (:meth:`Delivery.publish_on_completion`), to publish when it is recorded."""
    return c._replace(publish=tuple(d.outbox)) if d.outbox else c


def _methods(services: Mapping[str, object], name: str) -> dict[str, Any]:
    """The method ``name`` of each service that has one, by service name."""
    return {n: getattr(s, name) for n, s in services.items() if callable(getattr(s, name, None))}
