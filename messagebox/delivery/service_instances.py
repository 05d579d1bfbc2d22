"""Service instances in storage (docs/concepts.md: Orchestrations): convoys, persisted
state, steps, timers.

An instance of a long-running service (an orchestration) lives in ``mb_service_instance``
with its state as JSON and a version. Its messages reach it through queue entries that
carry its id; the claim takes only the oldest entry of an instance, so it handles one
message at a time, in order, across every host instance and process.

A *step* is everything one message does to an instance, committed in one transaction
with the deletion of that message's queue entry: the new state, the messages it
publishes, its instance subscriptions, its timers, its completion. A host that dies
mid-step commits nothing; the entry is delivered again and the step runs again from
the persisted state, so a step never publishes twice.

Convoys (which instance a correlated message goes to) are routing's, in
:mod:`messagebox.routing.convoys`; completing an instance deletes its convoy rows.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from messagebox import clock
from messagebox.claims import Entry
from messagebox.errors import Conflict
from messagebox.errors import LeaseLost as LeaseLost  # named here before errors.py had it
from messagebox.message import Message
from messagebox.models import INSTANCE_COMPLETED, InstanceState, Kind, RoutingPolicy
from messagebox.properties import decode_values, encode_value
from messagebox.routing import router
from messagebox.steps import TIMEOUT_TYPE, TIMER_PUBLISHER, Step, Stored
from messagebox.storage import (
    arrays,
    schema,
    spool,
    store_clock,
    subscriptions,
    suspension,
    tracking,
)
from messagebox.storage.dialects import Dialect, Target
from messagebox.storage.ids import allocate, as_uuid, fetchable, uuid5

_CHUNK = 1000

log = logging.getLogger("messagebox.service_instances")


# --- loading ---


_STATES = {state.value: state for state in InstanceState}


def _time_column(conn: sa.Connection) -> list[sa.ColumnElement[Any]]:
    """The transaction's time as a column ``mb_now``, where it is read that way
    (:func:`store_clock.read_among_columns`)."""
    return [sa.func.now().label("mb_now")] if store_clock.read_among_columns(conn) else []


def load(
    conn: sa.Connection, dialect: Dialect, instance_ids: Sequence[str]
) -> tuple[dict[str, Stored], set[str]]:
    """The stored instances among ``instance_ids``, and those of the missing ones that
    routing made the running instance of a convoy (their first step has not committed),
    in one statement (the dialect's ``load_instances``, on the driver's cursor): one
    snapshot, and one statement where each costs milliseconds (DuckDB) or a round trip
    (PostgreSQL). Where its rows carry the transaction's time, it seeds
    :func:`store_clock.now` (see :func:`store_clock.seed_read`)."""
    found: dict[str, Stored] = {}
    convoys: set[str] = set()
    ids = sorted(set(instance_ids))
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        rows = dialect.fetch(
            conn, dialect.load_instances_sql, {"ids": arrays.array_param(conn, chunk)}
        )
        if rows and len(rows[0]) > 9:
            store_clock.seed_read(conn, rows[0][9])
        for row in rows:
            instance_id, service, host, state, correlation, data, version, completed_at = row[:8]
            if row[8]:
                convoys.add(instance_id)
                continue
            found[instance_id] = Stored(
                instance_id,
                service,
                host,
                _STATES[state],
                decode_values(orjson.loads(correlation)),
                _load(data),
                int(version),
                None if completed_at is None else clock.fetched(completed_at),
            )
    return found, convoys - found.keys()


# --- steps ---


def message_ids(instance_id: str, version: int, n: int) -> list[uuid.UUID]:
    """Ids of a step's publications: the same for a step run again, so a step can never
    store its messages twice."""
    return [uuid5(uuid.NAMESPACE_URL, f"mb:{instance_id}:{version}:{i}") for i in range(n)]


def commit_steps(
    conn: sa.Connection, dialect: Dialect, steps: Sequence[Step], publisher: str
) -> tuple[Counter[str], int]:
    """Commit steps (of distinct instances, claimed by one owner) inside the caller's
    serial transaction, set-based. Raises :class:`LeaseLost` when an entry is no longer
    the owner's and :class:`Conflict` when another step changed an instance first;
    nothing is then committed. Returns the entries queued per host (to wake them) and
    the number of messages discarded by completions (suspended as zombies)."""
    _take_entries(conn, dialect, steps)
    now = store_clock.now(conn)  # read with the entries taken
    _insert_instances(conn, dialect, [s for s in steps if s.version is None], now)
    _update_instances(conn, [s for s in steps if s.version is not None], now)
    _cancel_timers(conn, steps)
    _set_timers(conn, dialect, steps, now)
    # completions first: a step's own publications then find its convoy gone (an
    # activating one starts the next instance instead of queueing for this one)
    done = {s.instance_id: s.service for s in steps if s.complete}
    timed = {s.instance_id for s in steps if s.complete and _may_have_timers(s)}
    discarded = complete(conn, dialect, done, now, timers=timed) if done else 0
    return _publish(conn, dialect, steps, now, publisher), discarded


def _take_entries(conn: sa.Connection, dialect: Dialect, steps: Sequence[Step]) -> None:
    """Delete the steps' queue entries, delivered, or raise :class:`LeaseLost` if one is
    no longer leased by their owner."""
    q = schema.queue
    owner = steps[0].owner
    entry_ids = [s.entry_id for s in steps]
    timed = _time_column(conn)
    rows = conn.execute(
        q.delete()
        .where(arrays.one_of(conn, q.c.id, entry_ids), q.c.lease_owner == owner)
        .returning(q.c.id, fetchable(conn, q.c.msg), q.c.sub, q.c.host, *timed)
    ).all()
    if timed and rows:
        store_clock.seed_read(conn, rows[0].mb_now)
    gone = [Entry(r[0], as_uuid(r[1]), r[2], r[3]) for r in rows]
    if len(gone) != len(steps):
        lost = sorted(set(entry_ids) - {r.id for r in gone})
        raise LeaseLost(
            f"queue entry {lost[0]} is no longer leased by {owner}; its step was not committed"
        )
    spool.release(conn, dialect, [r.msg for r in gone])
    of = {s.entry_id: s.instance_id for s in steps}
    tracking.record(  # the detail names the instance: its history finds its steps by it
        conn,
        dialect,
        tracking.DELIVERED,
        [r.msg for r in gone],
        subs=[r.sub for r in gone],
        hosts=[r.host for r in gone],
        entries=[r.id for r in gone],
        details=[step_detail(owner, of[r.id]) for r in gone],
    )


def step_detail(owner: str, instance_id: str) -> str:
    """The detail of the ``delivered`` event of a step's message: the host instance, and
    the service instance the step ran on."""
    return f"{owner}, instance {instance_id}"


def _may_have_timers(step: Step) -> bool:
    """Whether the instance may hold timer rows as its step commits. Only a committed
    step writes them, each named in the saved state's ``timers`` until it is cancelled
    (or its timeout handled); so an instance has none when the state it was loaded with
    named none: its step's ``timers`` are those less the ones it cancelled."""
    return bool(step.data.get("timers")) or bool(step.cancel)


