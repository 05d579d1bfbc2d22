"""Which messages a read of many brings whole, on both backends, against the rules
written out in Python: in id order, a message whose parts hold more than ``max_bytes``
comes as its summary, and so does each one from the first whose bytes, added to those of
the messages before it within ``max_bytes``, pass ``total_bytes``. The query brings bytes
only within each message's share of the limits and reads the rest after; this checks
that it still decides as the rules say, whatever the sizes, part counts and limits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from messagebox.message import MessageSummary, StoredMessage
from messagebox.storage import spool

Parts = dict[str, bytes]

parts = st.dictionaries(
    st.sampled_from(["body", "a", "b", "c"]), st.binary(max_size=120), min_size=1, max_size=4
)
limits = st.one_of(st.none(), st.integers(-1, 500))


def expected(
    stored: dict[uuid.UUID, Parts],
    asked: Sequence[uuid.UUID],
    max_bytes: int | None,
    total_bytes: int | None,
) -> dict[uuid.UUID, bool]:
    """Per message read: whether it comes whole (else as its summary)."""
    if total_bytes is not None and max_bytes is not None and len(asked) * max_bytes <= total_bytes:
        total_bytes = None  # it cannot bind
    out: dict[uuid.UUID, bool] = {}
    running = 0
    for msg in sorted(set(asked) & set(stored)):
        size = sum(map(len, stored[msg].values()))
        whole = max_bytes is None or size <= max_bytes
        if whole and total_bytes is not None:
            running += size
            whole = running <= total_bytes
        out[msg] = whole
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(parts, min_size=1, max_size=10),
    st.data(),
    limits,
    limits.filter(lambda t: t is None or t >= 0),
)
def test_a_read_brings_whole_what_the_rules_say(
    shared_box: MessageBox,
    messages: list[Parts],
    data: st.DataObject,
    max_bytes: int | None,
    total_bytes: int | None,
) -> None:
    box = shared_box
    ids = sorted(uuid.uuid4() for _ in messages)
    batch = []
    for msg_id, message_parts in zip(ids, messages, strict=True):
        body = next(iter(message_parts))
        batch.append(Message(parts=message_parts, body_part=body, id=msg_id))
    box.publish(batch)  # routed nowhere: stored suspended, which a read does not mind
    stored = dict(zip(ids, messages, strict=True))
    unknown = uuid.uuid4()
    asked = data.draw(st.lists(st.sampled_from([*ids, unknown]), min_size=1, max_size=14))
    with box.store.transaction() as conn:
        read = spool.read_messages(
            conn, box.store.dialect, asked, max_bytes=max_bytes, total_bytes=total_bytes
        )
    want = expected(stored, asked, max_bytes, total_bytes)
    assert {m: isinstance(r, StoredMessage) for m, r in read.items()} == want
    for msg, found in read.items():
        sizes = {name: len(b) for name, b in stored[msg].items()}
        assert found.part_sizes == sizes
        if isinstance(found, StoredMessage):
            assert found.parts == stored[msg]
        else:
            assert isinstance(found, MessageSummary)
