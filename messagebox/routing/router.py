"""Publish and route (docs/concepts.md: Publishing): stage a batch, find every matching
subscription in one set-based statement, store each message once and reference it from
each queue entry.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox import timing
from messagebox.errors import RoutingFailure
from messagebox.message import Message
from messagebox.models import (
    REROUTABLE,
    Kind,
    Outcome,
    Routed,
    RoutingPolicy,
    Suspension,
)
from messagebox.properties import Value, decode_context, family, sql_key
from messagebox.routing.convoys import correlation_key, find_convoys, resolve_convoys
from messagebox.routing.writes import Writes
from messagebox.storage import routing_index, schema, spool, store_clock, tracking
from messagebox.storage.dialects import Dialect, StagedBatch, Target, Uuids
from messagebox.storage.dialects.base import Prelude
from messagebox.storage.ids import allocate
from messagebox.storage.ids import seed as seed_ids
from messagebox.storage.routing_index import Matches
from messagebox.timing import Times


def prelude(conn: sa.Connection, dialect: Dialect) -> Prelude | None:
    """Read what a publish needs before it routes in one round trip, where the dialect
    can (PostgreSQL: the routing fence, the time, an id block and the routing
    versions); what was read, or None."""
    index = routing_index.of(conn)
    asked = None if index is None else index.version
    got = dialect.prelude(conn, asked)
    if got is not None:
        store_clock.seed(conn, got.now)
        seed_ids(conn, got.block)
        routing_index.prefetched(conn, asked, got.changes)
    return got


def stage(promoted: Sequence[Mapping[str, Value]]) -> StagedBatch:
    """One row per (message, promoted property), with typed value columns."""
    batch = StagedBatch(n=len(promoted))
    for i, props in enumerate(promoted):
        for name, value in props.items():
            batch.msg.append(i)
            batch.name.append(name)
            fam = family(value)
            batch.fam.append(int(fam))
            if isinstance(value, str):
                batch.v_str.append(value)
                batch.hi.append(None)
                batch.lo.append(None)
                batch.v_int.append(None)
            else:
                hi, lo = sql_key(value)
                batch.v_str.append(None)
                batch.hi.append(hi)
                batch.lo.append(lo)
                batch.v_int.append(value if type(value) is int else None)
    return batch


def route(
    conn: sa.Connection,
    dialect: Dialect,
    promoted: Sequence[Mapping[str, Value]],
    *,
    now: datetime | None = None,
) -> list[list[Target]]:
    """The matching subscriptions of each message, in subscription-id order: from the
    store's in-memory routing index, or with ``MessageBox(router="sql")`` from the
    routing statement.

    With ``now`` (a publish), a match of an activation subscription with a correlation
    is given the running instance of its convoy, created if there is none; a message
    reaches one instance once, through the first subscription that routes it there.
    """
    if not promoted:
        return []
    index = routing_index.of(conn)
    if index is not None:
        per_message, correlated = index.route(conn, promoted)
    else:
        per_message = _route_sql(conn, dialect, promoted)
        correlated = True  # _correlate looks
    if now is not None and correlated:
        _correlate(conn, dialect, per_message, promoted, now)
    return per_message


def route_matches(
    conn: sa.Connection, dialect: Dialect, promoted: Sequence[Mapping[str, Value]], now: datetime
) -> Matches:
    """:func:`route` for a publish, as the queue columns of every match: with the
    routing index and no correlation among the matches, gathered without a tuple per
    match."""
    index = routing_index.of(conn)
    if index is None or not promoted:
        return Matches.of(route(conn, dialect, promoted, now=now))
    found = index.route_columns(conn, promoted)
    if isinstance(found, Matches):
        return found
    _correlate(conn, dialect, found, promoted, now)
    return Matches.of(found)


def _route_sql(
    conn: sa.Connection, dialect: Dialect, promoted: Sequence[Mapping[str, Value]]
) -> list[list[Target]]:
    per_message: list[list[Target]] = [[] for _ in promoted]
    for row in dialect.route(conn, stage(promoted)):
        per_message[row.msg].append(Target._make(row[1:]))
    return per_message


def _correlate(
    conn: sa.Connection,
    dialect: Dialect,
    per_message: list[list[Target]],
    promoted: Sequence[Mapping[str, Value]],
    now: datetime,
) -> None:
    """Give correlated matches their instance: an activation subscription's convoy is
    found or created; an instance subscription with a correlation follows a running
    instance only (one that existed before the batch, or that an earlier message of the
    batch created), and is dropped when there is none."""
    keys: dict[tuple[int, int], tuple[str, str]] = {}
    first: dict[tuple[str, str], int] = {}
    for i, rows in enumerate(per_message):
        for row in rows:
            if row.correlation:
                key = (row.service, correlation_key(json.loads(row.correlation), promoted[i]))
                keys[(i, row.sub)] = key
                if row.kind == Kind.ACTIVATION:
                    first.setdefault(key, i)
    if not keys:
        return
    existing = find_convoys(conn, dialect, list(keys.values()))
    made = resolve_convoys(conn, dialect, [k for k in first if k not in existing], now)
    for i, rows in enumerate(per_message):
        seen: set[str] = set()
        kept: list[Target] = []
        for row in rows:
            found = keys.get((i, row.sub))
            if found is not None:
                key = found
                instance: str | None
                if key in existing:  # running before the batch: everyone follows it
                    instance = existing[key]
                elif row.kind == Kind.ACTIVATION:
                    instance = made[key]
                else:  # created by this batch: only messages after the first follow it
                    instance = made[key] if first.get(key, i) < i else None
                if instance is None:
                    continue  # no running instance to follow
                row = row._replace(instance_id=instance)
            if row.instance_id is not None:
                if row.instance_id in seen:
                    continue
                seen.add(row.instance_id)
            kept.append(row)
        rows[:] = kept


PUBLISH_CHUNK = 20_000
"""A larger batch is routed and written this many messages at a time, in its one
transaction: what a publish holds beside the messages and their results is one chunk's
work, whatever the batch's size (a batch of a million held 1.3 GiB more at once)."""


