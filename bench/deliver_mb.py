"""messagebox in ``bench.deliver``: the bench host and subscription, the backlog, and a
:class:`~messagebox.hosts.instance.HostInstance` as a consumer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.deliver_common import (
    COUNT_EVERY_S,
    HOST,
    POLL_MAX_S,
    POLL_MIN_S,
    PUBLISH_BATCH,
    SERVICE,
    Add,
    Body,
    EventLike,
    noop,
)
from messagebox.engine import MessageBox
from messagebox.hosts.instance import HostInstance
from messagebox.hosts.service import Delivery
from messagebox.message import Message
from messagebox.predicates import P


def mb_settings(threads: int, batch: int) -> dict[str, Any]:
    return {
        "dequeue_threads": threads,
        "claim_batch": batch,
        "max_in_flight": max(1_000, threads * batch),
        "cleanup_interval_seconds": 0,
        "poll_min_seconds": POLL_MIN_S,
        "poll_max_seconds": POLL_MAX_S,
    }


def mb_open(url: str, n: int) -> MessageBox:
    """A MessageBox with the bench host and one catch-all subscription."""
    box = MessageBox(url, publisher="bench.deliver")
    box.create_host(
        HOST,
        poll_min_seconds=POLL_MIN_S,
        poll_max_seconds=POLL_MAX_S,
        throttle_queue_depth=max(100_000, n + 1),
    )
    box.subscribe(SERVICE, host=HOST, filter=P("b.N") >= 0, name=SERVICE)
    return box


def mb_body(box: MessageBox | str, threads: int, batch: int, *, record: bool = False) -> Body:
    """A host instance on ``box`` (or a MessageBox it opens on that URL)."""

    def body(ready: Callable[[], None], go: EventLike, stop: EventLike, add: Add) -> dict[str, Any]:
        mb = box if isinstance(box, MessageBox) else MessageBox(box, publisher="bench.deliver")
        received: list[tuple[str, float]] = []

        def record_handler(delivery: Delivery) -> None:
            received.append((str(delivery.message_id), time.time()))

        try:
            inst = HostInstance(
                mb,
                HOST,
                {SERVICE: record_handler if record else noop},
                settings=mb_settings(threads, batch),
            )
            ready()
            go.wait()
            inst.start()
            reported = 0
            try:
                while not stop.wait(COUNT_EVERY_S):
                    completed = inst.stats.snapshot()["completed"]
                    add(completed - reported)
                    reported = completed
            finally:
                inst.stop()
            completed = inst.stats.snapshot()["completed"]
            add(completed - reported)
            return {"completed": completed, "received": received}
        finally:
            if mb is not box:
                mb.close()

    return body


def mb_publish(box: MessageBox, n: int) -> None:
    for start in range(0, n, PUBLISH_BATCH):
        box.publish(
            [
                Message(b"x", promoted={"b.N": i})
                for i in range(start, min(n, start + PUBLISH_BATCH))
            ]
        )
