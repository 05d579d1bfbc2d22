"""Reading many stored messages at once (``MessageBox.read_messages``, as a host reads a
claimed batch): each with its context and every part in part order, a message past
``max_bytes`` as its summary only, a part of several fragments whole, unknown ids left
out. A message after one with a part of several fragments is read too (on DuckDB the
fragments' query ended the batch's, and the messages after it were left out)."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.errors import ValidationError
from messagebox.hosts import service
from messagebox.message import MessageSummary, StoredMessage
from messagebox.predicates import P
from messagebox.storage import recent, schema
from messagebox.storage.spool import FRAGMENT_SIZE


@pytest.fixture(autouse=True, params=["kept", "store"])
def source(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, box: MessageBox
) -> Iterator[str]:
    """Each test twice on DuckDB: the messages this process published read from memory
    (messagebox.storage.recent, while a host instance of the store runs here), then all read
    from the store."""
    held = box.store.recent
    if request.param == "store":
        monkeypatch.setattr(recent.Recent, "get", lambda self, ids, max_bytes=None: {})
    elif held is not None:
        held.reader_started()  # as a host instance does when it starts
    yield str(request.param)
    if request.param == "kept" and held is not None:
        held.reader_stopped()


def test_a_batch_reads_whole_messages_summaries_and_fragments(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("a.Id").exists())
    big = bytes(range(256)) * (FRAGMENT_SIZE * 3 // 2 // 256)  # 1.5 fragments
    small, fragmented, large = (uuid.UUID(int=i) for i in (1, 2, 3))  # in read order
    box.publish(
        [
            Message(parts={"z": b"one", "a": "twö"}, promoted={"a.Id": 1}, id=small),
            Message(b"x" * 5000, promoted={"a.Id": 2}, written={"a.Note": "n"}, id=large),
            Message(
                parts={"body": b"b", "blob": io.BytesIO(big)}, promoted={"a.Id": 3}, id=fragmented
            ),
        ]
    )
    unknown = uuid.uuid4()

    read = box.read_messages([small, large, unknown], max_bytes=4096)
    assert set(read) == {small, large}
    whole, summary = read[small], read[large]
    assert isinstance(whole, StoredMessage)
    assert list(whole.parts.items()) == [("z", b"one"), ("a", "twö".encode())]  # part order
    assert whole.part_sizes == {"z": 3, "a": 4}
    assert whole.promoted == {"a.Id": 1}
    assert isinstance(summary, MessageSummary)
    assert not isinstance(summary, StoredMessage)
    assert summary.part_sizes == {"body": 5000}
    assert summary.written == {"a.Note": "n"}

    everything = box.read_messages([large, fragmented])
    whole_large = everything[large]
    assert isinstance(whole_large, StoredMessage)
    assert whole_large.parts == {"body": b"x" * 5000}
    blob = everything[fragmented]
    assert isinstance(blob, StoredMessage)
    assert blob.parts == {"body": b"b", "blob": big}
    assert blob.part_sizes == {"body": 1, "blob": len(big)}
    assert blob.published_at == whole.published_at
    with box.store.transaction() as conn:  # the stored instant, with a zone (both reads)
        stored = conn.execute(sa.select(schema.spool.c.published_at).limit(1)).scalar_one()
    for message in (whole, summary, blob):
        assert message.published_at.utcoffset() is not None
        assert message.published_at == stored
    assert box.read_messages([]) == {}


@pytest.mark.parametrize("source", ["store"], indirect=True)  # what is read
def test_a_batch_reads_parts_up_to_its_total_bytes_in_id_order(box: MessageBox) -> None:
    # Given, in id order, a message too large for the batch (past max_bytes), then four
    # of 100 bytes in two parts of 50, and a read of at most 250 bytes in all
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("a.Id").exists())
    ids = [uuid.UUID(int=i) for i in range(1, 6)]
    box.publish(
        [Message(b"x" * 5000, promoted={"a.Id": 0}, id=ids[0])]
        + [
            Message(parts={"a": b"a" * 50, "b": b"b" * 50}, promoted={"a.Id": i}, id=ids[i])
            for i in range(1, 5)
        ]
    )
    # When the batch is read
    read = box.read_messages(list(reversed(ids)), max_bytes=4096, total_bytes=250)
    # Then the large one comes as its summary and takes none of the bytes; the next two
    # come whole; the third would pass 250 with its second part, so it comes as its
    # summary (a message is read whole or not at all), and so does the last
    whole = [i for i in ids if isinstance(read[i], StoredMessage)]
    assert whole == ids[1:3]
    assert all(isinstance(read[i], MessageSummary) for i in ids if i not in whole)
    assert [read[i].part_sizes for i in ids[1:]] == [{"a": 50, "b": 50}] * 4
    assert read[ids[2]].parts == {"a": b"a" * 50, "b": b"b" * 50}  # type: ignore[union-attr]


@pytest.mark.parametrize("source", ["store"], indirect=True)  # what is read
def test_a_batch_past_its_total_bytes_reads_the_rest_in_chunks(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given six messages of 100 bytes, a batch that reads at most 250 bytes at a time,
    # and every read recorded
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("a.Id").exists())
    ids = [uuid.UUID(int=i) for i in range(1, 7)]
    box.publish([Message(b"m" * 100, promoted={"a.Id": i}, id=ids[i]) for i in range(6)])
    monkeypatch.setattr(service, "BATCH_READ_TOTAL", 250)
    reads: list[int] = []
    read_messages = box.read_messages

    def recorded(message_ids: Any, **options: Any) -> Any:
        reads.append(len(message_ids))
        return read_messages(message_ids, **options)

    monkeypatch.setattr(box, "read_messages", recorded)
    batch = service.MessageBatch(box, list(reversed(ids)))
    # When its handlers ask for every message, the last one first
    got = [batch.get(i) for i in reversed(ids)]
    # Then each comes whole, read in chunks of two (the third would pass 250 bytes):
    # the first read asks for all six, each next for those not read yet
    assert [m.body for m in got] == [b"m" * 100] * 6  # type: ignore[union-attr]
    assert reads == [6, 4, 2]
    assert batch.get(uuid.uuid4()) is None  # an id not in the spool: none, no more reads
    assert reads == [6, 4, 2]


def _stored_and_recorded(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch, n: int
) -> tuple[list[uuid.UUID], list[list[uuid.UUID]]]:
    """``n`` stored messages' ids, and the ids of every read of the box from now on."""
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("a.Id").exists())
    ids = [uuid.UUID(int=i) for i in range(1, n + 1)]
    box.publish([Message(b"m", promoted={"a.Id": i}, id=ids[i]) for i in range(n)])
    reads: list[list[uuid.UUID]] = []
    read_messages = box.read_messages

    def recorded(message_ids: Any, **options: Any) -> Any:
        reads.append(list(message_ids))
        return read_messages(message_ids, **options)

    monkeypatch.setattr(box, "read_messages", recorded)
    return ids, reads


