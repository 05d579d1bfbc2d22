"""A host app running an orchestration, for crash and concurrency tests.

``Fulfilment`` is correlated on ``t.OrderId``: an order activates it (the instance
records it and publishes a ship-request); a payment, received by the running instance,
makes it publish a confirm whose body lists the kinds it handled, in order, and
complete. Orders without a payment leave it running (its state shows every order it
received). The ``sink`` service appends one line per delivery of a ship-request or a
confirm to the file ``MB_TEST_OUT``: ``<kind> <OrderId> <message id> <body>``. It is at
least once: a redelivered message gives the same message id again.

``MB_TEST_CRASH_STEP=N``: the process exits at once (code 9) inside its Nth
orchestration step, right after ``self.publish``: the step has not committed, the most
dangerous moment to die.

:func:`publish_orders` is run by publisher processes (``python -c``).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostApp, Orchestration, activate, receive
from messagebox.models import Outcome
from messagebox.predicates import P

app = HostApp(
    "orchestrator",
    dequeue_threads=2,
    poll_min_seconds=0.01,
    poll_max_seconds=0.2,
    heartbeat_seconds=0.2,
    dead_after_seconds=1.0,
    lease_seconds=2.0,
    retry_backoff_seconds=0.1,
    cleanup_interval_seconds=0,  # keep completed instances to inspect
)

_CRASH_STEP = int(os.environ.get("MB_TEST_CRASH_STEP", "0"))
_steps = itertools.count(1)
_steps_lock = threading.Lock()


def _published() -> None:
    """Called by every step right after ``self.publish``: die if it is the Nth."""
    if not _CRASH_STEP:
        return
    with _steps_lock:
        n = next(_steps)
    if n == _CRASH_STEP:
        os._exit(9)  # published in the step, but the step has not committed


class Progress(BaseModel):
    kinds: list[str] = []
    """The kinds of the messages handled, in the order handled."""
    messages: list[str] = []
    """Their message ids."""


class Fulfilment(Orchestration[Progress]):
    correlation = ("t.OrderId",)

    def _record(self, d: Delivery) -> None:
        self.state.kinds.append(str(d.properties["t.Kind"]))
        self.state.messages.append(str(d.message_id))

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self._record(d)
        n = self.state.kinds.count("order")
        self.publish(Message(f"ship-{n}".encode(), promoted={"t.Kind": "ship-request"}))
        _published()

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self._record(d)
        body = ",".join(self.state.kinds)
        self.publish(Message(body.encode(), promoted={"t.Kind": "confirm"}))
        _published()
        self.complete()


app.orchestration(Fulfilment)

_out_lock = threading.Lock()


@app.service("sink")
def sink(d: Delivery) -> None:
    line = f"{d.properties['t.Kind']} {d.properties['t.OrderId']} {d.message_id} "
    line += d.body.decode() + "\n"
    with _out_lock, open(os.environ["MB_TEST_OUT"], "a") as out:
        out.write(line)
        out.flush()
        os.fsync(out.fileno())


app.subscribe("sink", filter=P("t.Kind").in_(["ship-request", "confirm"]), name="sink")


def publish_orders(url: str, order_ids: list[str]) -> None:
    """Open the box, say ``ready``, read a start time (``time.time()``) from stdin and
    wait for it, then publish one order per id, each in its own transaction; print
    ``<order id> <message id>`` per published order."""
    with MessageBox(url, publisher=f"orders-{os.getpid()}") as box:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(start_at - time.time(), 0.0))
        for order_id in order_ids:
            message = Message(b"order", promoted={"t.Kind": "order", "t.OrderId": order_id})
            [routed] = box.publish([message])
            if routed.outcome is not Outcome.ROUTED:
                raise SystemExit(f"order {order_id} was not routed: {routed}")
            print(order_id, routed.message_id)
