"""A host instance's idleness (``HostInstance.idle_seconds``, what ``host run
--until-idle`` waits for), on both backends: none before its first empty claim, none
while a batch is in hand even when its other threads find nothing, and it starts
again from nothing when new work comes."""

from __future__ import annotations

import threading
from collections.abc import Callable

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostApp, HostInstance
from messagebox.predicates import P
from tests.integration.orchestration_support import wait_until


def _app(handled: list[int], gate: threading.Event) -> HostApp:
    app = HostApp("idler", dequeue_threads=3, claim_batch=1, poll_max_seconds=0.05)

    @app.service("work")
    def work(d: Delivery) -> None:
        gate.wait(30)
        handled.append(int(d.properties["t.N"]))  # type: ignore[arg-type]

    app.subscribe("work", filter=P("t.N") >= 0, name="work")
    return app


def test_idle_only_with_nothing_claimed_and_nothing_in_hand(
    box: MessageBox, running: Callable[..., HostInstance]
) -> None:
    handled: list[int] = []
    gate = threading.Event()
    app = _app(handled, gate)
    app.setup(box)
    box.publish([Message(b"x", promoted={"t.N": 1})])
    instance = running(app)
    # one thread holds the message while the others' claims come back empty
    wait_until(lambda: instance._parts.idleness.empty_since is not None, 30, "an empty claim")
    assert instance.idle_seconds() == 0.0  # exactly: any time counted would show
    assert handled == []
    gate.set()
    wait_until(lambda: handled == [1], 30, "the message handled")
    wait_until(lambda: instance.idle_seconds() > 0.2, 30, "the instance idle")
    # new work: busy again, idle again after, counted from its end
    box.publish([Message(b"x", promoted={"t.N": 2})])
    wait_until(lambda: instance.idle_seconds() < 0.2, 30, "the instance busy")
    wait_until(lambda: handled == [1, 2], 30, "the second message handled")
    wait_until(lambda: instance.idle_seconds() > 0.2, 30, "the instance idle again")


def test_not_idle_before_it_has_looked(box: MessageBox) -> None:
    app = _app([], threading.Event())
    app.setup(box)
    instance = app.instance(box.store.url)
    try:
        assert instance.idle_seconds() == 0.0  # never started: it has not claimed
    finally:
        instance.box.close()
