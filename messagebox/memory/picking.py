"""Which entries a claim takes, in memory: the rules of the claim statements
(``sql/duckdb.sql``: ``plain_ready``, ``claim_mixed``, ``ordered_heads``,
``claim_ordered``, ``keyed_pick``) over :class:`~messagebox.memory.state.Rows`, and the
lease they set (``claim_set``). Every function runs under the store's lock."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from datetime import datetime, timedelta

from messagebox.claims import Claim, in_claim_order
from messagebox.memory.state import READY, Entry, Rows
from messagebox.models import EXPIRED
from messagebox.outcomes import Keys


def _age(e: Entry) -> tuple[int, int]:
    """Claim order: priority (highest first), then age."""
    return (-e.priority, e.id)


def held_instances(rows: Rows) -> set[str]:
    """The service instances a suspended (resumable, not expired) entry holds."""
    return {
        s.instance_id
        for s in rows.suspended.values()
        if s.resumable and s.instance_id is not None and s.reason != EXPIRED
    }


def held_keys(rows: Rows) -> set[tuple[int | None, str | None]]:
    """The (subscription, key) pairs a suspended entry holds."""
    return {(s.sub, s.order_key) for s in rows.suspended.values() if s.holds_key}


def plain(rows: Rows, host: str, now: datetime, n: int) -> list[Entry]:
    """The next plain entries: ready, due, not expired, not in hand."""
    found = [
        e
        for e in rows.queue.values()
        if e.host == host
        and e.state == READY
        and not e.ordered
        and e.instance_id is None
        and e.order_key is None
        and e.available_at <= now
        and not e.expired(now)
        and e.free(now)
    ]
    return sorted(found, key=_age)[:n]


def instance_heads(rows: Rows, host: str, now: datetime, n: int) -> list[Entry]:
    """The oldest entry of each service instance of ``host`` that may be handled now:
    none of the instance's entries in hand, none suspended (resumable) holding it. A
    scheduled entry never delivered, or one expired not in hand, is not the instance's
    yet."""
    by_instance: dict[str, list[Entry]] = {}
    for e in rows.queue.values():
        if e.host != host or e.instance_id is None:
            continue
        if e.attempts == 0 and e.available_at > now:
            continue
        if e.expired(now) and not e.leased(now):
            continue
        by_instance.setdefault(e.instance_id, []).append(e)
    held = held_instances(rows)
    heads = []
    for instance, entries in by_instance.items():
        head = min(entries, key=lambda e: e.id)
        if any(e.leased(now) for e in entries) or instance in held:
            continue
        if head.state == READY and head.available_at <= now and not head.ordered:
            heads.append(head)
    return sorted(heads, key=_age)[:n]


def ordered_run(rows: Rows, host: str, now: datetime, n: int) -> list[Entry]:
    """The run of one ordered subscription of ``host`` whose head is free: at most ``n``
    of its oldest entries, up to (not including) one not due yet."""
    held = held_instances(rows)
    by_sub: dict[int, list[Entry]] = {}
    for e in rows.queue.values():
        if e.host == host and e.ordered:
            by_sub.setdefault(e.sub, []).append(e)
    free: list[tuple[Entry, int | None]] = []
    for entries in by_sub.values():
        live = [e for e in entries if e.instance_id not in held and not e.expired(now)]
        if not live or any(e.leased(now) for e in entries):
            continue
        head = min(live, key=lambda e: e.id)
        wall = min((e.id for e in live if e.available_at > now), default=None)
        if head.state == READY and head.available_at <= now:
            free.append((head, wall))
    if not free:
        return []
    head, wall = min(free, key=lambda f: _age(f[0]))
    run = [
        e
        for e in by_sub[head.sub]
        if e.state == READY
        and e.available_at <= now
        and (wall is None or e.id < wall)
        and not e.expired(now)
        and e.free(now)
        and e.instance_id not in held
    ]
    return sorted(run, key=lambda e: e.id)[:n]


def keyed_runs(rows: Rows, host: str, now: datetime, n: int, per_key: int) -> list[Entry]:
    """The runs of free keys of ``host``'s subscriptions ordered by a property, up to
    ``n`` entries, at most ``per_key`` a key (its oldest). A key is free when none of its
    entries is in hand and no suspended entry holds it; its run ends before its first
    entry not claimable now (a retry or a scheduled entry holds the later ones)."""
    by_key: dict[tuple[int, str], list[Entry]] = {}
    for e in rows.queue.values():
        if e.host == host and e.order_key is not None:
            by_key.setdefault((e.sub, e.order_key), []).append(e)
    held = held_keys(rows)
    free: list[tuple[int, int, tuple[int, str], int | None]] = []
    for key, entries in by_key.items():
        live = [e for e in entries if not e.expired(now)]
        if not live or any(e.leased(now) for e in entries) or key in held:
            continue
        head = min(e.id for e in live)
        wall = min((e.id for e in live if e.state != READY or e.available_at > now), default=None)
        if wall is not None and wall <= head:
            continue
        first = min(entries, key=lambda e: e.id)
        free.append((-first.priority, head, key, wall))
    free.sort()
    picked = [
        e
        for _, _, key, wall in free[:n]
        for e in by_key[key]
        if (wall is None or e.id < wall) and not e.expired(now)
    ]
    picked = sorted(picked, key=_age)[:n]
    kept: list[Entry] = []
    for _, group in itertools.groupby(
        sorted(picked, key=lambda e: (e.sub, e.order_key, e.id)), key=lambda e: (e.sub, e.order_key)
    ):
        kept.extend(list(group)[:per_key])
    return kept


def lease(
    entries: Iterable[Entry], owner: str, now: datetime, lease_seconds: float, *, run: bool = False
) -> list[Claim]:
    """Lease ``entries`` to ``owner`` (``claim_set``): an entry whose lease lapsed with
    no outcome is an interrupted delivery, charged an attempt if it had started."""
    claims = []
    for e in entries:
        crashed = e.lease_owner is not None and e.started_by is not None
        waited = (
            None if e.claimed_at is not None else max(0.0, (now - e.enqueued_at).total_seconds())
        )
        e.interrupted = e.lease_owner is not None
        e.charges += int(crashed)
        e.crashed_by = e.started_by if crashed else e.crashed_by
        e.lease_owner, e.lease_expires = owner, now + timedelta(seconds=lease_seconds)
        e.attempts += 1
        e.claimed_at = e.claimed_at or now
        e.started_by = None
        claims.append(
            Claim(
                e.id,
                e.msg,
                e.sub,
                e.attempts,
                e.priority,
                e.instance_id,
                e.ordered,
                e.enqueued_at,
                waited,
                e.charges,
                e.interrupted,
                e.crashed_by,
                run=run,
                key=e.order_key,
            )
        )
    return claims


_turns = itertools.count()
"""A claim of one entry alternates between instances' heads and plain entries."""


