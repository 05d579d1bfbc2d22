"""A delivery reads its message once, and a thread reading one batch never holds up a
thread reading another (``functools.cached_property`` on Python 3.11 held one lock for
the attribute across every delivery: each thread's first ``d.message`` waited while
another thread's batch was read from the store)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from typing import Any, cast

from messagebox.hosts.service import Delivery, MessageBatch
from messagebox.message import StoredMessage


class _Batch:
    """A claimed batch whose read waits for ``release`` (a slow store), counting reads."""

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release = release
        self.reads = 0

    def get(self, message_id: uuid.UUID) -> StoredMessage:
        self.reads += 1
        if self.release is not None:
            assert self.release.wait(10.0), "the slow read was never released"
        return StoredMessage(
            id=message_id,
            promoted={"t.N": 1},
            written={},
            parts={"body": b"x"},
            body_part="body",
            published_at=datetime(2026, 1, 1, tzinfo=UTC),
            publisher="t",
            part_sizes={"body": 1},
        )


def _delivery(batch: _Batch) -> Delivery:
    return Delivery(
        cast(Any, None),
        entry_id=1,
        message_id=uuid.uuid4(),
        subscription=cast(Any, None),
        attempt=1,
        host_instance="h",
        batch=cast(MessageBatch, batch),
    )


def test_a_thread_reading_its_batch_does_not_hold_up_another() -> None:
    # Given one delivery whose batch read is stuck in the store
    release = threading.Event()
    slow = _delivery(_Batch(release))
    reader = threading.Thread(target=lambda: slow.message)
    reader.start()
    try:
        # When another thread's delivery of another batch reads its message
        done = threading.Event()
        other = _delivery(_Batch())

        def read_other() -> None:
            assert other.message.body == b"x"
            done.set()

        threading.Thread(target=read_other).start()
        # Then it gets it while the first read is still stuck
        assert done.wait(5.0), "the second delivery waited for the first one's read"
        assert not slow.__dict__.get("_message")
    finally:
        release.set()
        reader.join(10.0)
    assert slow.message.body == b"x"


def test_a_delivery_reads_its_message_and_summary_once() -> None:
    batch = _Batch()
    d = _delivery(batch)
    assert d.message is d.message
    assert d.summary is d.summary
    assert d.properties == {"t.N": 1}
    assert batch.reads == 2  # one for the message, one for the summary
