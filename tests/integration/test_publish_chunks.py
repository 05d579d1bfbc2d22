"""A large publish is routed and written a chunk at a time in its one transaction
(issue 55, item 12: a million messages held 1.3 GiB more than the messages): the same
outcome as one pass, all or nothing, on both backends; and less held at once."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from messagebox import Message, MessageBox
from messagebox.errors import RoutingFailure, Throttled
from messagebox.models import Outcome, Suspension
from messagebox.predicates import P
from messagebox.routing import router as mb_router
from tests.conftest import table_counts


def batch(n: int) -> list[Message]:
    """Every third message matches nothing; every fifth starts a convoy (t.K) that a
    later one of another chunk follows."""
    return [
        Message(f"m{i}".encode(), promoted={"t.N": i % 3, "t.K": f"k{i % 5}"}) for i in range(n)
    ]


def setup(box: MessageBox) -> None:
    box.create_host("h", throttle_queue_depth=1000)
    box.subscribe("one", host="h", filter=P("t.N") == 1, name="one")
    box.subscribe("two", host="h", filter=P("t.N") >= 1, name="two")
    box.subscribe(
        "conv", host="h", filter=P("t.N") == 2, name="conv", correlation=["t.K"], kind="activation"
    )


def test_a_chunked_publish_stores_what_one_pass_stores(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup(box)
    whole = box.publish(batch(60), suspend={4: Suspension("bad", "refused")})
    monkeypatch.setattr(mb_router, "PUBLISH_CHUNK", 7)
    chunked = box.publish(batch(60), suspend={4: Suspension("bad", "refused")})
    assert [(r.outcome, len(r.subscriptions)) for r in chunked] == [
        (r.outcome, len(r.subscriptions)) for r in whole
    ]
    assert chunked[4].outcome is Outcome.SUSPENDED
    # five convoys, one instance each, made once by the first batch and followed after
    with box.store.transaction() as conn:
        from messagebox.storage import schema

        convoys = conn.execute(schema.convoy.select()).all()
    assert len(convoys) == 5


def test_a_chunked_publish_that_fails_late_stores_nothing(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup(box)
    monkeypatch.setattr(mb_router, "PUBLISH_CHUNK", 7)
    before = table_counts(box)
    messages = [Message(b"ok", promoted={"t.N": 1}) for _ in range(50)]
    messages.append(Message(b"nowhere", promoted={"t.N": 0}))  # in the last chunk
    with pytest.raises(RoutingFailure):
        box.publish(messages, policy="raise")
    assert table_counts(box) == before


def test_a_throttled_host_first_seen_in_a_later_chunk_throttles_the_whole_batch(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup(box)
    box.create_host("full", throttle_queue_depth=1)
    box.subscribe("f", host="full", filter=P("t.F") == 1, name="f")
    box.publish([Message(b"f", promoted={"t.F": 1}) for _ in range(3)])
    monkeypatch.setattr(mb_router, "PUBLISH_CHUNK", 7)
    before = table_counts(box)
    messages = [Message(b"ok", promoted={"t.N": 1}) for _ in range(20)]
    messages.append(Message(b"f", promoted={"t.F": 1}))
    with pytest.raises(Throttled):
        box.publish(messages, block=False)
    assert table_counts(box) == before
    # a batch whose own entries pass a threshold is not throttled by itself
    assert len(box.publish([Message(b"ok", promoted={"t.N": 1}) for _ in range(30)])) == 30


def test_a_large_publish_holds_a_chunk_of_work_not_the_whole_batch(
    duckdb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a publish allocates beside the messages and its results: chunked, a fraction
    of one pass over the whole batch."""

    def peak(chunk: int) -> int:
        monkeypatch.setattr(mb_router, "PUBLISH_CHUNK", chunk)
        with MessageBox(duckdb_url) as box:
            messages = [Message(b"x" * 100, promoted={"t.N": i}) for i in range(40_000)]
            gc.collect()
            tracemalloc.start()
            try:
                results = box.publish(messages)
                held, most = tracemalloc.get_traced_memory()  # held: the results, kept
            finally:
                tracemalloc.stop()
            assert len(results) == len(messages)
            return most - held

    with MessageBox(duckdb_url) as box:
        box.create_host("h")
        box.subscribe("s", host="h", filter=P("t.N") >= 0, name="s")
    whole, chunked = peak(100_000), peak(2_000)
    print(f"beside messages and results: one pass {whole >> 10} KiB, chunked {chunked >> 10} KiB")
    assert chunked < 0.4 * whole, (chunked, whole)
