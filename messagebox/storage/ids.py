"""Application-made ids: time-ordered UUIDs for messages and parts, blocks for the rest."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from messagebox import compiled
from messagebox.compiled import native
from messagebox.storage import capabilities
from messagebox.storage.schema import ID_BLOCK, block_seq

_SEED = "mb_id_seed"
"""``conn.info`` key: a sequence value read by another statement, for the next block."""

_BLOCKS = "mb_id_blocks"
"""``conn.info`` key: the :class:`Blocks` a transaction takes its ids from, if any."""


_RANDOM_BITS = ((1 << 80) - 1) & ~(0xF << 76) & ~(0x3 << 62)
"""The 80 low bits of a version-7 UUID less its version and variant bits."""
_VERSION_7 = 0x7 << 76 | 0x2 << 62  # version 7, RFC 4122 variant


if native is not None:
    native.setup(uuid.UUID, uuid.SafeUUID.unknown)

_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def _uuid(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be a 128-bit int, without the
    constructor's argument checks: half the cost, and it runs for every message and
    part published. The object is the same: a ``uuid.UUID`` with ``int`` and
    ``is_safe`` set, as its constructor leaves it."""
    made = _new(uuid.UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _UNKNOWN)
    return made


def as_uuid(value: object) -> uuid.UUID:
    """A UUID as a driver returns it: a ``uuid.UUID`` as it is; its 16 bytes, as
    DuckDB's hot statements give it (``CAST(... AS BLOB)``: DuckDB makes each UUID it
    returns through ``uuid.UUID``'s checks, 1-2 us a value more); or its text."""
    if isinstance(value, uuid.UUID):
        return value
    if type(value) is bytes and len(value) == 16:
        return _uuid(int.from_bytes(value))
    return uuid.UUID(str(value))


def fetchable(conn: sa.Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """A UUID column as a hot statement fetches it: on DuckDB its 16 bytes, read back
    with :func:`as_uuid` (see there); elsewhere the column."""
    if capabilities.of(conn).uuids_as_bytes:
        return sa.cast(column, sa.LargeBinary).label(getattr(column, "name", None))
    return column


def uuid5(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """``uuid.uuid5(namespace, name)``, the same UUID at a third of the cost (it names
    each message a step publishes)."""
    digest = hashlib.sha1(namespace.bytes + name.encode(), usedforsecurity=False).digest()
    return _uuid(int.from_bytes(digest[:16]) & _NOT_VERSION | _VERSION_5)


_NOT_VERSION = ~(0xF000 << 64 | 0xC000 << 48) & ((1 << 128) - 1)
_VERSION_5 = 0x5000 << 64 | 0x8000 << 48
"""The version (5) and variant (RFC 4122) bits of a name-based UUID."""


def uuid7s(n: int) -> list[uuid.UUID]:
    """``n`` version-7 UUIDs: milliseconds since the epoch, then random bits
    (index-friendly), from one read of the random source."""
    ms = (time.time_ns() // 1_000_000) & ((1 << 48) - 1)
    rand = os.urandom(10 * n)
    if compiled.NATIVE:
        return native.uuid7s(ms, rand)
    return _uuid7s(ms, rand)


def _uuid7s(ms: int, rand: bytes) -> list[uuid.UUID]:
    """:func:`uuid7s` in Python, from its time and random bytes (10 a UUID)."""
    head = ms << 80 | _VERSION_7
    number = int.from_bytes
    return [_uuid(head | number(rand[i : i + 10]) & _RANDOM_BITS) for i in range(0, len(rand), 10)]


def uuid_bytes(values: Sequence[object]) -> bytes | None:
    """Each UUID's 16 bytes, big-endian, joined (a UUID column's Arrow buffer); None if
    a value is not a ``uuid.UUID`` (text, None)."""
    if compiled.NATIVE:
        try:
            return native.uuid_bytes(values)
        except TypeError:
            return None
    try:
        return b"".join([v.int.to_bytes(16, "big") for v in values])  # type: ignore[attr-defined]
    except AttributeError:
        return None


def uuid7() -> uuid.UUID:
    """A version-7 UUID (see :func:`uuid7s`)."""
    return uuid7s(1)[0]


class Blocks:
    """The rest of the last id block one process took, handed out in order.

    For a database only this process opens (DuckDB): ids stay increasing in the order
    they are handed out, and a publish needs no statement for them. Sequence values are
    not given back on rollback, so a block is never handed out twice. One per database
    in the process, shared by its stores (``DatabaseLocal.blocks``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0

    def take(self, conn: sa.Connection, n: int) -> list[int]:
        ids: list[int] = []
        with self._lock:
            while len(ids) < n:
                if self._next >= self._end:
                    self._next = _block(conn)
                    self._end = self._next + ID_BLOCK
                take = min(n - len(ids), self._end - self._next)
                ids.extend(range(self._next, self._next + take))
                self._next += take
        return ids


def begin(conn: sa.Connection, blocks: Blocks | None) -> None:
    """Take this transaction's ids from ``blocks`` (None: a block per call)."""
    conn.info[_BLOCKS] = blocks
    conn.info.pop(_SEED, None)


def seed(conn: sa.Connection, value: int) -> None:
    """A sequence value read by another statement: the transaction's next block."""
    conn.info[_SEED] = value


def _block(conn: sa.Connection) -> int:
    seeded: int | None = conn.info.pop(_SEED, None)
    if seeded is not None:
        return seeded * ID_BLOCK
    return int(conn.execute(sa.select(block_seq.next_value())).scalar_one()) * ID_BLOCK


def allocate(conn: sa.Connection, n: int) -> list[int]:
    """``n`` fresh ids: from the process's block where the transaction has one, else
    taking one sequence value per ``ID_BLOCK`` ids."""
    blocks: Blocks | None = conn.info.get(_BLOCKS)
    if blocks is not None:
        return blocks.take(conn, n)
    ids: list[int] = []
    while len(ids) < n:
        base = _block(conn)
        take = min(n - len(ids), ID_BLOCK)
        ids.extend(range(base, base + take))
    return ids