def publish(
    conn: sa.Connection,
    dialect: Dialect,
    messages: Sequence[Message],
    ids: Sequence[uuid.UUID],
    *,
    policy: RoutingPolicy,
    publisher: str,
    now: datetime,
    before_write: Callable[[sa.Connection, set[str]], None] | None = None,
    suspensions: Mapping[int, Suspension] | None = None,
    delay: float | None = None,
    strict: bool = True,
) -> tuple[list[Routed], Counter[str]]:
    """Route and store a validated batch inside the caller's transaction, a chunk of
    :data:`PUBLISH_CHUNK` at a time.

    ``suspensions`` names messages (by index) to store suspended with a reason,
    routed only when the suspension says so; the routing policy does not apply to them.

    ``before_write`` sees the hosts the batch routes to before anything of them is
    written (or any part stream read), each host once; throttling raises there (the
    caller's transaction then stores nothing). Returns the results and the number of
    entries queued per host.

    Each message's entries are due at its ``deliver_at`` (else ``delay`` seconds from
    ``now``, else now) and expire at its expiry (:func:`timing.batch_times`: with
    ``strict``, a message due at or after its expiry refuses the batch, before anything
    is written).
    """
    times = timing.batch_times(messages, now, delay, strict=strict)
    if len(messages) <= PUBLISH_CHUNK:
        return _publish_chunk(
            conn, dialect, messages, ids, policy, publisher, now, before_write, suspensions, times
        )
    checked: set[str] = set()

    def first_sight(c: sa.Connection, hosts: set[str]) -> None:
        new = hosts - checked
        if new and before_write is not None:
            before_write(c, new)  # against the depths before this publish
        checked.update(new)

    results: list[Routed] = []
    queued: Counter[str] = Counter()
    for start in range(0, len(messages), PUBLISH_CHUNK):
        end = start + PUBLISH_CHUNK
        forced = {i - start: x for i, x in (suspensions or {}).items() if start <= i < end}
        part = None if times is None else Times(times.due[start:end], times.expires[start:end])
        done, hosts = _publish_chunk(
            conn, dialect, messages[start:end], ids[start:end], policy, publisher, now,
            first_sight, forced, part,
        )  # fmt: skip
        results.extend(done)
        queued.update(hosts)
    return results, queued


