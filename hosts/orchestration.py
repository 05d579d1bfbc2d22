"""Orchestrations: long-running services with persisted state (docs/concepts.md: Orchestrations).

An orchestration is a class. Its receives are methods: ``@activate`` ones create an
instance, ``@receive`` ones feed a running instance through instance subscriptions on
the correlation properties. Its state is a pydantic model, saved after each message.
BizTalk calls these orchestrations; NServiceBus calls them sagas.

    class Order(BaseModel):
        total: float = 0
        paid: bool = False

    class Fulfilment(Orchestration[Order]):
        correlation = ("orders.OrderId",)

        @activate(P("messagebox.MessageType") == "orders#order")
        def order(self, msg: Delivery) -> None:
            self.state.total = msg.properties["orders.Total"]
            self.wait_for("payment", timeout=3600)   # or @timeout("payment") runs

        @receive(P("messagebox.MessageType") == "orders#payment")
        def payment(self, msg: Delivery) -> None:
            self.state.paid = True
            self.publish(Message(b"ship it", promoted={"orders.Step": "ship"}))
            self.complete()

        @timeout("payment")
        def unpaid(self) -> None:
            self.publish(Message(b"cancel", promoted={"orders.Step": "cancel"}))
            self.complete()

    app.orchestration(Fulfilment)

Guarantees:
- **One message at a time per instance**, in publish order, across every host instance
  and process: only the oldest queued message of an instance can be claimed, and it
  stays queued until its step commits.
- **Correlation.** Each receive is one stored subscription with the correlation
  properties. A message an ``@activate`` receive matches goes to the running instance
  for its correlation values; the first creates it. Routing finds or creates that
  instance in the publish's transaction, so concurrent first messages (in one batch, or
  from several processes) make exactly one instance, and a message published after it
  (even later in the same batch) can follow it. A message a ``@receive`` matches goes
  to the running instance for its values; when none runs it does not route there (with
  no other match, it is a routing failure: suspended, re-routable).
- **Convoys.** Several ``@activate`` receives make a parallel convoy (the messages may
  come in any order); repeated messages of one receive make a sequential convoy.
- **Steps are atomic.** A handler's effects (new state, published messages, timers,
  completion) are committed in one transaction with the removal of the message from the
  queue. A host killed mid-step commits nothing; the message is delivered again and the
  step runs again from the saved state. Published message ids are derived from the
  instance and its version, so a step can never store its messages twice
  (``Delivery.publish``, which would not, is refused inside a step). Side effects
  outside the MessageBox belong in send ports, which the orchestration publishes to.
- **Completion** (``self.complete()``) ends the instance: its correlation values no
  longer route to it (a later activating message starts a new instance, even one the
  completing step publishes itself), its timers and any instance subscriptions naming it
  are removed. Messages queued for it that it
  never consumed are suspended, not resumable, as ``completed-with-discarded-messages``
  (zombies), with a report naming the instance.
- **Failure.** A handler that raises is retried like any service; past the host's
  ``max_attempts`` its message is suspended (resumable) and the instance is suspended
  with it: its other messages wait until that entry is resumed or terminated.
- **Timeouts.** ``wait_for(receive, timeout=s)`` starts a timer, stopped when a message
  for that receive is handled; when it is due, a host instance queues a timeout message
  for the instance and the ``@timeout(receive)`` method runs, in order with the
  instance's other messages. Timers fire within ``poll_max_seconds`` of their due time
  (sooner when set by the same process, and on DuckDB, where every step runs in one
  process, on time).
"""

from __future__ import annotations

import dataclasses
import logging
import typing
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from messagebox import clock
from messagebox.errors import (
    Conflict,
    InstanceCompleted,
    MessageBoxError,
    ValidationError,
)
from messagebox.hosts import timing
from messagebox.hosts.service import Delivery
from messagebox.message import Message, from_handler
from messagebox.models import InstanceState, Kind
from messagebox.predicates import Filter, P, to_filter
from messagebox.properties import Value, canonical_name
from messagebox.steps import TIMER_PUBLISHER, Step, Stored, TimerSpec

log = logging.getLogger("messagebox.orchestration")

S = TypeVar("S", bound=BaseModel)

STEP_CONFLICT_RETRIES = 3
MAX_TIMEOUT_SECONDS = 10 * 365 * 86_400.0


class _Empty(BaseModel):
    """The state of an orchestration that declares none."""


@dataclass(frozen=True)
class Receive:
    """A receive of an orchestration: its name, filter and whether it activates."""

    name: str
    filter: Filter
    activates: bool
    method: Callable[..., Any]


def activate(filter: object) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method as an activating receive: a message ``filter`` matches creates an
    instance (or, with a correlation, goes to the running one for its values)."""
    return _mark(filter, activates=True)


def receive(filter: object) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method as a receive of a running instance: an instance subscription of
    ``filter`` and the instance's correlation values, made when the instance starts."""
    return _mark(filter, activates=False)


