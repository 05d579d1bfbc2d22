"""Helpers shared by the orchestration tests: fast host settings, messages, a recording
sink service, and an app with orchestrations and the sink."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostApp, Orchestration
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema

FAST = {
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.1,
    "heartbeat_seconds": 0.2,
    "dead_after_seconds": 2.0,
    "retry_backoff_seconds": 0.05,
    "cleanup_interval_seconds": 0,
}


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``condition`` became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def msg(kind: str, order: object, **props: object) -> Message:
    return Message(
        f"{kind}:{order}".encode(), promoted={"t.Kind": kind, "t.OrderId": order, **props}
    )


class Sink:
    """A plain service recording what the orchestrations publish."""

    def __init__(self) -> None:
        self.got: list[tuple[str, object, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, d: Delivery) -> None:
        with self.lock:
            self.got.append((str(d.properties["t.Kind"]), d.properties.get("t.OrderId"), d.body))

    def kinds(self, kind: str) -> list[tuple[Any, bytes]]:
        """(order id, body) of each message of ``kind``."""
        with self.lock:
            return [(o, b) for k, o, b in self.got if k == kind]

    def orders(self, kind: str) -> list[object]:
        """The order id of each message of ``kind``."""
        return [o for o, _ in self.kinds(kind)]


def make_app(
    *orchestrations: type[Orchestration], sink_kinds: tuple[str, ...] = (), **settings: object
) -> tuple[HostApp, Sink]:
    """A host "orch" running the orchestrations, and a sink for the kinds given."""
    app = HostApp("orch", **{"dequeue_threads": 4, **FAST, **settings})  # type: ignore[arg-type]
    for cls in orchestrations:
        app.orchestration(cls)
    sink = Sink()
    if sink_kinds:
        app.add_service("sink", sink)
        app.subscribe("sink", filter=P("t.Kind").in_(list(sink_kinds)), name="sink")
    return app, sink


def settled(box: MessageBox) -> bool:
    """Nothing is being handled and nothing waits for the sink: what is left on the
    queue waits, unclaimed, for an orchestration."""
    return all(not q.leased and q.service != "sink" for q in box.queue_stats())


def waiting(box: MessageBox) -> list[tuple[str | None, int]]:
    """(service, entries) of each subscription with entries on the queue."""
    return [(q.service, q.depth) for q in box.queue_stats()]


def instance_rows(box: MessageBox) -> list[sa.Row]:
    si = mb_schema.service_instance
    with box.store.transaction() as conn:
        return list(conn.execute(sa.select(si).order_by(si.c.created_at)))