def _publish_chunk(
    conn: sa.Connection,
    dialect: Dialect,
    messages: Sequence[Message],
    ids: Sequence[uuid.UUID],
    policy: RoutingPolicy,
    publisher: str,
    now: datetime,
    before_write: Callable[[sa.Connection, set[str]], None] | None,
    suspensions: Mapping[int, Suspension] | None,
    times: Times | None = None,
) -> tuple[list[Routed], Counter[str]]:
    """:func:`publish` of one chunk (``times``: its messages', by position)."""
    forced = suspensions or {}
    ids = Uuids(ids)  # the messages' ids go to several tables: converted once
    matches = _route_unforced(conn, dialect, messages, forced, now)
    writes = Writes.empty(now, times, [m.promoted for m in messages])
    hosts = writes.matched(matches)
    if before_write is not None and hosts:
        before_write(conn, set(hosts))
    counts = matches.counts
    unrouted = [i for i, k in enumerate(counts) if not k and i not in forced]
    if unrouted and policy is RoutingPolicy.RAISE:
        raise _routing_failure(unrouted, ids)
    keep = [i for i, k in enumerate(counts) if k or i in forced or policy is RoutingPolicy.SUSPEND]
    n_entries = sum(counts[i] + (i in forced or not counts[i]) for i in keep)
    if not forced:  # no message is stored suspended but by the routing policy
        results = writes.routed_all(
            allocate(conn, n_entries),
            ids,
            counts,
            suspend_unrouted=policy is RoutingPolicy.SUSPEND,
        )
    else:
        results = _routed_each(writes, conn, n_entries, ids, counts, forced, policy)
    if len(keep) == len(messages):
        kept, stored_ids = messages, ids
    else:
        kept, stored_ids = [messages[i] for i in keep], Uuids([ids[i] for i in keep])
    stored = spool.message_rows(conn, dialect, stored_ids, kept, now, publisher)
    tracking.record(conn, dialect, tracking.PUBLISHED, stored_ids, details=[publisher] * len(keep))
    if unrouted:
        outcome = "suspended" if policy is RoutingPolicy.SUSPEND else "dropped"
        tracking.count(conn, "routing_failures", [outcome] * len(unrouted))
    writes.flush(conn, dialect, stored, hosts=hosts)
    return results, hosts


def _routed_each(
    writes: Writes,
    conn: sa.Connection,
    n_entries: int,
    ids: Sequence[uuid.UUID],
    counts: Sequence[int],
    forced: Mapping[int, Suspension],
    policy: RoutingPolicy,
) -> list[Routed]:
    """Queue, suspend or drop each message in turn (see :func:`publish`)."""
    entry_ids = iter(allocate(conn, n_entries)) if n_entries else iter(())
    results = []
    for i, k in enumerate(counts):
        msg_id = ids[i]
        if i in forced or k:
            results.append(writes.routed(entry_ids, msg_id, k, forced.get(i), i))
        elif policy is RoutingPolicy.SUSPEND:
            results.append(writes.unrouted(next(entry_ids), msg_id))
        else:
            results.append(Routed(msg_id, Outcome.DROPPED, ()))
    return results