def _state(step: Step) -> str:
    """The state an instance is stored in after the step."""
    return (InstanceState.COMPLETED if step.complete else InstanceState.RUNNING).value


def _insert_instances(
    conn: sa.Connection, dialect: Dialect, new: Sequence[Step], now: datetime
) -> None:
    """Store the instances that first steps created (version 1)."""
    if not new:
        return
    dialect.insert(
        conn,
        schema.service_instance,
        {
            "id": [s.instance_id for s in new],
            "service": [s.service for s in new],
            "host": [s.host for s in new],
            "state": [_state(s) for s in new],
            "correlation": [  # checked values: orjson writes them as json would
                orjson.dumps({k: encode_value(v) for k, v in s.correlation.items()}).decode()
                for s in new
            ],
            "data": [_dump(s.data) for s in new],
            "version": [1] * len(new),
            "created_at": [now] * len(new),
            "updated_at": [now] * len(new),
            "completed_at": [now if s.complete else None for s in new],
        },
    )


_UPDATE_INSTANCES = sa.text(
    # one statement of fixed text whatever the number of steps (arrays, zipped by unnest)
    "UPDATE mb_service_instance AS si SET data = v.data, version = si.version + 1, "
    "updated_at = :now, state = v.state, "
    "completed_at = CASE WHEN v.state = :completed THEN :now ELSE NULL END "
    "FROM (SELECT unnest(CAST(:ids AS TEXT[])) AS id, "
    "unnest(CAST(:versions AS INTEGER[])) AS version, "
    "unnest(CAST(:data AS TEXT[])) AS data, unnest(CAST(:states AS TEXT[])) AS state) AS v "
    "WHERE si.id = v.id AND si.version = v.version"
).bindparams(sa.bindparam("now", type_=schema.Stamp))