def claim(
    rows: Rows,
    host: str,
    owner: str,
    now: datetime,
    lease_seconds: float,
    n: int,
    *,
    run_most: int,
    rest_most: int | None,
    keys: Keys,
    instances: bool,
) -> list[Claim]:
    """Lease up to ``n`` entries (as :func:`messagebox.delivery.leases.claim`): an ordered run
    first (at most ``run_most``; 0: none), then at most ``rest_most`` others: keyed runs
    (``keys``), then, unless ``keys.only``, instances' heads (at most half while plain
    entries wait) and plain entries."""
    claims = lease(ordered_run(rows, host, now, run_most), owner, now, lease_seconds, run=True)
    room = n - len(claims) if rest_most is None else min(n - len(claims), rest_most)
    if keys.most and room > 0:
        got = lease(keyed_runs(rows, host, now, min(keys.most, room), keys.per_key or n),
                    owner, now, lease_seconds)  # fmt: skip
        claims.extend(got)
        room -= len(got)
    if not keys.only and room > 0:
        share = (room // 2 if room > 1 else next(_turns) % 2) if instances else 0
        heads = lease(instance_heads(rows, host, now, share), owner, now, lease_seconds)
        rest = lease(plain(rows, host, now, room - len(heads)), owner, now, lease_seconds)
        more = room - len(heads) - len(rest)
        if instances and len(heads) == share and more > 0:
            heads += lease(instance_heads(rows, host, now, more), owner, now, lease_seconds)
        claims.extend(heads + rest)
    in_claim_order(claims)
    return claims
