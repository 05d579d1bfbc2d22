"""Messages this process published or read, held in memory (messagebox.storage.recent): on DuckDB
a host's read of a message published here runs no query, and gives exactly what the
store holds; nothing of a transaction that rolled back is held, cleanup's deletes are
forgotten, large messages and file parts are never held, the memory is bounded, and
a database made anew starts with none. PostgreSQL holds none (another process may
delete a message)."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from messagebox.delivery.cleanup import run as run_cleanup
from messagebox.errors import AlreadyExists, UnknownMessage, ValidationError
from messagebox.hosts import HostApp
from messagebox.message import MessageSummary, StoredMessage
from messagebox.models import InstanceInfo
from messagebox.predicates import P
from messagebox.properties import encode_context
from messagebox.storage import recent, spool
from tests import strategies
from tests.conftest import claim, complete


@pytest.fixture
def duck(duckdb_url: str) -> Iterator[MessageBox]:
    """A DuckDB store with a host instance of it registered in this process (messages
    are held only while one runs)."""
    box = MessageBox(duckdb_url, publisher="tests")
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("t.a").exists() | P("t.b").exists(), name="all")
    reader = box.consumer("h", "reader")
    at = datetime.now(UTC)
    reader.register(InstanceInfo("reader", "h", "here", 1, at, at, "running"))
    try:
        yield box
    finally:
        reader.unregister()
        box.close()


class Statements:
    """Counts the statements a store runs while in its ``with`` block: through
    SQLAlchemy, and the hot ones its dialect runs on the driver's cursor (``fetch``,
    ``fetch_messages``)."""

    def __init__(self, box: MessageBox) -> None:
        self.n = 0
        self._engine = box.store.engine
        self._dialect = box.store.dialect

    def _count(self, *_args: object) -> None:
        self.n += 1

    def __enter__(self) -> Statements:
        sa.event.listen(self._engine, "before_cursor_execute", self._count)
        for name in ("fetch", "fetch_messages"):  # the latter: DuckDB's runs no fetch
            setattr(self._dialect, name, self._counted(getattr(self._dialect, name)))
        return self

    def _counted(self, run: Any) -> Any:
        def counted(*args: Any) -> Any:
            self._count()
            return run(*args)

        return counted

    def __exit__(self, *_exc: object) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._count)
        del self._dialect.fetch, self._dialect.fetch_messages


def stored(box: MessageBox, ids: list[uuid.UUID]) -> dict[uuid.UUID, StoredMessage]:
    """What the store itself holds (read with no memory in between)."""
    with box.store.transaction() as conn:
        read = spool.read_messages(conn, box.store.dialect, ids)
    return {k: v for k, v in read.items() if isinstance(v, StoredMessage)}


def test_a_message_published_here_is_read_without_a_query(duck: MessageBox) -> None:
    # Given messages published by this process
    routed = duck.publish([Message(b"m%d" % i, promoted={"t.a": i}) for i in range(5)])
    ids = [r.message_id for r in routed]
    # When a host instance's batch reads them, and one is read alone and described
    with Statements(duck) as statements:
        batch = duck.read_messages(ids, max_bytes=1 << 18)
        one = duck.read_message(ids[0])
        summary = duck.message_summary(ids[1])
    # Then no statement ran, and each is what the store holds
    assert statements.n == 0
    assert batch == stored(duck, ids)
    assert one == batch[ids[0]]
    assert isinstance(summary, MessageSummary)
    assert not isinstance(summary, StoredMessage)
    assert summary == stored(duck, [ids[1]])[ids[1]].summary()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    promoted=st.dictionaries(st.sampled_from(["t.a", "t.b"]), strategies.values, min_size=1),
    written=st.dictionaries(st.sampled_from(["w.x", "w.y"]), strategies.values, max_size=2),
    parts=st.dictionaries(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=5),
        st.binary(max_size=64),
        min_size=1,
        max_size=3,
    ),
)
def test_what_memory_gives_is_what_the_store_gives(
    duck: MessageBox,
    promoted: dict[str, object],
    written: dict[str, object],
    parts: dict[str, bytes],
) -> None:
    # Given any message, published here
    try:
        message = Message(parts=parts, promoted=promoted, written=written)
    except ValidationError:
        return  # not a valid message: refused before anything is stored
    [routed] = duck.publish([message])
    msg = routed.message_id
    # When it is read from memory, and read from the store
    with Statements(duck) as statements:
        held = duck.read_messages([msg], max_bytes=None)[msg]
    assert statements.n == 0  # from memory
    # Then the two are equal, value for value and type for type
    expected = stored(duck, [msg])[msg]
    assert held == expected
    assert [type(v) for v in held.promoted.values()] == [
        type(v) for v in expected.promoted.values()
    ]
    assert [type(v) for v in held.written.values()] == [type(v) for v in expected.written.values()]
    assert held.published_at == expected.published_at
    assert held.published_at.utcoffset() == timedelta(0)


def test_a_reader_changing_its_message_changes_no_other_readers(duck: MessageBox) -> None:
    [routed] = duck.publish([Message(b"x", promoted={"t.a": 1})])
    first = duck.read_message(routed.message_id)
    first.promoted["t.a"] = 2
    first.parts["body"] = b"changed"
    again = duck.read_message(routed.message_id)
    assert (again.promoted, again.parts) == ({"t.a": 1}, {"body": b"x"})


def test_nothing_of_a_publish_that_failed_is_held(duck: MessageBox) -> None:
    # Given a message published with an id, then a batch that repeats that id
    given = uuid.uuid4()
    duck.publish([Message(b"first", promoted={"t.a": 1}, id=given)])
    other = uuid.uuid4()
    with pytest.raises(AlreadyExists):
        duck.publish(
            [
                Message(b"new", promoted={"t.a": 2}, id=other),
                Message(b"again", promoted={"t.a": 3}, id=given),
            ]
        )
    # Then neither of the refused batch's messages is held, and the first is unchanged
    assert duck.read_messages([other], max_bytes=None) == {}
    with pytest.raises(UnknownMessage):
        duck.read_message(other)
    assert duck.read_message(given).body == b"first"


def test_cleanup_forgets_what_it_deletes(duck: MessageBox) -> None:
    # Given a message held in memory, delivered and completed
    [routed] = duck.publish([Message(b"x", promoted={"t.a": 1})])
    assert duck.read_message(routed.message_id).body == b"x"
    [entry] = claim(duck, "h")
    complete(duck, entry)
    # When cleanup deletes it
    report = run_cleanup(duck.store)
    assert report.messages == 1
    # Then it is no longer read, from memory or the store
    with pytest.raises(UnknownMessage):
        duck.read_message(routed.message_id)
    assert duck.read_messages([routed.message_id], max_bytes=None) == {}


def test_large_messages_and_file_parts_are_read_from_the_store(duck: MessageBox) -> None:
    large = b"L" * (recent.MESSAGE_BYTES + 1)
    routed = duck.publish(
        [
            Message(large, promoted={"t.a": 1}),
            Message(parts={"body": b"b", "file": io.BytesIO(b"f" * 10)}, promoted={"t.a": 2}),
            Message(parts={"text": "t"}, promoted={"t.a": 3}),
        ]
    )
    assert duck.store.recent is not None
    assert len(duck.store.recent) == 0
    ids = [r.message_id for r in routed]
    assert duck.read_message(ids[0]).body == large
    assert duck.read_message(ids[1]).parts == {"body": b"b", "file": b"f" * 10}
    assert duck.read_message(ids[2]).parts == {"text": b"t"}
    # once read, the small ones are held; the large one is not
    assert len(duck.store.recent) == 2
    assert duck.read_message(ids[1]) == stored(duck, [ids[1]])[ids[1]]


def test_memory_is_bounded_and_the_oldest_are_forgotten_first() -> None:
    kept = recent.Recent(limit=10_000)
    kept.reader_started()
    at = datetime.now(UTC)
    ids = [uuid.UUID(int=i) for i in range(100)]
    for i in ids:
        entry = recent.entry(encode_context({}, {}), "body", at, "p", {"body": b"x" * 500})
        assert entry is not None
        kept.put([(i, entry)])
        assert kept.used <= kept.limit
    held = kept.get(ids)
    assert list(held) == ids[-len(held) :]  # the newest
    assert 0 < len(held) < 100
    kept.forget(ids)
    assert (len(kept), kept.used) == (0, 0)


def test_a_database_made_anew_starts_with_nothing_held(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'again.duckdb'}"
    with MessageBox(url) as box:
        box.create_host("h")
        box.subscribe("all", host="h", filter=P("t.a").exists())
        [routed] = box.publish([Message(b"x", promoted={"t.a": 1})])
    (tmp_path / "again.duckdb").unlink()
    with MessageBox(url) as box, pytest.raises(UnknownMessage):
        box.read_message(routed.message_id)


def test_two_stores_of_one_database_share_what_is_held(duck: MessageBox, duckdb_url: str) -> None:
    # Given a second store of the database in this process (as a host instance opens)
    with MessageBox(duckdb_url) as host_side:
        # When the first publishes
        [routed] = duck.publish([Message(b"x", promoted={"t.a": 1})])
        # Then the second reads it without a query
        with Statements(host_side) as statements:
            assert host_side.read_message(routed.message_id).body == b"x"
        assert statements.n == 0
    # and closing one keeps it held for the other
    assert duck.store.recent is not None
    assert len(duck.store.recent) == 1


def test_postgresql_holds_nothing(pg_url: str) -> None:
    with MessageBox(pg_url) as box:
        assert box.store.recent is None
        box.create_host("h")
        box.subscribe("all", host="h", filter=P("t.a").exists())
        [routed] = box.publish([Message(b"x", promoted={"t.a": 1})])
        with Statements(box) as statements:
            assert box.read_message(routed.message_id).body == b"x"
        assert statements.n > 0


def test_nothing_is_held_while_no_host_instance_runs_here(duckdb_url: str) -> None:
    # Given a store with no host instance running in this process (a publishing job)
    box = MessageBox(duckdb_url)
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("t.a").exists())
    held = box.store.recent
    assert held is not None
    box.publish([Message(b"x", promoted={"t.a": 1})])
    # Then nothing it publishes is held
    assert len(held) == 0
    # When a host instance of it starts here, what is published next is held
    app = HostApp("h")
    app.add_service("all", lambda _d: None)
    instance = app.instance(duckdb_url)
    instance.start()
    assert held.readers == 1
    box.publish([Message(b"y", promoted={"t.a": 2})])
    assert len(held) >= 1
    # and when the last one stops, all is forgotten
    instance.stop(5.0)
    assert (held.readers, len(held), held.used) == (0, 0, 0)
    box.publish([Message(b"z", promoted={"t.a": 3})])
    assert len(held) == 0
    box.close()