def _update_instances(conn: sa.Connection, old: Sequence[Step], now: datetime) -> None:
    """Store the new state of existing instances, each at the version its step began
    from (bumped); raise :class:`Conflict` if another step changed one first."""
    if not old:
        return
    n = conn.execute(
        _UPDATE_INSTANCES,
        {
            "ids": arrays.array_param(conn, [s.instance_id for s in old]),
            "versions": arrays.array_param(conn, [s.version for s in old]),
            "data": arrays.array_param(conn, [_dump(s.data) for s in old]),
            "states": arrays.array_param(conn, [_state(s) for s in old]),
            "now": now,
            "completed": InstanceState.COMPLETED.value,
        },
    ).rowcount
    if n != len(old):
        raise Conflict(
            f"{len(old) - n} of {len(old)} instances changed since their step began; "
            "the steps were not committed"
        )


def _cancel_timers(conn: sa.Connection, steps: Sequence[Step]) -> None:
    """Delete the timers that steps of instances going on cancelled (by name). A step
    that created its instance has none to cancel (its ``wait_for`` cancels the timer it
    replaces, which then does not exist): no statement for it."""
    t = schema.timer
    cancels = {
        (s.instance_id, name)
        for s in steps
        if not s.complete and s.version is not None
        for name in s.cancel
    }
    if not cancels:
        return
    found = conn.execute(
        sa.select(t.c.id, t.c.instance_id, t.c.name).where(
            arrays.one_of(conn, t.c.instance_id, sorted({i for i, _ in cancels}))
        )
    ).all()
    gone_timers = [r.id for r in found if (r.instance_id, r.name) in cancels]
    if gone_timers:
        conn.execute(t.delete().where(arrays.one_of(conn, t.c.id, gone_timers)))


def _set_timers(
    conn: sa.Connection, dialect: Dialect, steps: Sequence[Step], now: datetime
) -> None:
    """Store the timers that steps of instances going on set."""
    timers = [(s, timer) for s in steps if not s.complete for timer in s.timers]
    if not timers:
        return
    dialect.insert(
        conn,
        schema.timer,
        {
            "id": allocate(conn, len(timers)),
            "instance_id": [s.instance_id for s, _ in timers],
            "service": [s.service for s, _ in timers],
            "host": [s.host for s, _ in timers],
            "sub": [s.sub for s, _ in timers],
            "name": [timer.name for _, timer in timers],
            "due_at": [timer.due_at for _, timer in timers],
            "created_at": [now] * len(timers),
        },
    )


def _publish(
    conn: sa.Connection, dialect: Dialect, steps: Sequence[Step], now: datetime, publisher: str
) -> Counter[str]:
    """Publish the steps' messages under ids fixed by instance and version (see
    :func:`message_ids`); returns the entries queued per host."""
    messages = [m for s in steps for m in s.publish]
    if not messages:
        return Counter()
    ids = [
        i
        for s in steps
        if s.publish
        for i in message_ids(
            s.instance_id, 1 if s.version is None else s.version + 1, len(s.publish)
        )
    ]
    _, hosts = router.publish(
        conn,
        dialect,
        messages,
        ids,
        policy=RoutingPolicy.SUSPEND,
        publisher=publisher,
        now=now,
        strict=False,  # a message due after its expiry expires: the step stands
    )
    return hosts


def _dump(data: Mapping[str, Any]) -> str:
    """An instance's data as JSON text. orjson writes it (a tenth of the time) when its
    JSON is the standard library's, values for values: plain dicts, lists, text,
    numbers and booleans (a step's data is a state dumped in JSON mode); else, and
    where orjson would write ``null`` (for a NaN or an infinity: never guess), the
    standard library."""
    try:
        text = orjson.dumps(data, default=_not_plain, option=_PLAIN_ONLY)
    except TypeError:  # another type, or an int past 64 bits
        text = b"null"
    if b"null" in text:
        return json.dumps(data, ensure_ascii=False, default=str)
    return text.decode()


_PLAIN_ONLY = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
"""What orjson would write otherwise than ``json.dumps(default=str)`` goes to
:func:`_not_plain`; but for an enum that is not a str or int, written by value (a
JSON-mode dump leaves none), and a UUID, written as the same text."""


def _not_plain(value: object) -> object:
    raise TypeError(type(value).__name__)


def _load(text: str) -> Any:
    """:func:`_dump`'s JSON read back; the standard library reads what orjson refuses
    (``NaN`` and the infinities it writes) or would read otherwise (an int past 64
    bits, which orjson reads as a float: any run of 19 digits goes there)."""
    if _LONG_DIGITS.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


_LONG_DIGITS = re.compile(r"[0-9]{19}")


