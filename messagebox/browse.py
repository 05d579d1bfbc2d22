"""Reads for looking around during an incident: the entries on a host's queue (ready,
held, blocked, leased, with what holds them) and stored messages with a promoted
property of a given value. (Orchestration instances: :mod:`messagebox.orchestrations`.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox import arrays, ids, schema, suspension
from messagebox.models import OnFailure, QueueState
from messagebox.properties import Value, encode_context

QUEUE_STATES = ("ready", "held", "blocked", "leased")


@dataclass(frozen=True)
class QueueEntry:
    """An entry on a host's queue, as a peek shows it."""

    id: int
    message_id: uuid.UUID
    subscription: int
    state: str
    """``ready``, ``held`` (its subscription is stopped), ``blocked`` (a suspended entry
    of its service instance holds it) or ``leased`` (being delivered)."""
    priority: int
    attempts: int
    enqueued_at: datetime
    available_at: datetime
    lease_owner: str | None
    instance_id: str | None
    held_by: int | None = None
    """The suspended entry that holds it: for ``blocked``, its instance's suspended
    step; for ``held``, on an ordered subscription that stops on failure, the entry
    whose failure stopped it (None: the service was stopped otherwise)."""

    @property
    def holder(self) -> str | None:
        """What holds it, in words (None when nothing does)."""
        if self.state == "blocked":
            return f"blocked by suspended entry {self.held_by}"
        if self.state == "held" and self.held_by is not None:
            return f"held: its ordered subscription stopped when entry {self.held_by} was suspended"
        if self.state == "held":
            return "held: its service is stopped"
        return None


@dataclass(frozen=True)
class FoundMessage:
    id: uuid.UUID
    published_at: datetime
    publisher: str


def peek_queue(conn: sa.Connection, host: str, state: str | None, limit: int) -> list[QueueEntry]:
    """The first ``limit`` entries of ``host``'s queue in claim order (priority, then
    age), optionally of one state, each with what holds it."""
    q = schema.queue
    leased = q.c.lease_owner.is_not(None) & (q.c.lease_expires > sa.func.now())
    held = q.c.state == QueueState.HELD.value
    shown = sa.case(
        (leased, "leased"),
        (held, "held"),
        (q.c.instance_id.in_(suspension.holding()), "blocked"),
        else_="ready",
    )
    query = (
        sa.select(
            q.c.id,
            q.c.msg,
            q.c.sub,
            shown.label("shown"),
            q.c.priority,
            q.c.attempts,
            q.c.enqueued_at,
            q.c.available_at,
            q.c.lease_owner,
            q.c.instance_id,
        )
        .where(q.c.host == host)
        .order_by(q.c.priority.desc(), q.c.id)
        .limit(limit)
    )
    if state is not None:
        query = query.where(shown == state)
    rows = conn.execute(query).all()
    holders = _holders(conn, rows)
    return [
        QueueEntry(
            int(r.id),
            ids.as_uuid(r.msg),
            int(r.sub),
            r.shown,
            int(r.priority),
            int(r.attempts),
            r.enqueued_at,
            r.available_at,
            r.lease_owner,
            r.instance_id,
            holders.get(int(r.id)),
        )
        for r in rows
    ]


def _holders(conn: sa.Connection, rows: Sequence[Any]) -> dict[int, int]:
    """The suspended entry holding each held or blocked entry of ``rows``, where one
    does: a blocked entry's instance's suspended step; a held entry's ordered
    subscription's suspended entry, when it stops on failure."""
    s, sub = schema.suspended, schema.subscription
    instances = sorted({r.instance_id for r in rows if r.shown == "blocked"})
    subs = sorted({int(r.sub) for r in rows if r.shown == "held"})
    steps: dict[str, int] = {}
    if instances:
        steps = {
            i: int(n)
            for i, n in conn.execute(
                sa.select(s.c.instance_id, sa.func.min(s.c.id))
                .where(arrays.one_of(conn, s.c.instance_id, instances), s.c.resumable == sa.true())
                .group_by(s.c.instance_id)
            )
        }
    stoppers: dict[int, int] = {}
    if subs:
        stoppers = {
            int(i): int(n)
            for i, n in conn.execute(
                sa.select(s.c.sub, sa.func.min(s.c.id))
                .join(sub, sub.c.id == s.c.sub)
                .where(
                    arrays.one_of(conn, s.c.sub, subs),
                    s.c.resumable == sa.true(),
                    s.c.ordered == sa.true(),
                    sub.c.on_failure == OnFailure.STOP.value,
                )
                .group_by(s.c.sub)
            )
        }
    found: dict[int, int] = {}
    for r in rows:
        n = steps.get(r.instance_id) if r.shown == "blocked" else stoppers.get(int(r.sub))
        if r.shown in ("held", "blocked") and n is not None:
            found[int(r.id)] = n
    return found


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def find_by_property(
    conn: sa.Connection, name: str, value: Value, limit: int
) -> list[FoundMessage]:
    """Stored messages whose promoted ``name`` is ``value`` (of its type), newest first.
    Reads the stored contexts (no index): meant for an operator's search, not a hot path."""
    encoded = encode_context({name: value}, {})  # {"promoted":{"NAME":[tag,value]},...}
    fragment = encoded[len('{"promoted":{') : encoded.index('},"written"')]
    s = schema.spool
    pattern = f"%{_like_escaped(fragment)}%"
    rows = conn.execute(
        sa.select(s.c.id, s.c.published_at, s.c.publisher, s.c.context)
        .where(s.c.context.like(pattern, escape="\\"))
        .order_by(s.c.published_at.desc(), s.c.id.desc())
    )
    wanted = json.loads(encoded)["promoted"][name]
    found: list[FoundMessage] = []
    for r in rows:  # the text also matches a written property of that name: look closer
        if json.loads(r.context)["promoted"].get(name) != wanted:
            continue
        found.append(
            FoundMessage(
                ids.as_uuid(r.id),
                r.published_at,
                r.publisher,
            )
        )
        if len(found) >= limit:
            break
    return found
