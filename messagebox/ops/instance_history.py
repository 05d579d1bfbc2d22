"""One orchestration instance in full (docs/operations.md: Orchestration instances): its
saved state, the messages that reached it in its order with what became of each, the
messages its steps published, and their tracked events. Runs inside the caller's
transaction.

Made from what the store keeps: the queue entries waiting for the instance, its
suspended entries and timers; and, while tracking is on, the ``delivered`` events of its
steps and the ``terminated`` events of its termination (their detail names the
instance: :func:`messagebox.delivery.service_instances.step_detail`,
:func:`messagebox.ops.orchestrations.terminated_detail`), with every event of those
messages. Its steps' publications are found by their ids, which the instance and the
step's version fix (:func:`messagebox.delivery.service_instances.message_ids`), in the spool or
in tracking.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from messagebox.delivery.service_instances import message_ids
from messagebox.models import QueueState
from messagebox.ops import orchestrations
from messagebox.ops.orchestrations import ServiceInstanceView
from messagebox.steps import TIMER_PUBLISHER
from messagebox.storage import arrays, ids, schema, tracking
from messagebox.storage.tracking import TrackedEvent

MAX_STEPS = 1000
"""The newest steps whose publications are looked for."""
MAX_EVENTS = 2000
"""Tracked events shown at most (the newest)."""
_SLACK = timedelta(minutes=1)
"""Around the instance's life, where its steps' events are looked for."""


@dataclass(frozen=True)
class InstanceMessage:
    """A message that reached the instance, and what became of it."""

    entry: int
    """Its queue (or suspended) entry: the instance takes its messages in this order."""
    message_id: uuid.UUID
    subscription: int | None
    outcome: str
    """``handled`` (a step consumed it), ``terminated`` (with the instance),
    ``suspended``, or, still queued, ``ready``, ``blocked`` (behind its instance's
    suspended entry), ``held`` (the service is stopped) or ``leased`` (its step is
    running)."""
    at: datetime | None
    """When it was handled, terminated, suspended, or queued."""
    detail: str | None
    """Handled: the host instance; suspended: the reason and error; leased: the host
    instance; blocked: what blocks it."""
    failures: int = 0
    """Failed attempts (tracked)."""
    timeout: bool = False
    """A timeout: the instance's timer fired."""
    held_by: int | None = None
    """Blocked: the suspended entry that holds it."""


@dataclass(frozen=True)
class Publication:
    """A message one of the instance's steps published."""

    message_id: uuid.UUID
    step: int
    """The instance's version its step made (1: the first step)."""
    published_at: datetime | None
    subscriptions: tuple[int, ...]
    """The subscriptions it was routed to (tracked)."""


@dataclass(frozen=True)
class InstanceDetail:
    """One instance in full."""

    instance: ServiceInstanceView
    version: int | None
    """Its version: the steps committed (None while pending; 0 when it was terminated
    pending)."""
    data: Any
    """Its saved data as stored (JSON: ``state``, the orchestration's state, and
    ``timers``); None while no step has committed."""
    messages: tuple[InstanceMessage, ...]
    published: tuple[Publication, ...]
    history: tuple[TrackedEvent, ...]
    """The tracked events of those messages, oldest first."""
    tracking: bool
    """Whether tracking is on (without it, handled steps are not known)."""


def detail(conn: sa.Connection, instance_id: str) -> InstanceDetail:
    """The instance ``instance_id``, stored or pending (:class:`UnknownInstance` when
    nothing names it)."""
    row = orchestrations.read(conn, instance_id)
    [view] = orchestrations.views(conn, [row])
    waiting, suspended = _entries(conn, instance_id)
    ended = _ended(conn, instance_id, row.created_at, row.updated_at) if row.data else []
    published = _published(conn, instance_id, row.version or 0)
    in_ids = [ids.as_uuid(r.msg) for r in (*waiting, *suspended, *ended)]
    events = _events(conn, [*in_ids, *published])
    timeouts = _timeouts(conn, in_ids) | {
        e.message_id
        for e in events
        if e.event == tracking.PUBLISHED and e.detail == TIMER_PUBLISHER
    }
    messages = _messages(waiting, suspended, ended, events, timeouts)
    routed: dict[uuid.UUID, list[int]] = {}
    for e in events:
        if e.event == tracking.ROUTED and e.subscription is not None:
            routed.setdefault(e.message_id, []).append(e.subscription)
    return InstanceDetail(
        instance=view,
        version=row.version,
        data=json.loads(row.data) if row.data is not None and row.version else None,
        messages=tuple(messages),
        published=tuple(
            Publication(m, step, at, tuple(routed.get(m, ())))
            for m, (step, at) in sorted(published.items(), key=lambda p: (p[1][0], str(p[0])))
        ),
        history=tuple(events),
        tracking=tracking.read_settings(conn).enabled,
    )


def _entries(conn: sa.Connection, instance_id: str) -> tuple[list[Any], list[Any]]:
    """Its queued entries (each with ``shown``: ``leased``, ``held`` or empty) and its
    suspended entries, by id."""
    q, s = schema.queue, schema.suspended
    leased = q.c.lease_owner.is_not(None) & (q.c.lease_expires > sa.func.now())
    shown = sa.case((leased, "leased"), (q.c.state == QueueState.HELD.value, "held"), else_="")
    waiting = conn.execute(
        sa.select(q, shown.label("shown")).where(q.c.instance_id == instance_id).order_by(q.c.id)
    ).all()
    suspended = conn.execute(
        sa.select(s).where(s.c.instance_id == instance_id).order_by(s.c.id)
    ).all()
    return list(waiting), list(suspended)


