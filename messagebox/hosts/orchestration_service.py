"""The service that runs an orchestration class in a host instance (see
:mod:`messagebox.hosts.orchestration`): its subscriptions, and its steps, run and
committed together where they can be, one by one where they conflict."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from messagebox import clock
from messagebox.errors import (
    Conflict,
    InstanceCompleted,
    MessageBoxError,
    ValidationError,
)
from messagebox.hosts import timing
from messagebox.hosts.orchestration import (
    STEP_CONFLICT_RETRIES,
    Orchestration,
    Receive,
)
from messagebox.hosts.service import Delivery
from messagebox.models import InstanceState, Kind
from messagebox.predicates import P
from messagebox.properties import Value
from messagebox.steps import TIMER_PUBLISHER, Step, Stored

log = logging.getLogger("messagebox.orchestration")


class OrchestrationService:
    """The service that runs an orchestration class in a host instance (registered by
    :meth:`HostApp.orchestration <hosts.app.HostApp.orchestration>`)."""

    uses_instances = True
    """Tells the host instance to claim per service instance and run timers."""

    def __init__(self, cls: type[Orchestration[Any]]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Orchestration)) or not cls.receives:
            raise ValidationError(
                f"{cls!r} is not an orchestration: subclass Orchestration and declare "
                "@activate receives"
            )
        self.cls = cls
        self.name = cls.name
        self._clock = timing.current()  # the pause before a conflicting step runs again

    def subscription_specs(self) -> list[dict[str, Any]]:
        """The orchestration's subscriptions, one per receive, named
        ``<name>.<receive>``: an ``@activate`` receive is an activation subscription
        with the correlation (a convoy); a ``@receive`` one is an instance subscription
        with the correlation, which follows the running instance for the message's
        values. Each requires the correlation properties to be present."""
        specs = []
        for r in self.cls.receives.values():
            filt = r.filter
            for prop in self.cls.correlation:
                filt = filt & P(prop).exists()
            specs.append(
                {
                    "service": self.name,
                    "filter": filt,
                    "name": f"{self.name}.{r.name}",
                    "kind": Kind.ACTIVATION if r.activates else Kind.INSTANCE,
                    "correlation": self.cls.correlation,
                }
            )
        return specs

    def _receive_of(self, d: Delivery) -> Receive:
        name = d.subscription.name
        receive_name = name[len(self.name) + 1 :] if name.startswith(self.name + ".") else ""
        found = self.cls.receives.get(receive_name)
        if found is None:
            raise ValidationError(
                f"orchestration {self.name!r}: subscription {d.subscription.name!r} names "
                "no receive of the class"
            )
        return found

    def handle(self, d: Delivery) -> None:
        """Run and commit one step (for a single delivery)."""
        [error] = self.handle_many([d])
        if error is not None:
            raise error

    def handle_many(self, deliveries: list[Delivery]) -> list[Exception | None]:
        """Run one step per delivery (each of a different instance: the claim gives an
        instance one message at a time) and commit them in one transaction; if that
        fails, commit them one by one. A delivery whose step committed is settled; the
        others get their error (and are retried or suspended by the host instance)."""
        errors: list[Exception | None] = [None] * len(deliveries)
        steps = self._prepare(deliveries, range(len(deliveries)), errors)
        if len(steps) > 1:
            try:
                self._commit(deliveries, steps)
                return errors
            except MessageBoxError as exc:
                log.info(
                    "orchestration %s: batch commit failed (%s); one by one",
                    self.name,
                    exc,
                    extra={"event": "steps-one-by-one", "service": self.name, "error": str(exc)},
                )
        for i, step in steps.items():
            for attempt in range(1, STEP_CONFLICT_RETRIES + 1):
                try:
                    self._commit(deliveries, {i: step})
                    break
                except Conflict as exc:  # another commit won: run the step again
                    if attempt == STEP_CONFLICT_RETRIES:
                        errors[i] = exc
                        break
                    self._clock.sleep(0.01 * attempt)
                    again = self._prepare(deliveries, [i], errors)
                    if i not in again:
                        break
                    step = again[i]
                except Exception as exc:
                    errors[i] = exc
                    break
        return errors

    def _prepare(
        self, deliveries: list[Delivery], which: Iterable[int], errors: list[Exception | None]
    ) -> dict[int, Step]:
        """Load the instances and run the handlers; a handler's error is recorded."""
        which = list(which)
        ids = [d.instance_id for d in (deliveries[i] for i in which) if d.instance_id]
        stored: dict[str, Stored] = {}
        convoys: set[str] = set()
        now = clock.local_now()
        if which:
            first = deliveries[which[0]]
            try:
                now, stored, convoys = first.box.consumer(
                    first.subscription.host, first.host_instance
                ).load(ids)
            except Exception as exc:  # the store failed: every step fails (and is retried)
                for i in which:
                    errors[i] = exc
                return {}
        steps: dict[int, Step] = {}
        for i in which:
            d = deliveries[i]
            try:
                steps[i] = self._run(d, stored.get(d.instance_id or ""), convoys, now)
                errors[i] = None
            except Exception as exc:
                errors[i] = exc
        return steps

    def _run(
        self,
        d: Delivery,
        stored: Stored | None,
        convoys: set[str],
        now: datetime,
    ) -> Step:
        """Run the handler for one delivery on its instance's saved state."""
        message = d.message
        instance_id = d.instance_id
        if stored is None and instance_id is not None and instance_id not in convoys:
            raise InstanceCompleted(
                f"orchestration {self.name!r}: instance {instance_id} has completed (or was "
                "purged); this message was never consumed"
            )
        if stored is not None and stored.state in (
            InstanceState.COMPLETED,
            InstanceState.TERMINATED,
        ):
            raise InstanceCompleted(
                f"orchestration {self.name!r}: instance {instance_id} {stored.state.value} at "
                f"{stored.completed_at}; this message was never consumed"
            )
        if instance_id is None:  # no correlation: each activation is an instance
            instance_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"mb-entry:{d.entry_id}"))
        values: dict[str, Value] = (
            dict(stored.correlation)
            if stored is not None
            else {p: message.promoted[p] for p in self.cls.correlation if p in message.promoted}
        )
        data = stored.data if stored is not None else {}
        pending: dict[str, str] = dict(data.get("timers", {}))
        orch = self.cls.__new__(self.cls)
        try:
            orch.state = (
                self.cls.state_model.model_validate(data["state"])
                if stored is not None
                else self.cls.state_model()
            )
        except Exception as exc:
            raise ValidationError(
                f"orchestration {self.name!r}: instance {instance_id}: the saved state does "
                f"not fit {self.cls.state_model.__name__}: {exc}"
            ) from exc
        orch.instance_id = instance_id
        orch.correlation_values = values
        orch.created = stored is None
        orch._pending = pending
        orch._now = now
        step = orch._effects = Step(
            owner=d.host_instance,
            entry_id=d.entry_id,
            instance_id=instance_id,
            service=self.name,
            host=d.subscription.host,
            sub=d.subscription.id,
            version=None if stored is None else stored.version,
            data={},
            correlation=values,
        )
        if message.publisher == TIMER_PUBLISHER:
            name = str(message.written.get("messagebox.TimerName", ""))
            if _same_instant(pending.get(name), message.written.get("messagebox.TimerDue")):
                del pending[name]
                self.cls.timeouts[name](orch)
            else:  # stopped after it fired: nothing waits for it
                log.debug("instance %s: stale timeout %r ignored", instance_id, name)
        else:
            r = self._receive_of(d)
            if r.name in pending:
                del pending[r.name]
                step.cancel.append(r.name)
            d.in_step = True
            try:
                r.method(orch, d)
            finally:
                d.in_step = False
        step.data = {"state": orch.state.model_dump(mode="json"), "timers": pending}
        return step

    def _commit(self, deliveries: list[Delivery], steps: dict[int, Step]) -> None:
        first = deliveries[next(iter(steps))]
        discarded = first.box.consumer(first.subscription.host, first.host_instance).commit_steps(
            list(steps.values()), publisher=f"orchestration:{self.name}"
        )
        for i in steps:
            deliveries[i].settled = True
        if discarded:
            log.warning(
                "orchestration %s: completed instances left %d discarded messages (suspended, "
                "reason completed-with-discarded-messages)",
                self.name,
                discarded,
                extra={"event": "zombie", "service": self.name, "count": discarded},
            )


def _same_instant(a: object, b: object) -> bool:
    """Whether two ISO timestamps (any UTC offsets) name the same instant."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    try:
        return datetime.fromisoformat(a) == datetime.fromisoformat(b)
    except ValueError:
        return False
