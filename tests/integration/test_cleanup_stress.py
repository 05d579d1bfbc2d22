"""The cleanup job runs while a publisher and two consumers work (docs/concepts.md: Spool): it
never deletes a message that is still referenced, and once everything is consumed it
leaves spool, parts and reference logs empty. A short run is in the default suite; the
30-second one is marked slow."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P
from tests.conftest import table_counts

SETTINGS: dict[str, Any] = {
    "poll_min_seconds": 0.005,
    "poll_max_seconds": 0.05,
    "retry_backoff_seconds": 0.0,
    "heartbeat_seconds": 0.2,
    # not the subject here: once, in the whole suite on a loaded 2-core machine, a
    # heartbeat came 2 s late and its entries were (rightly) delivered again, which the
    # exact count below does not allow
    "dead_after_seconds": 10.0,
    "cleanup_interval_seconds": 0.0,
    "dequeue_threads": 2,
    "claim_batch": 5,
}


def stress(box: MessageBox, seconds: float) -> None:
    box.create_host("h", **SETTINGS)
    box.subscribe("a", host="h", filter=P("s.N") >= 0, name="a")
    box.subscribe("b", host="h", filter=P("s.Third") == 0, name="b")
    problems: list[str] = []
    handled = [0]
    lock = threading.Lock()

    def check(d: Delivery) -> None:
        n = d.properties["s.N"]
        if d.body != f"payload {n}".encode() * 3:  # the whole message, parts and context
            problems.append(f"message {d.message_id} read back wrong")
        with lock:
            handled[0] += 1

    consumers = [
        HostInstance(box, "h", {"a": check, "b": check}, settings=SETTINGS).start()
        for _ in range(2)
    ]
    stop = threading.Event()
    published = [0, 0]  # messages, entries
    cleaned = [0]

    def publisher() -> None:
        n = 0
        while not stop.is_set():
            # at most a thousand entries ahead of the consumers: publishing outruns
            # delivery, and the queue must drain within the test's deadline
            while published[1] - handled[0] > 1_000 and not stop.is_set():
                stop.wait(0.005)
            batch = [
                Message(f"payload {i}".encode() * 3, promoted={"s.N": i, "s.Third": i % 3})
                for i in range(n, n + 20)
            ]
            routed = box.publish(batch)
            published[0] += len(routed)
            published[1] += sum(len(r.subscriptions) for r in routed)
            n += 20
            time.sleep(0.005)

    def cleaner() -> None:
        while not stop.is_set():
            cleaned[0] += box.cleanup(batch=50).messages

    threads = [threading.Thread(target=publisher), threading.Thread(target=cleaner)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 60
    while box.queue_depth():
        assert time.monotonic() < deadline, "consumers did not drain the queue"
        time.sleep(0.05)
    for c in consumers:
        c.stop()
    failures = sum(c.stats.snapshot()["failed"] for c in consumers)
    assert problems == []
    assert failures == 0  # a deleted message would fail its delivery (UnknownMessage)
    assert handled[0] == published[1]
    assert box.suspended() == []
    cleaned[0] += box.cleanup().messages
    assert cleaned[0] == published[0]
    assert cleaned[0] > 100  # cleanup really ran alongside
    counts = table_counts(box)
    for table in (
        "mb_spool",
        "mb_message_part",
        "mb_part",
        "mb_fragment",
        "mb_ref_add",
        "mb_ref_release",
        "mb_queue",
        "mb_suspended",
    ):
        assert counts[table] == 0, table


def test_cleanup_is_safe_under_load(box: MessageBox) -> None:
    stress(box, 3.0)


@pytest.mark.slow
def test_cleanup_is_safe_under_load_for_30_seconds(box: MessageBox) -> None:
    stress(box, 30.0)