def _mark(filter: object, *, activates: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    parsed = to_filter(filter)  # a bad filter fails at class definition

    def mark(method: Callable[..., Any]) -> Callable[..., Any]:
        method.__mb_receive__ = (parsed, activates)  # type: ignore[attr-defined]
        return method

    return mark


def timeout(receive_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark the method that runs when ``wait_for(receive_name, ...)`` times out."""

    def mark(method: Callable[..., Any]) -> Callable[..., Any]:
        method.__mb_timeout__ = receive_name  # type: ignore[attr-defined]
        return method

    return mark


class Orchestration(Generic[S]):
    """Base class of orchestrations; see the module docstring.

    Class attributes: ``name`` (the service name; the class name by default),
    ``correlation`` (property names whose values identify an instance) and the state
    model, given as the type argument (``Orchestration[MyState]``) or ``state_model``.
    """

    name: ClassVar[str] = ""
    correlation: ClassVar[tuple[str, ...]] = ()
    state_model: ClassVar[type[BaseModel]] = _Empty
    receives: ClassVar[dict[str, Receive]] = {}
    timeouts: ClassVar[dict[str, Callable[..., Any]]] = {}

    state: S
    instance_id: str
    correlation_values: dict[str, Value]
    created: bool
    """True in the step that creates the instance."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.__dict__.get("name") or cls.__name__
        for base in getattr(cls, "__orig_bases__", ()):
            args = typing.get_args(base)
            if typing.get_origin(base) is Orchestration and args and isinstance(args[0], type):
                cls.state_model = args[0]
        if not (isinstance(cls.state_model, type) and issubclass(cls.state_model, BaseModel)):
            raise ValidationError(f"orchestration {cls.name!r}: the state must be a pydantic model")
        try:
            cls.correlation = tuple(canonical_name(n) for n in cls.correlation)
        except ValueError as exc:
            raise ValidationError(f"orchestration {cls.name!r}: correlation: {exc}") from exc
        receives: dict[str, Receive] = {}
        timeouts: dict[str, Callable[..., Any]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                marked = getattr(value, "__mb_receive__", None)
                if marked is not None:
                    receives[attr] = Receive(attr, marked[0], marked[1], value)
                elif attr in receives and callable(value):
                    # overridden without the decorator: the same receive, the new body
                    receives[attr] = dataclasses.replace(receives[attr], method=value)
                waited = getattr(value, "__mb_timeout__", None)
                if waited is not None:
                    timeouts[waited] = value
        cls.receives, cls.timeouts = receives, timeouts
        if not receives:
            return  # an abstract base
        if not any(r.activates for r in receives.values()):
            raise ValidationError(f"orchestration {cls.name!r} has no @activate receive")
        if not cls.correlation and any(not r.activates for r in receives.values()):
            raise ValidationError(
                f"orchestration {cls.name!r}: @receive needs a correlation (the properties "
                "that tell which instance a message belongs to)"
            )
        unknown = sorted(set(timeouts) - set(receives))
        if unknown:
            raise ValidationError(
                f"orchestration {cls.name!r}: @timeout({unknown[0]!r}) names no receive"
            )

    # --- what a handler may do ---

    def publish(self, *messages: Message | Iterable[Message]) -> None:
        """Publish messages when this step commits, with the correlation properties
        promoted (unless the message promotes them itself)."""
        extra = {k: v for k, v in self.correlation_values.items() if v is not None}
        for message in from_handler(f"{self.name}: publish", messages):
            self._effects.publish.append(message.with_promoted(extra))

    def wait_for(self, receive_name: str, *, timeout: float) -> None:
        """Expect a message for ``receive_name`` within ``timeout`` seconds; if none is
        handled by then, the ``@timeout(receive_name)`` method runs. Waiting again for
        the same receive restarts the timer."""
        if receive_name not in self.receives:
            raise ValidationError(f"{self.name}: wait_for names no receive {receive_name!r}")
        if receive_name not in self.timeouts:
            raise ValidationError(
                f"{self.name}: wait_for({receive_name!r}) needs a @timeout({receive_name!r}) method"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 <= timeout <= MAX_TIMEOUT_SECONDS
        ):
            raise ValidationError(
                f"{self.name}: wait_for({receive_name!r}): timeout must be a number of seconds "
                f"from 0 to {MAX_TIMEOUT_SECONDS:g}, not {timeout!r}"
            )
        due = self._now + timedelta(seconds=float(timeout))
        self._pending[receive_name] = due.isoformat()
        self._effects.cancel.append(receive_name)
        self._effects.timers = [t for t in self._effects.timers if t.name != receive_name]
        self._effects.timers.append(TimerSpec(receive_name, due))

    def cancel_wait(self, receive_name: str) -> None:
        """Stop waiting for ``receive_name`` (its timeout will not run)."""
        self._pending.pop(receive_name, None)
        self._effects.cancel.append(receive_name)
        self._effects.timers = [t for t in self._effects.timers if t.name != receive_name]

    @property
    def waiting_for(self) -> list[str]:
        """The receives this instance waits for with a timeout."""
        return sorted(self._pending)

    def complete(self) -> None:
        """Complete the instance when this step commits."""
        self._effects.complete = True

    # --- runtime binding ---

    _effects: Step
    _pending: dict[str, str]
    _now: datetime


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
