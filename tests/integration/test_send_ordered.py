"""An ordered send port keeps publish order through retries, and a custom send adapter
registered by scheme is used like the built-in ones (both backends)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from messagebox import Message, MessageBox, adapters
from messagebox.adapters import Outbound, SendAdapter, register
from messagebox.hosts import HostApp
from messagebox.predicates import P


class Recording(SendAdapter):
    """``record://<name>``: appends each body to a shared list; fails the first try of
    every body listed in ``fail_once``."""

    schemes = ("record",)
    sent: ClassVar[dict[str, list[bytes]]] = {}
    fail_once: ClassVar[set[bytes]] = set()
    lock = threading.Lock()

    def send(self, body: bytes, message: Outbound) -> str:
        with self.lock:
            if body in self.fail_once:
                self.fail_once.discard(body)
                raise OSError(f"refusing {body!r} once")
            self.sent.setdefault(self.url, []).append(body)
        return self.url


@pytest.fixture(autouse=True)
def recording() -> Iterator[None]:
    register(send=Recording)
    Recording.sent.clear()
    Recording.fail_once.clear()
    yield
    adapters._send.pop("record", None)  # leave the registry as other tests expect it


def test_an_ordered_send_port_keeps_publish_order_through_retries(backend_url: str):
    # Given an ordered send port through a custom adapter, which refuses message 3 once
    app = HostApp(
        "out",
        dequeue_threads=4,
        claim_batch=5,
        poll_min_seconds=0.01,
        poll_max_seconds=0.05,
        cleanup_interval_seconds=0,
    )
    port = app.send_port(
        "in-order",
        filter=P("t.N") >= 0,
        transport="record://ordered",
        retry_count=2,
        retry_interval=0.2,
        ordered=True,
    )
    Recording.fail_once.add(b"3")
    inst = app.instance(backend_url)
    try:
        inst.start()
        # When 20 messages are published one after another
        for n in range(20):
            inst.box.publish([Message(str(n).encode(), promoted={"t.N": n})])
        deadline = time.monotonic() + 20
        while len(Recording.sent.get("record://ordered", [])) < 20:
            assert time.monotonic() < deadline, Recording.sent
            time.sleep(0.02)
    finally:
        inst.stop(timeout=5)
    # Then they were sent in publish order, message 3 after its retry and before 4
    assert Recording.sent["record://ordered"] == [str(n).encode() for n in range(20)]
    assert port.stats.snapshot()["retried"] == 1
    with MessageBox(backend_url) as box:
        assert box.suspended() == []