def complete(
    conn: sa.Connection,
    dialect: Dialect,
    services: Mapping[str, str],
    now: datetime,
    completed_at: Mapping[str, datetime] | None = None,
    *,
    timers: Iterable[str] | None = None,
) -> int:
    """End completing instances: remove their convoys, timers and any instance
    subscriptions naming them; suspend the messages still queued for them (not
    resumable, "completed with discarded messages", with a report naming the instance).
    ``services`` maps each instance id to its service; ``completed_at`` gives when each
    completed (now, by default); ``timers``, those that may have timers, when known
    (all, by default: a statement fewer for a step whose instance has none).
    Fired timeouts they never consumed are dropped (tracked as terminated). Returns the
    messages suspended."""
    q, s, sp = schema.queue, schema.subscription, schema.spool
    ids = sorted(services)
    # what names them, in one statement: their instance subscriptions and the entries
    # still queued for them (usually none: then no delete)
    named = conn.execute(
        sa.union_all(
            sa.select(sa.true().label("sub"), s.c.id).where(
                arrays.one_of(conn, s.c.instance_id, ids)
            ),
            sa.select(sa.false(), q.c.id).where(arrays.one_of(conn, q.c.instance_id, ids)),
        )
    ).all()
    subs = [r.id for r in named if r.sub]
    entries = [r.id for r in named if not r.sub]
    if subs:
        subscriptions.unsubscribe(conn, dialect, subs)
    conn.execute(
        schema.convoy.delete().where(arrays.one_of(conn, schema.convoy.c.instance_id, ids))
    )
    timed = ids if timers is None else sorted(set(timers) & set(ids))
    if timed:
        conn.execute(
            schema.timer.delete().where(arrays.one_of(conn, schema.timer.c.instance_id, timed))
        )
    if not entries:
        return 0
    rows = conn.execute(
        q.delete().where(arrays.one_of(conn, q.c.id, entries)).returning(*schema.queue_columns())
    ).all()
    timeouts = set(
        conn.execute(
            sa.select(sp.c.id).where(
                sp.c.id.in_([r.msg for r in rows]), sp.c.publisher == TIMER_PUBLISHER
            )
        ).scalars()
    )
    dropped = [r for r in rows if r.msg in timeouts]
    spool.release(conn, dialect, [r.msg for r in dropped])
    # the history ends here; not an operator's termination, so not counted as one
    tracking.record_rows(
        conn,
        dialect,
        tracking.TERMINATED,
        dropped,
        "timeout dropped: its instance completed",
        counted=False,
    )
    zombies = [r for r in rows if r.msg not in timeouts]
    for instance_id in sorted({r.instance_id for r in zombies}):
        suspension.suspend_rows(
            conn,
            dialect,
            [r for r in zombies if r.instance_id == instance_id],
            reason=INSTANCE_COMPLETED,
            report={
                "service": services[instance_id],
                "instance": instance_id,
                "completed_at": (completed_at or {}).get(instance_id, now).isoformat(),
            },
        )
    return len(zombies)


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
    items: list[tuple[uuid.UUID, Message, Target]] = []
    for r in rows:
        sub = subs.get(r.sub)
        if sub is None:
            log.warning(
                "timer %r of instance %s (service %s) dropped: its subscription %d was removed",
                r.name,
                r.instance_id,
                r.service,
                r.sub,
            )
            continue
        due_at = clock.utc(r.due_at)
        message = Message(
            json.dumps({"timer": r.name, "instance": r.instance_id, "due_at": due_at.isoformat()}),
            promoted={"messagebox.MessageType": TIMEOUT_TYPE},
            written={
                "messagebox.TimerName": r.name,
                "messagebox.TimerDue": due_at.isoformat(),
                "messagebox.InstanceId": r.instance_id,
            },
        )
        route = Target(
            sub=sub.id,
            host=sub.host,
            priority=sub.priority,
            state=sub.state,
            kind=Kind.ACTIVATION.value,
            instance_id=r.instance_id,
            ordered=False,
            service=r.service,
            correlation=None,
        )
        items.append((uuid.uuid5(uuid.NAMESPACE_URL, f"mb-timer:{r.id}"), message, route))
    return router.enqueue_direct(conn, dialect, items, now, TIMER_PUBLISHER)


def next_due(conn: sa.Connection, host: str) -> float | None:
    """Seconds until the host's next timer is due (0 if one is), or None."""
    t = schema.timer
    due, now = conn.execute(  # both by the database's clock
        sa.select(sa.func.min(t.c.due_at), sa.func.now()).where(t.c.host == host)
    ).one()
    if due is None:
        return None
    return max(float((clock.utc(due) - clock.utc(now)).total_seconds()), 0.0)
