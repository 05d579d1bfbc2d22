"""Messages this process published or read lately, kept in memory (DuckDB).

A stored message never changes, and on a database that only one process opens
(DuckDB) every publish, read and delete of a message happens in this process. So a
message published here is kept, once its transaction has committed, and a host
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
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

import sqlalchemy as sa

from messagebox.message import MessageSummary, StoredMessage
from messagebox.properties import Value, decode_context

CACHE_BYTES = 64 << 20
"""At most this many bytes of messages (parts, context and a fixed cost each) are kept
per database."""

MESSAGE_BYTES = 256 * 1024
"""A message whose parts hold more than this is never kept (as a host instance never
reads more than this of one message with the rest of its batch)."""

ENTRY_BYTES = 600
"""What keeping one message costs beside its parts and context (objects, the index):
measured 625 bytes in all for a 5-byte body and a 90-character context."""


class Kept(NamedTuple):
    """A message as kept: its context as stored (decoded on each read), or as a read
    decoded it (copied on each read), so that every reader gets its own dicts; and its
    parts' bytes."""

    context: str | tuple[dict[str, Value], dict[str, Value]]
    body_part: str
    published_at: datetime
    publisher: str
    parts: dict[str, bytes]
    size: int

    def message(self, msg_id: uuid.UUID) -> StoredMessage:
        if isinstance(self.context, str):
            promoted, written = decode_context(self.context)
        else:
            promoted, written = dict(self.context[0]), dict(self.context[1])
        return StoredMessage(
            id=msg_id,
            promoted=promoted,
            written=written,
            parts=dict(self.parts),  # each reader its own dict
            body_part=self.body_part,
            published_at=self.published_at,
            publisher=self.publisher,
            part_sizes={name: len(data) for name, data in self.parts.items()},
        )


class Recent:
    """The messages kept for one database (shared by every store of it in the process)."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self.limit = limit
        self.used = 0
        self._kept: OrderedDict[uuid.UUID, Kept] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, items: Iterable[tuple[uuid.UUID, Kept]]) -> None:
        """Keep messages (committed), forgetting the oldest past the limit."""
        with self._lock:
            kept = self._kept
            for msg_id, entry in items:
                old = kept.pop(msg_id, None)
                if old is not None:
                    self.used -= old.size
                kept[msg_id] = entry
                self.used += entry.size
            while self.used > self.limit and kept:
                _, old = kept.popitem(last=False)
                self.used -= old.size

    def get(
        self, ids: Sequence[uuid.UUID], max_bytes: int | None = None
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """The kept messages among ``ids``: whole, or their summary where their parts
        hold more than ``max_bytes`` (as :func:`messagebox.spool.read_messages`)."""
        with self._lock:
            found = [(i, e) for i in ids if (e := self._kept.get(i)) is not None]
        out: dict[uuid.UUID, StoredMessage | MessageSummary] = {}
        for msg_id, entry in found:
            message = entry.message(msg_id)
            if max_bytes is not None and sum(message.part_sizes.values()) > max_bytes:
                out[msg_id] = message.summary()
            else:
                out[msg_id] = message
        return out

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.used = 0

    def forget(self, ids: Iterable[uuid.UUID]) -> None:
        with self._lock:
            for msg_id in ids:
                old = self._kept.pop(msg_id, None)
                if old is not None:
                    self.used -= old.size


_OPEN: dict[str, tuple[Recent, int]] = {}
"""Per database open in this process (by its key): its kept messages and how many
stores have it open. They live while one does: a database file removed and made
anew between two opens starts with none."""
_GUARD = threading.Lock()


def opened(key: str) -> Recent:
    """The kept messages of a database that only this process opens, for a store that
    opens it (give them back with :func:`closed`)."""
    with _GUARD:
        found, n = _OPEN.get(key, (None, 0))
        if found is None:
            found = Recent()
        _OPEN[key] = (found, n + 1)
        return found


def closed(key: str) -> None:
    """A store of the database closed: the last one forgets its kept messages."""
    with _GUARD:
        found, n = _OPEN.get(key, (None, 0))
        if found is None:
            return
        if n > 1:
            _OPEN[key] = (found, n - 1)
        else:
            del _OPEN[key]


def entry(
    context: str, body_part: str, published_at: datetime, publisher: str, parts: dict[str, bytes]
) -> Kept | None:
    """A message to keep, or None when it is too large to."""
    size = sum(map(len, parts.values()))
    if size > MESSAGE_BYTES:
        return None
    return Kept(
        context, body_part, published_at, publisher, parts, size + len(context) + ENTRY_BYTES
    )


def read(message: StoredMessage) -> Kept | None:
    """A message read from the store, to keep, or None when it is too large to."""
    size = sum(message.part_sizes.values())
    if size > MESSAGE_BYTES:
        return None
    context = (dict(message.promoted), dict(message.written))  # the reader may change its own
    cost = size + ENTRY_BYTES + 64 * (len(message.promoted) + len(message.written))
    return Kept(
        context, message.body_part, message.published_at, message.publisher, message.parts, cost
    )


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
    """Whether this transaction's messages are kept when it commits."""
    return conn.info.get(_KEY) is not None


def written(conn: sa.Connection, items: list[tuple[uuid.UUID, Kept]]) -> None:
    """Messages this transaction stored (kept if it commits)."""
    if items and conn.info.get(_KEY) is not None:
        conn.info.setdefault(_WRITTEN, []).extend(items)


def deleted(conn: sa.Connection, ids: Sequence[uuid.UUID]) -> None:
    """Messages this transaction deleted (forgotten if it commits)."""
    if ids and conn.info.get(_KEY) is not None:
        conn.info.setdefault(_DELETED, []).extend(ids)


def take(conn: sa.Connection) -> tuple[list[tuple[uuid.UUID, Kept]], list[uuid.UUID]]:
    """What the transaction stored and deleted, taken (the caller applies it after the
    commit, with :func:`apply`)."""
    return conn.info.pop(_WRITTEN, []), conn.info.pop(_DELETED, [])


def apply(recent: Recent, stored: list[tuple[uuid.UUID, Kept]], gone: list[uuid.UUID]) -> None:
    if stored:
        recent.put(stored)
    if gone:
        recent.forget(gone)
