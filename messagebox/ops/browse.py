"""Reads for looking around during an incident: the entries on a host's queue (ready,
held, blocked, leased, with what holds them) and stored messages with a promoted
property of a given value. (Orchestration instances: :mod:`messagebox.ops.orchestrations`.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.models import OnFailure, QueueState
from messagebox.order_keys import describe
from messagebox.properties import Value, encode_context
from messagebox.storage import arrays, ids, schema, suspension

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
    step or its key's (:attr:`key`); for ``held``, on an ordered subscription that stops
    on failure, the entry whose failure stopped it (None: the service was stopped
    otherwise)."""
    key: str | None = None
    """Its key, where its subscription is ordered by a property (as stored:
    :func:`messagebox.order_keys.describe` shows it)."""

    @property
    def holder(self) -> str | None:
        """What holds it, in words (None when nothing does)."""
        if self.state == "blocked" and self.key is not None:
            return (
                f"blocked: its key {describe(self.key)} is held by suspended entry {self.held_by}"
            )
        if self.state == "blocked":
            return f"blocked by suspended entry {self.held_by}"
        if self.state == "held" and self.held_by is not None:
            return f"held: its ordered subscription stopped when entry {self.held_by} was suspended"
        if self.state == "held":
            return "held: its service is stopped"
        return None


@dataclass(frozen=True)
class HeldKey:
    """A key that a suspended entry holds (a subscription ordered by a property that
    stops on failure): its later entries wait until that entry is resumed or terminated."""

    subscription: int
    name: str | None
    """The subscription's name (None if it was removed meanwhile)."""
    host: str | None
    key: str
    """As stored (:attr:`shown`: as a person reads it)."""
    entry: int
    """The suspended entry that holds it."""
    reason: str
    error: str | None
    """The last line of the entry's error."""
    suspended_at: datetime
    waiting: int
    """The key's entries on the queue, held behind it."""

    @property
    def shown(self) -> str:
        return describe(self.key)


def held_keys(conn: sa.Connection, host: str | None, limit: int) -> list[HeldKey]:
    """The keys suspended entries hold (of ``host``'s subscriptions, if given), oldest
    first, each with how many of its entries wait behind it."""
    s, sub, q = schema.suspended, schema.subscription, schema.queue
    waiting = (
        sa.select(sa.func.count())
        .where(q.c.sub == s.c.sub, q.c.order_key == s.c.order_key)
        .scalar_subquery()
    )
    query = (
        sa.select(
            s.c.id,
            s.c.sub,
            s.c.host,
            s.c.order_key,
            s.c.reason,
            s.c.error,
            s.c.suspended_at,
            sub.c.name,
            waiting.label("waiting"),
        )
        .join(sub, sub.c.id == s.c.sub, isouter=True)
        .where(s.c.holds_key == sa.true())
        .order_by(s.c.id)
        .limit(limit)
    )
    if host is not None:
        query = query.where(s.c.host == host)
    return [
        HeldKey(
            int(r.sub),
            r.name,
            r.host,
            r.order_key,
            int(r.id),
            r.reason,
            _last_line(r.error),
            r.suspended_at,
            int(r.waiting),
        )
        for r in conn.execute(query)
    ]


def _last_line(error: str | None) -> str | None:
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


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
        (suspension.key_held(), "blocked"),
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
            q.c.order_key,
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
            r.order_key,
        )
        for r in rows
    ]


def _holders(conn: sa.Connection, rows: Sequence[Any]) -> dict[int, int]:
    """The suspended entry holding each held or blocked entry of ``rows``, where one
    does: a blocked entry's instance's suspended step; a held entry's ordered
    subscription's suspended entry, when it stops on failure."""
    s, sub = schema.suspended, schema.subscription
    instances = sorted({r.instance_id for r in rows if r.shown == "blocked" and r.instance_id})
    keys = _key_holders(conn, [r for r in rows if r.shown == "blocked" and r.order_key is not None])
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
        if r.shown == "blocked" and r.order_key is not None:
            n = keys.get((int(r.sub), r.order_key))
        elif r.shown == "blocked":
            n = steps.get(r.instance_id)
        else:
            n = stoppers.get(int(r.sub))
        if r.shown in ("held", "blocked") and n is not None:
            found[int(r.id)] = n
    return found


def _key_holders(conn: sa.Connection, rows: Sequence[Any]) -> dict[tuple[int, str], int]:
    """The suspended entry holding the key of each of ``rows`` (blocked keyed entries)."""
    subs = sorted({int(r.sub) for r in rows})
    if not subs:
        return {}
    s = schema.suspended
    wanted = {(int(r.sub), r.order_key) for r in rows}
    found = conn.execute(
        sa.select(s.c.sub, s.c.order_key, sa.func.min(s.c.id))
        .where(arrays.one_of(conn, s.c.sub, subs), s.c.holds_key == sa.true())
        .group_by(s.c.sub, s.c.order_key)
    )
    return {(int(sub), k): int(n) for sub, k, n in found if (int(sub), k) in wanted}


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
