"""Message bodies in storage: the spool row, its parts and their fragments.

A part is stored once, in fragments of :data:`FRAGMENT_SIZE` bytes: the first inline in
``mb_part``, the rest in ``mb_fragment``. File-object parts are read a fragment at a time
while publishing, and :func:`iter_part` reads one back a fragment at a time, so a large
part is never held in memory whole by the engine.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

import sqlalchemy as sa

from messagebox import clock, compiled
from messagebox.compiled import native
from messagebox.errors import UnknownMessage
from messagebox.message import Message, MessageSummary, PartData, StoredMessage
from messagebox.properties import Value, decode_context, encode_context
from messagebox.storage import arrays, recent, schema
from messagebox.storage.dialects import Dialect, Indexed, Same, Uuids
from messagebox.storage.ids import as_uuid, uuid7s

if TYPE_CHECKING:
    from messagebox._native import Columns

FRAGMENT_SIZE = 1 << 20


def _first_fragment(data: PartData) -> tuple[bytes, Iterator[bytes]]:
    """The first fragment and an iterator of the rest (read lazily from files)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if type(data) is bytes and len(data) <= FRAGMENT_SIZE:  # the common case, at once
        return data, iter(())
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data).cast("B")
        rest = (
            bytes(view[i : i + FRAGMENT_SIZE])
            for i in range(FRAGMENT_SIZE, len(view), FRAGMENT_SIZE)
        )
        return bytes(view[:FRAGMENT_SIZE]), rest
    stream: IO[bytes] = data

    def chunks() -> Iterator[bytes]:
        while chunk := stream.read(FRAGMENT_SIZE):
            yield chunk

    it = chunks()
    return next(it, b""), it


def write_messages(
    conn: sa.Connection,
    dialect: Dialect,
    ids: Sequence[uuid.UUID],
    messages: Sequence[Message],
    now: datetime,
    publisher: str,
) -> None:
    """Write spool rows, parts and fragments for messages (each stored once)."""
    dialect.insert_many(conn, message_rows(conn, dialect, ids, messages, now, publisher))


def message_rows(
    conn: sa.Connection,
    dialect: Dialect,
    ids: Sequence[uuid.UUID],
    messages: Sequence[Message],
    now: datetime,
    publisher: str,
) -> list[tuple[sa.Table, dict[str, Sequence[Any]]]]:
    """The spool rows, part links and parts of messages (with these ids), as columns per
    table, for the caller to insert with its other rows (fragments past a part's first
    are written here, as the part is read). The ids go as given (a :class:`Uuids`
    column stays one, converted once), and so do the parts' new ids to both tables.
    Where it was built, C makes the columns of a batch whose contexts it writes and
    whose parts are bytes of one fragment (the common batch: a fifth of the time)."""
    if not messages:
        return []
    part_ids = Uuids(uuid7s(sum(len(message.parts) for message in messages)))
    columns = (
        native.message_columns(messages, FRAGMENT_SIZE)
        if compiled.NATIVE and type(messages) is list
        else None
    )
    if columns is None:
        columns = _columns(conn, dialect, messages, part_ids)
    context, n_parts, body, owner, idx, name, size, n_fragments, data = columns
    if recent.keeping(conn):
        keep = [
            (ids[i], held)
            for i, message in enumerate(messages)
            if (held := recent.entry(context[i], message.body_part, now, publisher, message.parts))
        ]
        if keep:
            recent.written(conn, keep)
    n = len(messages)
    spool = {
        "id": ids,
        "context": context,
        "n_parts": n_parts,
        "body_part": body,
        "published_at": Same(now, n),
        "publisher": Same(publisher, n),
    }
    return [
        (schema.spool, spool),
        (
            schema.message_part,
            {"msg": Indexed(ids, owner), "idx": idx, "name": name, "part": part_ids},
        ),
        (schema.part, {"id": part_ids, "size": size, "n_fragments": n_fragments, "data": data}),
    ]


def _columns(
    conn: sa.Connection,
    dialect: Dialect,
    messages: Sequence[Message],
    part_ids: Uuids[uuid.UUID],
) -> Columns:
    """:func:`message_rows`' columns, as ``native.message_columns`` gives them (context,
    n_parts, body_part; then per part: its message's position, idx, name, size,
    n_fragments, first fragment), writing the further fragments of large parts."""
    context: list[str] = []
    n_parts: list[int] = []
    body: list[str] = []
    owner: list[int] = []
    idx_column: list[int] = []
    names: list[str] = []
    sizes: list[int] = []
    fragments: list[int] = []
    firsts: list[Any] = []
    # the columns' appends bound once: this runs for every message of such a batch
    add_context, add_n_parts, add_body = context.append, n_parts.append, body.append
    add_owner, add_idx, add_name = owner.append, idx_column.append, names.append
    add_size, add_fragments, add_first = sizes.append, fragments.append, firsts.append
    k = 0  # the next part's position in part_ids
    for i, message in enumerate(messages):
        add_context(encode_context(message.promoted, message.written))
        add_n_parts(len(message.parts))
        add_body(message.body_part)
        for idx, (name, data) in enumerate(message.parts.items()):
            if type(data) is bytes and len(data) <= FRAGMENT_SIZE:  # the common case
                first, size, n_fragments = data, len(data), 1
            else:
                first, rest = _first_fragment(data)
                size, seq = len(first), 0
                for seq, chunk in enumerate(rest, start=1):
                    dialect.insert(
                        conn,
                        schema.fragment,
                        {"part": [part_ids.values[k]], "seq": [seq], "data": [chunk]},
                    )
                    size += len(chunk)
                n_fragments = seq + 1
            add_owner(i)
            add_idx(idx)
            add_name(name)
            add_size(size)
            add_fragments(n_fragments)
            add_first(first)
            k += 1
    return context, n_parts, body, owner, idx_column, names, sizes, fragments, firsts