def _ended(
    conn: sa.Connection, instance_id: str, created_at: datetime, updated_at: datetime
) -> list[Any]:
    """The tracked events that name the instance in their detail, within its life: the
    ``delivered`` events of its steps' messages, the ``terminated`` events of the
    messages its termination took."""
    t = schema.tracking
    pattern = "%instance " + instance_id.replace("_", "\\_").replace("%", "\\%") + "%"
    return list(
        conn.execute(
            sa.select(t.c.event, t.c.msg, t.c.entry, t.c.sub, t.c.tracked_at, t.c.detail).where(
                t.c.tracked_at >= created_at - _SLACK,
                t.c.tracked_at <= updated_at + _SLACK,
                t.c.event.in_([tracking.DELIVERED, tracking.TERMINATED]),
                t.c.detail.like(pattern, escape="\\"),
            )
        )
    )


def _published(
    conn: sa.Connection, instance_id: str, version: int
) -> dict[uuid.UUID, tuple[int, datetime | None]]:
    """Its steps' publications still in the spool or in tracking: for each, the step's
    version and when it was published. A step's publications are numbered from 0, so
    the next is looked for only where one was found."""
    found: dict[uuid.UUID, tuple[int, datetime | None]] = {}
    steps = list(range(max(1, version - MAX_STEPS + 1), version + 1))
    n = 0
    while steps:
        wanted = {message_ids(instance_id, v, n + 1)[n]: v for v in steps}
        known = _known(conn, list(wanted))
        found.update({m: (wanted[m], at) for m, at in known.items()})
        steps = sorted({wanted[m] for m in known})
        n += 1
    return found


def _known(conn: sa.Connection, msgs: Sequence[uuid.UUID]) -> dict[uuid.UUID, datetime | None]:
    """Of ``msgs``, those stored or tracked as published, with when."""
    sp, t = schema.spool, schema.tracking
    rows = conn.execute(
        sa.union_all(
            sa.select(sp.c.id, sp.c.published_at).where(arrays.one_of(conn, sp.c.id, msgs)),
            sa.select(t.c.msg, t.c.tracked_at).where(
                arrays.one_of(conn, t.c.msg, msgs), t.c.event == tracking.PUBLISHED
            ),
        )
    ).all()
    return {ids.as_uuid(m): at for m, at in rows}


def _timeouts(conn: sa.Connection, msgs: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Of ``msgs``, the stored timeout messages (published by the timers)."""
    if not msgs:
        return set()
    sp = schema.spool
    rows = conn.execute(
        sa.select(sp.c.id).where(
            arrays.one_of(conn, sp.c.id, sorted(set(msgs))), sp.c.publisher == TIMER_PUBLISHER
        )
    )
    return {ids.as_uuid(m) for (m,) in rows}


def _events(conn: sa.Connection, msgs: Sequence[uuid.UUID]) -> list[TrackedEvent]:
    """The newest :data:`MAX_EVENTS` tracked events of ``msgs``, oldest first."""
    if not msgs:
        return []
    t = schema.tracking
    order = sa.case({e: i for i, e in enumerate(tracking.EVENTS)}, value=t.c.event)
    rows = conn.execute(
        sa.select(t)
        .where(arrays.one_of(conn, t.c.msg, sorted(set(msgs))))
        .order_by(t.c.tracked_at.desc(), order.desc(), t.c.entry.desc())
        .limit(MAX_EVENTS)
    ).all()
    return [
        TrackedEvent(r.tracked_at, r.event, ids.as_uuid(r.msg), r.sub, r.host, r.entry, r.detail)
        for r in reversed(rows)
    ]


def _messages(
    waiting: Sequence[Any],
    suspended: Sequence[Any],
    ended: Sequence[Any],
    events: Sequence[TrackedEvent],
    timers: set[uuid.UUID],
) -> list[InstanceMessage]:
    """Every message that reached it, by entry (its order), with its outcome."""
    failures = Counter((e.message_id, e.entry) for e in events if e.event == tracking.FAILED)
    step = min((r.id for r in suspended if r.resumable), default=None)
    found: dict[int, InstanceMessage] = {}
    for r in ended:
        msg = ids.as_uuid(r.msg)
        handled = r.event == tracking.DELIVERED
        found[int(r.entry)] = InstanceMessage(
            int(r.entry), msg, r.sub, "handled" if handled else "terminated", r.tracked_at,
            r.detail.rsplit(", instance ", 1)[0] if handled else "the instance was terminated",
            failures[(msg, r.entry)], msg in timers,
        )  # fmt: skip
    for r in suspended:
        msg = ids.as_uuid(r.msg)
        error = (r.error or "").strip().splitlines()
        reason = f"{r.reason} ({'resumable' if r.resumable else 'not resumable'})"
        found[int(r.id)] = InstanceMessage(
            int(r.id), msg, r.sub, "suspended", r.suspended_at,
            reason + (f": {error[-1]}" if error else ""), failures[(msg, r.id)], msg in timers,
        )  # fmt: skip
    for r in waiting:
        msg = ids.as_uuid(r.msg)
        outcome = r.shown or ("blocked" if step is not None else "ready")
        said: str | None = {
            "leased": r.lease_owner,
            "held": "its service is stopped",
            "blocked": f"blocked by suspended entry {step}",
        }.get(outcome)
        found[int(r.id)] = InstanceMessage(
            int(r.id), msg, r.sub, outcome, r.enqueued_at, said, failures[(msg, r.id)],
            msg in timers, step if outcome == "blocked" else None,
        )  # fmt: skip
    return [found[k] for k in sorted(found)]
