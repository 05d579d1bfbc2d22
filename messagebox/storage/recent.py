"""Messages this process published or read lately, kept in memory (DuckDB).

A stored message never changes, and on a database that only one process opens
(DuckDB) every publish, read and delete of a message happens in this process. So
while a host instance of the database runs in this process (nobody else reads them),
a message published here is kept once its transaction has committed, and a host
instance's read of it is served from memory instead of a query: on DuckDB each
statement costs milliseconds, and reading the bodies of 50 claimed messages took
6-8 ms, more than delivering them. Cleanup forgets what it deletes when it commits.

Only whole messages of at most :data:`MESSAGE_BYTES` (their parts' bytes, each part in
one fragment) are kept, at most :data:`CACHE_BYTES` in all per database, the oldest
forgotten first. A PostgreSQL store keeps none: another process may delete a message.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.message import MessageSummary, StoredMessage
from messagebox.properties import decode_context

CACHE_BYTES = 64 << 20
"""At most this many bytes of messages (parts, context and a fixed cost each) are kept
per database."""

MESSAGE_BYTES = 256 * 1024
"""A message whose parts hold more than this is never kept (as a host instance never
reads more than this of one message with the rest of its batch)."""

ENTRY_BYTES = 600
"""What keeping one message costs beside its parts and context (objects, the index):
measured 625 bytes in all for a 5-byte body and a 90-character context."""


Kept = tuple[Any, ...]
"""A message as kept, one flat tuple: what keeping it costs in bytes; its context as
stored (decoded on each read), or as a read decoded it (copied on each read), so that
every reader gets its own dicts; its body part's name, time and publisher; then each
part's name and bytes. Flat and plain: a published message's holds no container, and
the garbage collector stops tracking it at its first collection (it never stops
tracking a named tuple or a dict, and a nested tuple only a level a collection): tens
of thousands of tracked objects kept would make every full collection slower."""


def _message(msg_id: uuid.UUID, kept: Kept) -> StoredMessage:
    context, body_part, published_at, publisher = kept[1:5]
    if isinstance(context, str):
        promoted, written = decode_context(context)
    else:
        promoted, written = dict(context[0]), dict(context[1])
    names, datas = kept[5::2], kept[6::2]
    return StoredMessage(
        id=msg_id,
        promoted=promoted,
        written=written,
        parts=dict(zip(names, datas, strict=True)),  # each reader its own dict
        body_part=body_part,
        published_at=published_at,
        publisher=publisher,
        part_sizes=dict(zip(names, map(len, datas), strict=True)),
    )


class Recent:
    """The messages kept for one database (shared by every store of it in the process:
    ``DatabaseLocal.recent``, made when the first opens, dropped when the last closes,
    so a database file removed and made anew between two opens starts with none)."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self.readers = 0
        """Host instances of the database running in this process: messages are kept
        only while one runs (nobody else reads them), and forgotten when the last
        stops."""
        self._kept: OrderedDict[uuid.UUID, Kept] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, items: Iterable[tuple[uuid.UUID, Kept]]) -> None:
        """Keep messages (committed) while a reader runs, forgetting the oldest past
        the limit."""
        with self._lock:
            if not self.readers:
                return
            kept = self._kept
            for msg_id, entry in items:
                old = kept.pop(msg_id, None)
                if old is not None:
                    self.used -= old[0]
                kept[msg_id] = entry
                self.used += entry[0]
            while self.used > self.limit and kept:
                _, old = kept.popitem(last=False)
                self.used -= old[0]

    def get(
        self, ids: Sequence[uuid.UUID], max_bytes: int | None = None
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """The kept messages among ``ids``: whole, or their summary where their parts
        hold more than ``max_bytes`` (as :func:`messagebox.storage.spool.read_messages`)."""
        with self._lock:
            found = [(i, e) for i in ids if (e := self._kept.get(i)) is not None]
        out: dict[uuid.UUID, StoredMessage | MessageSummary] = {}
        for msg_id, entry in found:
            message = _message(msg_id, entry)
            if max_bytes is not None and sum(message.part_sizes.values()) > max_bytes:
                out[msg_id] = message.summary()
            else:
                out[msg_id] = message
        return out

    def reader_started(self) -> None:
        with self._lock:
            self.readers += 1

    def reader_stopped(self) -> None:
        with self._lock:
            self.readers = max(0, self.readers - 1)
            if not self.readers:
                self._kept.clear()
                self.used = 0

    def forget(self, ids: Iterable[uuid.UUID]) -> None:
        with self._lock:
            for msg_id in ids:
                old = self._kept.pop(msg_id, None)
                if old is not None:
                    self.used -= old[0]


def entry(
    context: str,
    body_part: str,
    published_at: datetime,
    publisher: str,
    parts: Mapping[str, object],
) -> Kept | None:
    """A message being published, to keep: None when a part is not bytes (a file's is
    read while it is stored; text is stored as UTF-8) or the parts are too large."""
    if len(parts) == 1:  # the common case, without a loop
        [(name, data)] = parts.items()
        if type(data) is not bytes or len(data) > MESSAGE_BYTES:
            return None
        cost = len(data) + len(context) + ENTRY_BYTES
        return (cost, context, body_part, published_at, publisher, name, data)
    flat: list[object] = []
    size = 0
    for name, data in parts.items():
        if type(data) is not bytes:
            return None
        size += len(data)
        flat += (name, data)
    if size > MESSAGE_BYTES:
        return None
    cost = size + len(context) + ENTRY_BYTES
    return (cost, context, body_part, published_at, publisher, *flat)


def read(message: StoredMessage) -> Kept | None:
    """A message read from the store, to keep, or None when it is too large to."""
    size = sum(message.part_sizes.values())
    if size > MESSAGE_BYTES:
        return None
    context = (dict(message.promoted), dict(message.written))  # the reader may change its own
    cost = size + ENTRY_BYTES + 64 * (len(message.promoted) + len(message.written))
    head = (cost, context, message.body_part, message.published_at, message.publisher)
    return head + tuple(x for pair in message.parts.items() for x in pair)


# --- per transaction: kept when it commits, forgotten when a delete commits ---

_KEY = "mb_recent"
"""``conn.info`` key: the store's :class:`Recent` (set by ``Store.transaction``), if any."""
_WRITTEN = "mb_recent_written"
_DELETED = "mb_recent_deleted"


def begin(conn: sa.Connection, recent: Recent | None) -> None:
    conn.info[_KEY] = recent
    conn.info.pop(_WRITTEN, None)
    conn.info.pop(_DELETED, None)


def keeping(conn: sa.Connection) -> bool:
    """Whether this transaction's messages are kept when it commits (a host instance of
    the database runs in this process)."""
    found: Recent | None = conn.info.get(_KEY)
    return found is not None and found.readers > 0


def written(conn: sa.Connection, items: list[tuple[uuid.UUID, Kept]]) -> None:
    """Messages this transaction stored (kept if it commits; see :func:`keeping`)."""
    conn.info.setdefault(_WRITTEN, []).extend(items)


def deleted(conn: sa.Connection, ids: Sequence[uuid.UUID]) -> None:
    """Messages this transaction deleted (forgotten if it commits)."""
    if ids and conn.info.get(_KEY) is not None:
        conn.info.setdefault(_DELETED, []).extend(ids)


def take(conn: sa.Connection) -> tuple[list[tuple[uuid.UUID, Kept]], list[uuid.UUID]]:
    """What the transaction stored and deleted, taken (the caller puts and forgets them
    after the commit)."""
    return conn.info.pop(_WRITTEN, []), conn.info.pop(_DELETED, [])