def promoted_page(
    conn: sa.Connection, after: uuid.UUID | None, limit: int
) -> list[tuple[uuid.UUID, dict[str, Value]]]:
    """Up to ``limit`` stored messages after ``after`` in id order (keyset paging), each
    with its promoted properties."""
    s = schema.spool
    query = sa.select(s.c.id, s.c.context).order_by(s.c.id).limit(limit)
    if after is not None:
        query = query.where(s.c.id > after)
    return [(row.id, decode_context(row.context)[0]) for row in conn.execute(query)]


def read_context(conn: sa.Connection, msg_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """Spool rows by message id."""
    rows = conn.execute(
        sa.select(schema.spool).where(arrays.one_of(conn, schema.spool.c.id, msg_ids))
    )
    return {r.id: r for r in rows}


def read_messages(
    conn: sa.Connection,
    dialect: Dialect,
    msg_ids: Sequence[uuid.UUID],
    *,
    max_bytes: int | None = None,
    total_bytes: int | None = None,
) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
    """Messages with their contexts and all their parts, in one query for the lot (its
    SQL the dialect's ``read_messages``), one more for any parts it left out, and one
    per part of several fragments (use :func:`iter_part` for large parts). A message
    whose parts hold more than ``max_bytes`` in all comes without them (a
    :class:`MessageSummary`), so that reading many never holds more than that much per
    message; so does one whose parts would take the bytes read, in id order, past
    ``total_bytes``. Ids not in the spool are left out.

    The query brings each message's bytes only when they are at most its share of the
    limits (:func:`_share`: ``total_bytes`` over the ids asked for, and ``max_bytes``),
    so that it never brings more than the limits allow; which messages come whole is
    then decided here, and the parts of one that does but was past its share (rare:
    messages are mostly small) are read by a second query."""
    if not msg_ids:
        return {}
    if (
        total_bytes is not None
        and max_bytes is not None
        and len(msg_ids) * max_bytes <= total_bytes
    ):
        total_bytes = None  # cannot bind
    # every row fetched first: on DuckDB a query of fragments ends this one's rows
    rows = dialect.fetch_messages(conn, msg_ids, _share(len(msg_ids), max_bytes, total_bytes))
    found: dict[uuid.UUID, StoredMessage | MessageSummary] = {}
    unread: dict[uuid.UUID, tuple[Any, ...]] = {}  # whole, but parts past their share
    running = 0  # the bytes of the messages within max_bytes so far, in id order
    for msg, spooled, sizes, held, parts in _grouped(rows):
        total = sum(sizes.values())
        whole = max_bytes is None or total <= max_bytes
        if whole and total_bytes is not None:
            running += total
            whole = running <= total_bytes
        if not whole:
            found[msg] = _message(msg, spooled, sizes, {})
        elif parts:
            unread[msg] = (spooled, sizes, held, parts)
        else:
            found[msg] = _message(msg, spooled, sizes, held)
    if unread:
        found.update(_read_parts(conn, unread))
    return found


Left = tuple[str, Any, int, Any]
"""A part the messages query left to read: its name, id, fragment count, and its first
fragment if the query brought it (None when the part was past its share)."""

Grouped = tuple[uuid.UUID, tuple[Any, ...], dict[str, int], dict[str, bytes], list[Left]]
"""A message as the messages query brings it: its id, its spool values, its parts'
sizes, the parts it brought whole, and the parts left to read."""


def _grouped(rows: Sequence[Any]) -> Iterator[Grouped]:
    """The messages query's rows (a row per part, in message and part order) by message."""
    last: object = None  # the id as fetched (on DuckDB its 16 bytes)
    spooled: tuple[Any, ...] = ()
    sizes: dict[str, int] = {}
    held: dict[str, bytes] = {}
    parts: list[Left] = []
    for msg, context, body_part, at, publisher, name, part_id, size, n, data in rows:
        if msg != last:
            if last is not None:
                yield as_uuid(last), spooled, sizes, held, parts
            last, spooled, sizes, held, parts = msg, (context, body_part, at, publisher), {}, {}, []
        if name is None:  # a spool row without parts
            continue
        sizes[name] = int(size)
        if data is not None and n == 1:
            held[name] = bytes(data)
        else:  # past its share (data None), or its further fragments to read
            parts.append((name, None if part_id is None else as_uuid(part_id), int(n), data))
    if last is not None:
        yield as_uuid(last), spooled, sizes, held, parts


def _share(n: int, max_bytes: int | None, total_bytes: int | None) -> int | None:
    """The most bytes the messages query brings of one message's parts, when ``n``
    messages are read: ``total_bytes`` shared out, and at most ``max_bytes`` (None: no
    limit)."""
    share = None if total_bytes is None else total_bytes // n
    if max_bytes is not None:
        share = max_bytes if share is None else min(share, max_bytes)
    return share


def _read_parts(
    conn: sa.Connection, unread: dict[uuid.UUID, tuple[Any, ...]]
) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
    """The messages whole by the limits whose parts the messages query left out (past
    their share) or brought only the first fragment of: those parts read by id."""
    p, f = schema.part, schema.fragment
    wanted = [
        part_id for *_, parts in unread.values() for _, part_id, _, got in parts if got is None
    ]
    first = (
        {
            r.id: r.data
            for r in conn.execute(
                sa.select(p.c.id, p.c.data).where(arrays.one_of(conn, p.c.id, wanted))
            ).all()
        }
        if wanted
        else {}
    )
    out: dict[uuid.UUID, StoredMessage | MessageSummary] = {}
    for msg, (spooled, sizes, held, parts) in unread.items():
        read = dict(held)
        for name, part_id, fragments, got in parts:
            chunks = [bytes(first[part_id] if got is None else got)]
            if fragments > 1:
                chunks.extend(
                    bytes(d)
                    for (d,) in conn.execute(
                        sa.select(f.c.data).where(f.c.part == part_id).order_by(f.c.seq)
                    ).all()
                )
            read[name] = b"".join(chunks)
        out[msg] = _message(msg, spooled, sizes, read)
    return out


def _message(
    msg_id: uuid.UUID, spooled: tuple[Any, ...], sizes: dict[str, int], held: dict[str, bytes]
) -> StoredMessage | MessageSummary:
    """A message read back: whole when all its parts were read, else its summary."""
    context, body_part, published_at, publisher = spooled
    promoted, written = decode_context(context)
    common: dict[str, Any] = {
        "id": msg_id,
        "promoted": promoted,
        "written": written,
        "body_part": body_part,
        "published_at": clock.fetched(published_at),
        "publisher": publisher,
        "part_sizes": sizes,
    }
    if len(held) == len(sizes):
        return StoredMessage(parts=held, **common)
    return MessageSummary(**common)


def read_message(conn: sa.Connection, dialect: Dialect, msg_id: uuid.UUID) -> StoredMessage:
    """A message with its context and all its parts (use :func:`iter_part` for large ones)."""
    found = read_messages(conn, dialect, [msg_id]).get(msg_id)
    if not isinstance(found, StoredMessage):
        raise UnknownMessage(f"no message {msg_id} in the spool")
    return found


def describe(conn: sa.Connection, dialect: Dialect, msg_id: uuid.UUID) -> MessageSummary:
    """A message's context and part sizes, without reading its parts."""
    found = read_messages(conn, dialect, [msg_id], max_bytes=-1).get(msg_id)
    if found is None:
        raise UnknownMessage(f"no message {msg_id} in the spool")
    return found if isinstance(found, MessageSummary) else found.summary()


def part_fragments(conn: sa.Connection, msg_id: uuid.UUID, name: str) -> tuple[uuid.UUID, int]:
    """A part's id and fragment count."""
    mp, p = schema.message_part, schema.part
    row = conn.execute(
        sa.select(p.c.id, p.c.n_fragments)
        .join(p, p.c.id == mp.c.part)
        .where(mp.c.msg == msg_id, mp.c.name == name)
    ).first()
    if row is None:
        raise UnknownMessage(f"message {msg_id} has no part {name!r}")
    return row[0], row[1]


def fragment(conn: sa.Connection, part_id: uuid.UUID, seq: int) -> bytes:
    """One fragment of a part (0 is the inline first one)."""
    if seq == 0:
        data = conn.execute(
            sa.select(schema.part.c.data).where(schema.part.c.id == part_id)
        ).scalar_one()
    else:
        f = schema.fragment
        data = conn.execute(
            sa.select(f.c.data).where(f.c.part == part_id, f.c.seq == seq)
        ).scalar_one()
    return bytes(data)


def release(conn: sa.Connection, dialect: Dialect, msgs: Iterable[uuid.UUID]) -> None:
    """Log the release of one reference per message given (a message given twice
    releases two)."""
    counts = Counter(msgs)
    if len(counts) == 1:  # one cached statement beats a bulk load for one row
        [(msg, n)] = counts.items()
        conn.execute(schema.ref_release.insert().values(msg=msg, n=n, logged_at=sa.func.now()))
    elif counts:
        now = clock.local_now()  # a log stamp only; nothing compares it with the DB clock
        dialect.insert(
            conn,
            schema.ref_release,
            {"msg": list(counts), "n": list(counts.values()), "logged_at": [now] * len(counts)},
        )