def _route_unforced(
    conn: sa.Connection,
    dialect: Dialect,
    messages: Sequence[Message],
    forced: Mapping[int, Suspension],
    now: datetime,
) -> Matches:
    """Each message's matches; none for a message stored suspended without routing
    (it was routed with no properties, so a filter of only ``not_exists`` took it)."""
    routed = [i for i in range(len(messages)) if i not in forced or forced[i].route]
    found = route_matches(conn, dialect, [messages[i].promoted for i in routed], now)
    if len(routed) == len(messages):
        return found
    counts = [0] * len(messages)
    for i, k in zip(routed, found.counts, strict=True):
        counts[i] = k  # the entries stay in message order: the others have none
    return Matches(counts, found.columns)


def _routing_failure(unrouted: Sequence[int], ids: Sequence[uuid.UUID]) -> RoutingFailure:
    """The error of a batch whose messages ``unrouted`` (by index) matched nothing."""
    first = unrouted[0]
    return RoutingFailure(
        f"message {first} (id {ids[first]}) matched no subscription"
        + (f", nor did {len(unrouted) - 1} more" if len(unrouted) > 1 else "")
        + "; nothing of the batch was stored"
    )


def reroute(
    conn: sa.Connection, dialect: Dialect, entry_ids: Sequence[int], now: datetime
) -> dict[int, tuple[int, ...]]:
    """Route suspended routing failures (and entries whose subscription was removed)
    again; those that now match leave the suspended queue for their hosts' queues.
    Returns, per entry, the subscriptions it went to."""
    s = schema.suspended
    rows = conn.execute(
        sa.select(s.c.id, s.c.msg).where(s.c.id.in_(list(entry_ids)), s.c.reason.in_(REROUTABLE))
    ).all()
    contexts = spool.read_context(conn, [r.msg for r in rows])
    promoted = [decode_context(contexts[r.msg].context)[0] for r in rows]
    matches = route(conn, dialect, promoted, now=now)
    writes = Writes.empty(now)
    done: dict[int, tuple[int, ...]] = {}
    routed = [(r, m, p) for r, m, p in zip(rows, matches, promoted, strict=True) if m]
    new_ids = iter(allocate(conn, sum(len(m) for _, m, _ in routed))) if routed else iter(())
    releases: dict[str, list[Any]] = {"msg": [], "n": [], "logged_at": []}
    for row, m, props in routed:
        for match in m:
            writes.enqueue(next(new_ids), row.msg, match, props)
        writes.reference(row.msg, len(m))
        releases["msg"].append(row.msg)
        releases["n"].append(1)
        releases["logged_at"].append(now)
        done[row.id] = tuple(x.sub for x in m)
    if routed:
        conn.execute(s.delete().where(s.c.id.in_(list(done))))
        writes.flush(conn, dialect)
        dialect.insert(conn, schema.ref_release, releases)
        dialect.notify(conn, sorted({m.host for _, ms, _ in routed for m in ms}))
    return done


def enqueue_direct(
    conn: sa.Connection,
    dialect: Dialect,
    items: Sequence[tuple[uuid.UUID, Message, Target]],
    now: datetime,
    publisher: str,
) -> Counter[str]:
    """Store messages and queue each for the one destination given, without routing
    (a timeout for its service instance). Returns the entries queued per host."""
    if not items:
        return Counter()
    writes = Writes.empty(now)
    for (msg_id, _, target), entry_id in zip(items, allocate(conn, len(items)), strict=True):
        writes.enqueue(entry_id, msg_id, target)
        writes.reference(msg_id, 1)
    stored = spool.message_rows(
        conn, dialect, [m for m, _, _ in items], [msg for _, msg, _ in items], now, publisher
    )
    tracking.record(
        conn,
        dialect,
        tracking.PUBLISHED,
        [m for m, _, _ in items],
        details=[publisher] * len(items),
    )
    hosts = Counter(target.host for _, _, target in items)
    writes.flush(conn, dialect, stored, hosts=hosts)
    return hosts