@pytest.mark.parametrize("source", ["store"], indirect=True)  # what is read
def test_batches_sharing_a_read_let_go_of_what_they_finished(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a read shared by two batches: messages 1-3 for the first, 3-5 for the
    # second (message 3 has an entry in each, as when it goes to two subscriptions)
    ids, reads = _stored_and_recorded(box, monkeypatch, 6)
    first, second = ids[0:3], ids[2:5]
    shared = service.MessageBatch(box, first + second)
    assert all(shared.get(i) is not None for i in first)
    assert reads == [ids[0:5]]  # one read for both batches
    # When the first batch ends, its messages are let go, but the one the second wants
    shared.done(first)
    assert [shared.get(i) is not None for i in first] == [False, False, True]
    assert all(shared.get(i) is not None for i in second)
    assert len(reads) == 1  # nothing read again
    shared.done(second)
    assert [shared.get(i) for i in ids[0:5]] == [None] * 5


@pytest.mark.parametrize("source", ["store"], indirect=True)  # what is read
def test_a_shared_read_made_after_a_batch_ended_skips_its_messages(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, reads = _stored_and_recorded(box, monkeypatch, 4)
    shared = service.MessageBatch(box, ids)
    shared.done(ids[:2])  # a batch whose services read no body ended first
    assert shared.get(ids[3]) is not None
    assert reads == [ids[2:]]


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_bytes", -1), ("total_bytes", -1), ("total_bytes", 1.5), ("max_bytes", True)],
)
def test_a_read_refuses_a_byte_limit_that_is_not_a_count(
    box: MessageBox, option: str, value: object
) -> None:
    with pytest.raises(ValidationError, match=option):
        box.read_messages([uuid.uuid4()], **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("source", ["kept"], indirect=True)
def test_messages_held_in_memory_come_whole_whatever_the_total_read(box: MessageBox) -> None:
    # Given six messages of 100 bytes this process published (held in memory on DuckDB)
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("a.Id").exists())
    ids = [uuid.UUID(int=i) for i in range(1, 7)]
    box.publish([Message(b"m" * 100, promoted={"a.Id": i}, id=ids[i]) for i in range(6)])
    # When they are asked for with at most 250 bytes to read
    got = box.read_messages(ids, max_bytes=4096, total_bytes=250)
    # Then those held come whole (nothing is read for them), the rest as the store gives
    whole = [i for i in ids if isinstance(got[i], StoredMessage)]
    if box.store.recent is not None:
        assert whole == ids
    else:
        assert whole == ids[:2]
