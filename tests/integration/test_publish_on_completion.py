"""A service publishes with its delivery's completion (``Delivery.publish``, and
``Delivery.publish_on_completion``), on both backends: published once the entry
completes and only then (a failed delivery publishes nothing, its retry publishes once),
in the completing transaction (a completion whose lease another instance took publishes
nothing), what no subscription takes is suspended, bad input is refused inside the
handler, and a service that takes batches publishes with each completion. With
``at_once=True``, ``Delivery.publish`` publishes now, in its own transaction."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from messagebox import Message, MessageBox
from messagebox.errors import ValidationError
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import HostSettings, Outcome
from messagebox.outcomes import Outcomes
from messagebox.predicates import P
from tests.conftest import FAST_HOST, wait_for


class Confirms:
    """Counts the confirmations per order number, and who published them."""

    def __init__(self) -> None:
        self.seen: Counter[int] = Counter()
        self.publishers: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.seen[int(d.properties["t.N"])] += 1  # type: ignore[arg-type]
            self.publishers.add(d.message.publisher)


def _shop(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("pay", host="h", filter=P("t.Kind") == "pay", name="pay")
    box.subscribe("confirm", host="h", filter=P("t.Kind") == "confirm", name="confirm")


def _run(
    box: MessageBox,
    instances: list[HostInstance],
    pay: Callable[[Delivery], None] | BatchPay,
    confirms: Confirms,
    **settings: object,
) -> None:
    """The shop, and a host instance of it: ``pay`` takes the orders, ``confirms`` the
    confirmations."""
    _shop(box)
    services = {"pay": pay, "confirm": confirms}
    inst = HostInstance(box, "h", services, settings={**FAST_HOST, **settings})
    instances.append(inst.start())


def _orders(box: MessageBox, n: int) -> None:
    box.publish([Message(b"pay", promoted={"t.Kind": "pay", "t.N": i}) for i in range(n)])


def _confirm(d: Delivery) -> Message:
    return _confirm_of(d.properties["t.N"])


def _confirm_of(n: object) -> Message:
    return Message(b"ok", promoted={"t.Kind": "confirm", "t.N": n})


WAYS = {
    "publish": lambda d, m: d.publish(m),
    "publish_on_completion": lambda d, m: d.publish_on_completion(m),
}
"""The two ways a service publishes with its completion."""


@pytest.mark.parametrize("way", WAYS)
def test_published_once_with_each_completion(
    box: MessageBox, instances: list[HostInstance], way: str
) -> None:
    confirms = Confirms()

    def pay(d: Delivery) -> None:
        WAYS[way](d, _confirm(d))

    _run(box, instances, pay, confirms)
    _orders(box, 30)
    wait_for(lambda: sum(confirms.seen.values()) == 30, "30 confirmations")
    wait_for(lambda: not box.queue_depth(), "the queue drained")
    assert confirms.seen == Counter(range(30))  # each once
    assert confirms.publishers == {box.publisher}
    assert box.suspended() == []


@pytest.mark.parametrize("way", WAYS)
def test_a_failed_delivery_publishes_nothing_and_its_retry_publishes_once(
    box: MessageBox, instances: list[HostInstance], way: str
) -> None:
    confirms = Confirms()

    def pay(d: Delivery) -> None:
        WAYS[way](d, _confirm(d))
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        if n == 0 or (n % 2 and d.attempt == 1):
            raise RuntimeError(f"order {n} fails")

    _run(box, instances, pay, confirms, max_attempts=2, retry_backoff_seconds=0.01)
    _orders(box, 10)
    wait_for(lambda: len(box.suspended()) == 1, "order 0 suspended after its two attempts")
    wait_for(lambda: sum(confirms.seen.values()) == 9, "9 confirmations")
    wait_for(lambda: not box.queue_depth(), "the queue drained")
    assert confirms.seen == Counter(range(1, 10))  # the odd ones once, after their retry
    [suspended] = box.suspended()
    assert "order 0 fails" in (suspended.error or "")


def test_what_no_subscription_takes_is_suspended(
    box: MessageBox, instances: list[HostInstance]
) -> None:

    def pay(d: Delivery) -> None:
        d.publish_on_completion(Message(b"lost", promoted={"t.Kind": "nobody"}))

    _run(box, instances, pay, Confirms())
    _orders(box, 2)
    wait_for(lambda: len(box.suspended()) == 2, "the 2 publications suspended")
    assert {s.reason for s in box.suspended()} == {"routing-failure"}
    assert {box.read_message(s.message_id).body for s in box.suspended()} == {b"lost"}


def test_bad_input_is_refused_in_the_handler(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    refused: list[str] = []
    confirms = Confirms()

    own_id = uuid.UUID(int=7)
    bad = [
        [_confirm_of(0), b"not a message"],
        [_confirm_of(0), Message(b"x", promoted={"messagebox.TimerName": "forged"})],
        [_confirm_of(0), Message(b"x", promoted={"t.Kind": "confirm", "t.N": 0}, id=own_id)],
    ]

    def pay(d: Delivery) -> None:
        for items in bad:
            try:
                d.publish_on_completion(items)  # type: ignore[arg-type]
            except ValidationError as exc:
                refused.append(str(exc))
        d.publish_on_completion(_confirm(d), [_confirm(d)])  # messages and iterables

    _run(box, instances, pay, confirms)
    _orders(box, 1)
    wait_for(lambda: sum(confirms.seen.values()) == 2, "2 confirmations")
    assert refused == [
        "pay: publish_on_completion takes Message objects, not bytes",
        "pay: publish_on_completion: property 'messagebox.TimerName' is in the reserved "
        "namespace messagebox.",
        "pay: publish_on_completion publishes with the completion and gives each message "
        f"its id; message {own_id} gives its own (publish it with publish(..., "
        "at_once=True))",
    ]
    assert confirms.seen == Counter({0: 2})  # nothing of the refused calls
    assert box.suspended() == []  # nor stored anyhow


def test_a_completion_whose_lease_another_instance_took_publishes_nothing(
    box: MessageBox,
) -> None:
    _shop(box)
    _orders(box, 1)
    mine = box.consumer("h", "a")
    [c] = mine.claim(1, 0.001, ordered=False, instances=False)[0]
    other = box.consumer("h", "b")
    taken = []

    def take() -> bool:
        taken.extend(other.claim(1, 30.0, ordered=False, instances=False)[0])
        return bool(taken)

    wait_for(take, "the lapsed lease taken by another instance")
    published = c._replace(publish=(Message(b"ok", promoted={"t.Kind": "confirm", "t.N": 0}),))
    recorded = mine.record(Outcomes([published], [], [], HostSettings(), set()))
    assert (recorded.finished.completed, recorded.finished.lost) == (0, 1)
    pay, confirm = box.subscription("pay").id, box.subscription("confirm").id
    assert [(d.subscription, d.depth) for d in box.queue_depth()] == [(pay, 1)]  # no confirm
    theirs = taken[0]._replace(publish=published.publish)
    recorded = other.record(Outcomes([theirs], [], [], HostSettings(), set()))
    assert recorded.finished.completed == 1
    assert [(d.subscription, d.depth) for d in box.queue_depth()] == [(confirm, 1)]


class BatchPay:
    """A service that takes batches (``handle_many``): each delivery publishes its
    confirmation with its completion, and odd orders fail on their first attempt."""

    def handle(self, d: Delivery) -> None:
        [error] = self.handle_many([d])
        if error is not None:
            raise error

    def __init__(self) -> None:
        self.largest = 0

    def handle_many(self, ds: list[Delivery]) -> list[Exception | None]:
        self.largest = max(self.largest, len(ds))
        errors: list[Exception | None] = []
        for d in ds:
            d.publish_on_completion(_confirm(d))
            n = int(d.properties["t.N"])  # type: ignore[arg-type]
            errors.append(RuntimeError(f"order {n}") if n % 2 and d.attempt == 1 else None)
        return errors


def test_a_service_that_takes_batches_publishes_with_each_completion(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    confirms = Confirms()
    pay = BatchPay()
    _run(box, instances, pay, confirms, retry_backoff_seconds=0.01)
    _orders(box, 20)
    wait_for(lambda: sum(confirms.seen.values()) == 20, "20 confirmations")
    wait_for(lambda: not box.queue_depth(), "the queue drained")
    assert confirms.seen == Counter(range(20))  # the odd ones once, after their retry
    assert pay.largest > 1  # handed over in batches (one claim took the 20)


def test_at_once_publishes_now_and_a_retry_publishes_again(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    confirms = Confirms()
    routed: list[Outcome] = []

    def pay(d: Delivery) -> None:
        [r] = d.publish(_confirm(d), at_once=True)
        routed.append(r.outcome)
        if d.attempt == 1:  # published already: the retry publishes it again
            raise RuntimeError("fails after publishing")

    _run(box, instances, pay, confirms, max_attempts=2, retry_backoff_seconds=0.01)
    _orders(box, 3)
    wait_for(lambda: sum(confirms.seen.values()) == 6, "6 confirmations")
    wait_for(lambda: not box.queue_depth(), "the queue drained")
    assert confirms.seen == Counter({0: 2, 1: 2, 2: 2})
    assert routed == [Outcome.ROUTED] * 6


def test_options_without_at_once_and_a_given_id_are_refused_naming_at_once(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    refused: list[str] = []
    confirms = Confirms()
    own_id = uuid.UUID(int=9)

    def pay(d: Delivery) -> None:
        for call in (
            lambda: d.publish(_confirm(d), delay=5.0, policy="drop"),  # type: ignore[call-overload]
            lambda: d.publish(Message(b"x", promoted={"t.Kind": "confirm"}, id=own_id)),
        ):
            try:
                call()
            except ValidationError as exc:
                refused.append(str(exc))
        d.publish([_confirm(d)])

    _run(box, instances, pay, confirms)
    _orders(box, 1)
    wait_for(lambda: sum(confirms.seen.values()) == 1, "the confirmation")
    assert refused == [
        "pay: Delivery.publish publishes with the completion and takes no options (delay, "
        "policy): pass at_once=True to publish now with them (a retry publishes again)",
        "pay: publish publishes with the completion and gives each message its id; message "
        f"{own_id} gives its own (publish it with publish(..., at_once=True))",
    ]
    wait_for(lambda: not box.queue_depth(), "the queue drained")
    assert confirms.seen == Counter({0: 1})
