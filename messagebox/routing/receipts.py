"""Receipts: which inputs a receive location has published, recorded in the publishing
transaction so that an input is never published twice."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from messagebox.errors import AlreadyReceived, ValidationError
from messagebox.storage import schema

Receipt = tuple[str, str, Sequence[int]]
"""(location, key, indexes of the batch's messages published for it)."""


def record(
    conn: sa.Connection, receipts: Sequence[Receipt], ids: Sequence[uuid.UUID], now: datetime
) -> None:
    """Record receipts for a batch whose message ids are ``ids``; raises
    :class:`AlreadyReceived` if a key has one already."""
    keys = [(loc, key) for loc, key, _ in receipts]
    if len(set(keys)) != len(keys):
        raise ValidationError("the batch records one receipt twice")
    refuse_received(conn, keys)
    conn.execute(
        schema.receipt.insert(),
        [
            {
                "location": loc,
                "key": key,
                "messages": json.dumps([str(ids[i]) for i in indexes]),
                "received_at": now,
            }
            for loc, key, indexes in receipts
        ],
    )


def refuse_received(
    conn: sa.Connection, keys: Sequence[tuple[str, str]], cause: Exception | None = None
) -> None:
    """Raise :class:`AlreadyReceived` if a (location, key) has a receipt already."""
    r = schema.receipt
    found = conn.execute(
        sa.select(r.c.location, r.c.key, r.c.messages).where(
            r.c.location.in_(sorted({loc for loc, _ in keys})),
            r.c.key.in_([k for _, k in keys]),
        )
    ).all()
    dupes = [row for row in found if (row.location, row.key) in set(keys)]
    if dupes:
        raise AlreadyReceived(
            f"{dupes[0].location}: input {dupes[0].key!r} was published already"
            + (f" (and {len(dupes) - 1} more)" if len(dupes) > 1 else "")
            + "; nothing was stored",
            message_ids=json.loads(dupes[0].messages),
        ) from cause


def lookup(conn: sa.Connection, location: str, keys: Sequence[str]) -> dict[str, list[uuid.UUID]]:
    """Of ``keys``, those ``location`` has recorded, with the message ids of each."""
    r = schema.receipt
    rows = conn.execute(
        sa.select(r.c.key, r.c.messages).where(r.c.location == location, r.c.key.in_(list(keys)))
    ).all()
    return {row.key: [uuid.UUID(m) for m in json.loads(row.messages)] for row in rows}
