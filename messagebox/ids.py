"""Application-made ids: time-ordered UUIDs for messages and parts, blocks for the rest."""

from __future__ import annotations

import os
import time
import uuid

import sqlalchemy as sa

from messagebox.schema import ID_BLOCK, block_seq


def uuid7() -> uuid.UUID:
    """A version-7 UUID: milliseconds since the epoch, then random bits (index-friendly)."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80 | rand & ((1 << 80) - 1)
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # RFC 4122 variant
    return uuid.UUID(int=value)


def allocate(conn: sa.Connection, n: int) -> list[int]:
    """``n`` fresh ids, taking one sequence value per ``ID_BLOCK`` ids."""
    ids: list[int] = []
    while len(ids) < n:
        block = conn.execute(sa.select(block_seq.next_value())).scalar_one()
        base = int(block) * ID_BLOCK
        take = min(n - len(ids), ID_BLOCK)
        ids.extend(range(base, base + take))
    return ids
