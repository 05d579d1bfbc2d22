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
  (``Delivery.publish`` and ``publish_on_completion``, outside the step, are refused
  inside it). Side effects
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from messagebox.errors import (
    ValidationError,
)
from messagebox.message import Message, from_handler
from messagebox.predicates import Filter, to_filter
from messagebox.properties import Value, canonical_name
from messagebox.steps import Step, TimerSpec

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
