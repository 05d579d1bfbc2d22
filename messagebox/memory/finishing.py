"""Outcomes in memory (as :mod:`messagebox.delivery.leases` and :mod:`messagebox.storage.expiry` do
them in SQL): completion, retry with back-off, suspension (holding a key or stopping an
ordered subscription with ``on_failure="stop"``), give-backs, and the expiry sweep.
Every function runs under the store's lock."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta

from messagebox.claims import MAX_BACKOFF_SECONDS, Claim, Failure, Finished
from messagebox.memory.state import MemoryStore
from messagebox.models import (
    CRASHED_HOST,
    DELIVERY_FAILURE,
    EXPIRED,
    SUBSCRIPTION_REMOVED,
    HostSettings,
    InstanceState,
    OnExpiry,
    State,
)
from messagebox.upkeep import Swept

MAX_ERROR_CHARS = 8000
"""The end of an error text a suspended entry keeps (as ``suspension.MAX_ERROR_CHARS``)."""


def complete(store: MemoryStore, owner: str, claims: Sequence[Claim], result: Finished) -> None:
    """Delete the entries still leased by ``owner``."""
    for c in claims:
        e = store.rows.queue.get(c.id)
        if e is not None and e.lease_owner == owner:
            del store.rows.queue[c.id]
            result.completed += 1
            result.completed_ids.append(c.id)
        else:
            result.lost += 1


def finish(
    store: MemoryStore,
    owner: str,
    completed: Sequence[Claim],
    failed: Sequence[Failure],
    settings: HostSettings,
    stop_on_failure: set[int],
) -> Finished:
    """Complete and fail claimed entries (as :func:`messagebox.delivery.leases.finish`)."""
    result = Finished()
    complete(store, owner, completed, result)
    to_suspend = [
        f
        for f in failed
        if f.permanent
        or (f.charge and f.retry_after is None and f.claim.charges + 1 >= settings.max_attempts)
    ]
    now = store.now()
    for f in failed:
        if f not in to_suspend:
            _retry(store, owner, f, settings, now, result)
    if to_suspend:
        _suspend(store, owner, to_suspend, stop_on_failure, result)
    return result


def _retry(
    store: MemoryStore,
    owner: str,
    f: Failure,
    settings: HostSettings,
    now: datetime,
    result: Finished,
) -> None:
    """Make a failed entry available again after its back-off."""
    e = store.rows.queue.get(f.claim.id)
    if e is None or e.lease_owner != owner:
        result.lost += 1
        return
    backoff = min(
        f.retry_after
        if f.retry_after is not None
        else settings.retry_backoff_seconds * 2 ** min(f.claim.charges, 30),
        MAX_BACKOFF_SECONDS,
    )
    e.lease_owner = e.lease_expires = e.started_by = None
    e.available_at = now + timedelta(seconds=backoff)
    e.charges += int(f.charge)
    result.retried += 1


def _suspend(
    store: MemoryStore,
    owner: str,
    failures: Sequence[Failure],
    stop_on_failure: set[int],
    result: Finished,
) -> None:
    """Move failed entries to the suspended queue; a keyed entry of a subscription that
    stops on failure holds its key, an ordered one stops its subscription."""
    rows = store.rows
    stop: set[int] = set()
    holding: set[tuple[int, str]] = set()
    for f in failures:
        e = rows.queue.get(f.claim.id)
        if e is None or e.lease_owner != owner:
            result.lost += 1
            continue
        del rows.queue[e.id]
        reason = f.reason if e.sub in rows.subs else SUBSCRIPTION_REMOVED
        holds = (
            e.order_key is not None and e.sub in stop_on_failure and reason != SUBSCRIPTION_REMOVED
        )
        store.suspend(e, reason, f.error[-MAX_ERROR_CHARS:], holds_key=holds)
        result.suspended += 1
        if holds and e.order_key is not None:
            holding.add((e.sub, e.order_key))
        if e.ordered and e.sub in stop_on_failure and e.sub in rows.subs:
            stop.add(e.sub)
        si = rows.instances.get(e.instance_id or "")
        failing = reason in (DELIVERY_FAILURE, CRASHED_HOST)
        if si is not None and failing and si.state is InstanceState.RUNNING:
            rows.instances[si.id] = dataclasses.replace(si, state=InstanceState.SUSPENDED)
    if stop:
        store.set_state(stop, State.STOPPED)
        result.stopped_subscriptions = tuple(sorted(stop))
    result.held_keys = tuple(sorted(holding))


def give_back(store: MemoryStore, owner: str, claims: Sequence[Claim]) -> int:
    """Release leases of entries never handed to a service (their attempt is not
    counted); an interrupted entry stays interrupted (``lease_owner`` kept)."""
    given = 0
    for c in claims:
        e = store.rows.queue.get(c.id)
        if e is None or e.lease_owner != owner:
            continue
        e.lease_expires = e.started_by = None
        e.attempts -= 1
        if not c.interrupted:
            e.lease_owner = None
        given += 1
    return given


def held(store: MemoryStore, owner: str, claims: Sequence[Claim]) -> set[int]:
    """The ids of ``claims`` whose delivery is still the one ``owner`` claimed."""
    found = set()
    for c in claims:
        e = store.rows.queue.get(c.id)
        if e is not None and e.lease_owner == owner and (e.attempts, e.msg) == (c.attempts, c.msg):
            found.add(c.id)
    return found


def mark_started(store: MemoryStore, owner: str, claims: Sequence[Claim]) -> int:
    """Record that these deliveries start; how many are still ``owner``'s."""
    n = 0
    for c in claims:
        e = store.rows.queue.get(c.id)
        if e is not None and e.lease_owner == owner:
            e.started_by = owner
            n += 1
    return n


def sweep(store: MemoryStore, host: str, limit: int) -> Swept:
    """Take up to ``limit`` of ``host``'s expired entries not in hand off the queue,
    earliest expiry first: suspended (``expired``, resumable) or dropped, as their
    subscriptions' ``on_expiry`` says."""
    now = store.now()
    rows = store.rows
    expired = sorted(
        (e for e in rows.queue.values() if e.host == host and e.expired(now) and e.free(now)),
        key=lambda e: (e.expires_at, e.id),
    )[:limit]
    done = Swept()
    for e in expired:
        del rows.queue[e.id]
        sub = rows.subs.get(e.sub)
        if sub is not None and sub.on_expiry is OnExpiry.DROP:
            done.dropped += 1
            continue
        at = e.expires_at.isoformat() if e.expires_at else "?"
        store.suspend(e, EXPIRED, f"it expired at {at} before delivery")
        done.suspended += 1
    return done
