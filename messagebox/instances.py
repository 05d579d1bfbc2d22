"""Service instances in storage (DESIGN.md §9): convoys, persisted state, steps, timers.

An instance of a long-running service (an orchestration) lives in ``mb_service_instance``
with its state as JSON and a version. Its messages reach it through queue entries that
carry its id; the claim takes only the oldest entry of an instance, so it handles one
message at a time, in order, across every host instance and process.

A *step* is everything one message does to an instance, committed in one transaction
with the deletion of that message's queue entry: the new state, the messages it
publishes, its instance subscriptions, its timers, its completion. A host that dies
mid-step commits nothing; the entry is delivered again and the step runs again from
the persisted state, so a step never publishes twice.

A *convoy* row maps (service, correlation values) to the running instance. Routing
finds or creates it in the publish's transaction, so concurrent first messages for one
value create one instance; completing the instance deletes it.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from messagebox import delivery, router, schema, spool, subscriptions
from messagebox.dialects import Dialect
from messagebox.errors import Conflict, MessageBoxError
from messagebox.ids import allocate, uuid7
from messagebox.message import Message
from messagebox.models import INSTANCE_COMPLETED, Kind, RoutingPolicy
from messagebox.properties import Value, family, sql_key

RUNNING = "running"
SUSPENDED = "suspended"
COMPLETED = "completed"

TIMER_PUBLISHER = "messagebox.timer"
"""The publisher of timeout messages (their spool rows say so)."""
TIMEOUT_TYPE = "messagebox#timeout"
"""``messagebox.MessageType`` of a timeout message."""

_CHUNK = 1000


class LeaseLost(MessageBoxError):
    """The step's queue entry is no longer leased by this host instance: another one
    took it over, and this step is not committed."""


def correlation_key(names: Sequence[str], props: Mapping[str, Value]) -> str:
    """The convoy key of a message: its values of ``names``, encoded so that two values
    that routing finds equal (``42`` and ``42.0``) give one key."""
    parts: list[Any] = []
    for name in names:
        value = props.get(name)
        if value is None:
            parts.append(None)
        elif isinstance(value, str):
            parts.append(["s", value])
        else:
            hi, lo = sql_key(value)
            parts.append([int(family(value)), hi, lo])
    return json.dumps(parts, separators=(",", ":"), ensure_ascii=False)


def resolve_convoys(
    conn: sa.Connection, wanted: Sequence[tuple[str, str]], now: datetime
) -> dict[tuple[str, str], str]:
    """The running instance id for each (service, key), created when there is none.

    One statement per chunk, ``INSERT … ON CONFLICT DO UPDATE … RETURNING``: on
    PostgreSQL a concurrent publisher of the same key waits for this transaction and then
    gets the same instance; on DuckDB the later commit fails with a conflict and the
    publish is retried. Keys are taken in sorted order (no deadlock between publishers).
    """
    c = schema.convoy
    found: dict[tuple[str, str], str] = {}
    keys = sorted(set(wanted))
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        stmt = pg_insert(c).values(
            [
                {"service": s, "key": k, "instance_id": str(uuid7()), "created_at": now}
                for s, k in chunk
            ]
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.c.service, c.c.key], set_={"service": stmt.excluded.service}
        ).returning(c.c.service, c.c.key, c.c.instance_id)
        found.update(((r.service, r.key), r.instance_id) for r in conn.execute(stmt))
    return found


# --- loading ---


@dataclass(frozen=True)
class Stored:
    """A service instance as stored."""

    id: str
    service: str
    host: str
    state: str
    correlation: dict[str, Value]
    data: dict[str, Any]
    version: int
    created_at: datetime
    completed_at: datetime | None


def load(conn: sa.Connection, instance_id: str) -> Stored | None:
    si = schema.service_instance
    row = conn.execute(sa.select(si).where(si.c.id == instance_id)).first()
    if row is None:
        return None
    from messagebox.properties import decode_value

    return Stored(
        id=row.id,
        service=row.service,
        host=row.host,
        state=row.state,
        correlation={k: decode_value(v) for k, v in json.loads(row.correlation).items()},
        data=json.loads(row.data),
        version=int(row.version),
        created_at=row.created_at,
        completed_at=row.completed_at,
    )


def in_convoy(conn: sa.Connection, instance_id: str) -> bool:
    """Whether routing made ``instance_id`` the running instance of some convoy (its
    first step has not committed yet, or it is running)."""
    c = schema.convoy
    return (
        conn.execute(sa.select(c.c.key).where(c.c.instance_id == instance_id)).first() is not None
    )


# --- a step ---


@dataclass
class TimerSpec:
    name: str
    due_at: datetime


@dataclass
class Step:
    """What one message did to an instance, to commit at once."""

    owner: str
    entry_id: int
    message_id: uuid.UUID
    instance_id: str
    service: str
    host: str
    sub: int
    """The subscription that delivered the message (timers come back through it)."""
    version: int | None
    """The version the step started from; None for a new instance."""
    data: dict[str, Any]
    correlation: Mapping[str, Value] = field(default_factory=dict)
    subscribe: list[subscriptions.SubscriptionSpec] = field(default_factory=list)
    timers: list[TimerSpec] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    publish: list[Message] = field(default_factory=list)
    complete: bool = False


def message_ids(instance_id: str, version: int, n: int) -> list[uuid.UUID]:
    """Ids of a step's publications: the same for a step run again, so a step can never
    store its messages twice."""
    return [uuid.uuid5(uuid.NAMESPACE_URL, f"mb:{instance_id}:{version}:{i}") for i in range(n)]


def commit_step(
    conn: sa.Connection, dialect: Dialect, step: Step, now: datetime, publisher: str
) -> tuple[Counter[str], int]:
    """Commit a step inside the caller's (serial) transaction. Raises :class:`LeaseLost`
    when the entry is no longer this host instance's, :class:`Conflict` when another
    step changed the instance first. Returns the entries queued per host (to wake them)
    and, on completion, the number of messages discarded (suspended as zombies)."""
    q, si = schema.queue, schema.service_instance
    gone = conn.execute(
        q.delete().where(q.c.id == step.entry_id, q.c.lease_owner == step.owner).returning(q.c.msg)
    ).all()
    if not gone:
        raise LeaseLost(
            f"queue entry {step.entry_id} of instance {step.instance_id} is no longer leased "
            f"by {step.owner}; its step was not committed"
        )
    delivery.release(conn, dialect, [gone[0].msg])
    version = 1 if step.version is None else step.version + 1
    values = {
        "data": json.dumps(step.data, ensure_ascii=False, default=str),
        "version": version,
        "updated_at": now,
        "state": COMPLETED if step.complete else RUNNING,
        "completed_at": now if step.complete else None,
    }
    if step.version is None:
        from messagebox.properties import encode_value

        conn.execute(
            si.insert().values(
                id=step.instance_id,
                service=step.service,
                host=step.host,
                correlation=json.dumps(
                    {k: encode_value(v) for k, v in step.correlation.items()}, ensure_ascii=False
                ),
                created_at=now,
                **values,
            )
        )
    else:
        n = conn.execute(
            si.update()
            .where(si.c.id == step.instance_id, si.c.version == step.version)
            .values(**values)
        ).rowcount
        if n != 1:
            raise Conflict(
                f"instance {step.instance_id} changed since version {step.version}; "
                "its step was not committed"
            )
    t = schema.timer
    if step.cancel or step.complete:
        query = t.delete().where(t.c.instance_id == step.instance_id)
        if not step.complete:
            query = query.where(t.c.name.in_(step.cancel))
        conn.execute(query)
    if step.timers and not step.complete:
        ids = allocate(conn, len(step.timers))
        conn.execute(
            t.insert(),
            [
                {
                    "id": timer_id,
                    "instance_id": step.instance_id,
                    "service": step.service,
                    "host": step.host,
                    "sub": step.sub,
                    "name": timer.name,
                    "due_at": timer.due_at,
                    "created_at": now,
                }
                for timer_id, timer in zip(ids, step.timers, strict=True)
            ],
        )
    if step.subscribe and not step.complete:
        subscriptions.subscribe(conn, dialect, step.subscribe, now)
    hosts: Counter[str] = Counter()
    if step.publish:
        _, hosts = router.publish(
            conn,
            dialect,
            step.publish,
            message_ids(step.instance_id, version, len(step.publish)),
            policy=RoutingPolicy.SUSPEND,
            publisher=publisher,
            now=now,
        )
    discarded = complete(conn, dialect, step.instance_id, step.service, now) if step.complete else 0
    return hosts, discarded


def complete(
    conn: sa.Connection, dialect: Dialect, instance_id: str, service: str, now: datetime
) -> int:
    """Remove a completing instance's subscriptions, convoy and timers; suspend the
    messages still queued for it (not resumable, "completed with discarded messages",
    each with a report naming the instance). Fired timeouts it never consumed are just
    dropped. Returns the number of messages suspended."""
    q, s, sp = schema.queue, schema.subscription, schema.spool
    subs = list(conn.execute(sa.select(s.c.id).where(s.c.instance_id == instance_id)).scalars())
    if subs:
        subscriptions.unsubscribe(conn, dialect, subs)
    conn.execute(schema.convoy.delete().where(schema.convoy.c.instance_id == instance_id))
    conn.execute(schema.timer.delete().where(schema.timer.c.instance_id == instance_id))
    timeouts = conn.execute(
        q.delete()
        .where(
            q.c.instance_id == instance_id,
            q.c.msg.in_(sa.select(sp.c.id).where(sp.c.publisher == TIMER_PUBLISHER)),
        )
        .returning(q.c.msg)
    ).all()
    delivery.release(conn, dialect, [r.msg for r in timeouts])
    report = {"service": service, "instance": instance_id, "completed_at": now.isoformat()}
    return delivery.suspend_instance(conn, dialect, instance_id, INSTANCE_COMPLETED, report)


# --- timers ---


def fire_timers(
    conn: sa.Connection, dialect: Dialect, host: str, now: datetime, limit: int = 500
) -> Counter[str]:
    """Turn the host's due timers into timeout messages on their instances' queues.

    Each is a small message (``messagebox.MessageType`` = ``messagebox#timeout``, the
    timer's name and due time written) queued for the instance through the subscription
    that set it. On PostgreSQL concurrent host instances take disjoint timers."""
    t, s = schema.timer, schema.subscription
    due = (
        sa.select(t.c.id)
        .where(t.c.host == host, t.c.due_at <= sa.func.now())
        .order_by(t.c.due_at)
        .limit(limit)
    )
    if dialect.supports_skip_locked:
        due = due.with_for_update(skip_locked=True)
    ids = list(conn.execute(due).scalars())
    if not ids:
        return Counter()
    rows = conn.execute(
        t.delete()
        .where(t.c.id.in_(ids))
        .returning(t.c.id, t.c.instance_id, t.c.service, t.c.sub, t.c.name, t.c.due_at)
    ).all()
    subs = {
        r.id: r
        for r in conn.execute(
            sa.select(s.c.id, s.c.host, s.c.priority, s.c.state).where(
                s.c.id.in_({r.sub for r in rows})
            )
        )
    }
    items: list[tuple[uuid.UUID, Message, router.RouteRow]] = []
    for r in rows:
        sub = subs.get(r.sub)
        if sub is None:  # the instance completed meanwhile: nothing waits for it
            continue
        due_at = r.due_at if r.due_at.tzinfo else r.due_at.replace(tzinfo=UTC)
        message = Message(
            json.dumps({"timer": r.name, "instance": r.instance_id, "due_at": due_at.isoformat()}),
            promoted={"messagebox.MessageType": TIMEOUT_TYPE},
            written={
                "messagebox.TimerName": r.name,
                "messagebox.TimerDue": due_at.isoformat(),
                "messagebox.InstanceId": r.instance_id,
            },
        )
        route = (0, sub.id, sub.host, sub.priority, sub.state, Kind.ACTIVATION.value,
                 r.instance_id, False, r.service, None)  # fmt: skip
        items.append((uuid.uuid5(uuid.NAMESPACE_URL, f"mb-timer:{r.id}"), message, route))
    return router.enqueue_direct(conn, dialect, items, now, TIMER_PUBLISHER)


def next_due(conn: sa.Connection, host: str) -> float | None:
    """Seconds until the host's next timer is due (0 if one is), or None."""
    t = schema.timer
    due = conn.execute(sa.select(sa.func.min(t.c.due_at)).where(t.c.host == host)).scalar()
    if due is None:
        return None
    if due.tzinfo is None:
        due = due.replace(tzinfo=UTC)
    return max((due - datetime.now(UTC)).total_seconds(), 0.0)


def due_in(seconds: float, now: datetime) -> datetime:
    return now + timedelta(seconds=seconds)


def read_stored(conn: sa.Connection, message_id: uuid.UUID) -> Any:
    """The spool row's publisher and context (to tell timeouts apart)."""
    return spool.read_context(conn, [message_id]).get(message_id)
