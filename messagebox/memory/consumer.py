"""The in-memory store as one host instance uses it: :class:`MemoryConsumer` implements
:class:`messagebox.port.HostStore` over a :class:`~messagebox.memory.state.MemoryStore`,
each call one atomic change under the store's lock."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

from messagebox.claims import Claim, Finished
from messagebox.errors import AlreadyExists, Conflict
from messagebox.memory import finishing, instances, picking
from messagebox.memory.state import MemoryStore, Registered
from messagebox.models import InstanceInfo, RoutingPolicy
from messagebox.outcomes import Keys, Outcomes, Recorded
from messagebox.port import Taker
from messagebox.steps import Step, Stored
from messagebox.upkeep import EXPIRY_BATCH, Swept


def timer_channel(host: str) -> str:
    """The wake-up name of a host's timer loop."""
    return f"{host}#timers"


class MemoryConsumer:
    """The in-memory store as the host instance ``owner`` of ``host`` uses it."""

    def __init__(
        self, store: MemoryStore, host: str, owner: str, publisher: str | None = None
    ) -> None:
        self._store = store
        self.host = host
        self.owner = owner
        self.publisher = publisher or owner

    outages = 0
    """An in-memory store is never lost."""
    claims_serialised = False
    """Each thread claims alone: a claim costs no statement here."""
    listens = False
    """No other process publishes to it."""
    timers_set_here = True
    """Every timer is set in this process."""

    # --- wake-ups ---

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self._store.watch(self.host, wake)

    def watch_timers(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self._store.watch(timer_channel(self.host), wake)

    def hand_over_to(self, taker: Taker) -> Callable[[], None] | None:
        return None  # a claim in memory costs no more than a hand-over would

    def listen(self, wake: Callable[[], None], stop: threading.Event) -> None:
        stop.wait()

    # --- membership ---

    def register(self, info: InstanceInfo) -> list[str]:
        """Register; an id registered already is refused (as the SQL stores' key is)."""
        with self._store.lock:
            if info.id in self._store.rows.registered:
                raise AlreadyExists(f"host instance {info.id} is registered already")
            self._store.rows.registered[info.id] = Registered(info, self._store.now())
            self._store.live.add(self.owner)
        return []

    def unregister(self) -> int:
        """Unregister; the leases still held are released (kept interrupted)."""
        with self._store.lock:
            released = 0
            for e in self._store.rows.queue.values():
                if e.lease_owner == self.owner and e.lease_expires is not None:
                    e.lease_expires = None
                    released += 1
            self._store.rows.registered.pop(self.owner, None)
            self._store.live.discard(self.owner)
        if released:
            self._store.signal([self.host])
        return released

    def heartbeat(self, lease_seconds: float, in_flight: Sequence[int], info: InstanceInfo) -> bool:
        with self._store.lock:
            rows, now = self._store.rows, self._store.now()
            found = rows.registered.get(self.owner)
            if found is None:
                rows.registered[info.id] = Registered(info, now)
                return False
            found.heartbeat_at = now
            for i in in_flight:
                e = rows.queue.get(i)
                if e is not None and e.lease_owner == self.owner:
                    e.lease_expires = self._store.later(lease_seconds)
            return True

    def release_dead(self, dead_after_seconds: float) -> tuple[list[str], int]:
        """Unregister the host's instances whose heartbeat is stale (never this one) and
        release every lease of the host held by an instance not registered."""
        with self._store.lock:
            rows = self._store.rows
            stale = self._store.later(-dead_after_seconds)
            dead = [
                r.info.id
                for r in rows.registered.values()
                if r.info.host == self.host and r.heartbeat_at < stale and r.info.id != self.owner
            ]
            if not dead:
                return [], 0
            for owner in dead:
                del rows.registered[owner]
            released = 0
            for e in rows.queue.values():
                orphan = e.lease_owner is not None and e.lease_owner not in rows.registered
                if e.host == self.host and e.lease_expires is not None and orphan:
                    e.lease_expires = None
                    released += 1
        if released:
            self._store.signal([self.host])
        return dead, released

    def held_elsewhere(self) -> bool:
        with self._store.lock:
            now = self._store.now()
            return any(
                e.host == self.host
                and e.leased(now)
                and e.lease_owner is not None
                and e.lease_owner not in self._store.live
                for e in self._store.rows.queue.values()
            )

    # --- the queue ---

    def claim(
        self,
        n: int,
        lease_seconds: float,
        *,
        ordered: bool,
        instances: bool,
        outcomes: Outcomes | None = None,
        ordered_most: int | None = None,
        rest_most: int | None = None,
        keyed: int = 0,
        per_key: int = 0,
        keyed_only: bool = False,
    ) -> tuple[list[Claim], Recorded | None]:
        run = (n if ordered_most is None else min(n, ordered_most)) if ordered else 0
        keys = Keys(min(keyed, n), per_key or n, keyed_only and bool(keyed))
        with self._store.lock:
            recorded = self._record(outcomes) if outcomes is not None else None
            claims = picking.claim(
                self._store.rows,
                self.host,
                self.owner,
                self._store.now(),
                lease_seconds,
                n,
                run_most=run,
                rest_most=rest_most,
                keys=keys,
                instances=instances,
            )
        return claims, recorded

    def mark_started(self, claims: Sequence[Claim]) -> None:
        with self._store.lock:
            finishing.mark_started(self._store, self.owner, claims)

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> Recorded:
        with self._store.lock:
            if recheck:
                o = outcomes
                mine = finishing.held(
                    self._store, self.owner, [*o.done, *(f.claim for f in o.failed), *o.unstarted]
                )
                outcomes = replace(
                    o,
                    done=[c for c in o.done if c.id in mine],
                    failed=[f for f in o.failed if f.claim.id in mine],
                    unstarted=[c for c in o.unstarted if c.id in mine],
                )
            return self._record(outcomes)

    def _record(self, o: Outcomes) -> Recorded:
        store = self._store
        result = finishing.finish(
            store, self.owner, o.done, o.failed, o.settings, o.stop_on_failure
        )
        completed = set(result.completed_ids)
        self._publish([c for c in o.done if c.publish and c.id in completed])
        given = finishing.give_back(store, self.owner, o.unstarted)
        if given:
            store.signal([self.host])
        return Recorded(result, given)

    @contextmanager
    def completing(self, claim: Callable[[], Claim]) -> Iterator[MemoryStore]:
        """Complete ``claim()`` when the block ends (the store is what it yields: memory
        has no transaction of the service's own to join, nothing rolls back)."""
        yield self._store
        c = claim()
        with self._store.lock:
            done = Finished()
            finishing.complete(self._store, self.owner, [c], done)
            if not done.completed:
                raise Conflict(f"queue entry {c.id} is no longer leased by {self.owner}")
            self._publish([c])

    def _publish(self, claims: Sequence[Claim]) -> None:
        messages = [m for c in claims for m in c.publish]
        if messages:
            self._store.publish(
                messages, policy=RoutingPolicy.SUSPEND, publisher=self.publisher, strict=False
            )

    def next_available(self) -> float | None:
        with self._store.lock:
            now = self._store.now()
            at = min(
                (
                    e.available_at
                    for e in self._store.rows.queue.values()
                    if e.host == self.host
                    and e.available_at > e.enqueued_at
                    and e.available_at > now
                    and e.state == "ready"
                ),
                default=None,
            )
        return None if at is None else max((at - now).total_seconds(), 0.0)

    def expire(self, batch: int = EXPIRY_BATCH) -> Swept:
        with self._store.lock:
            return finishing.sweep(self._store, self.host, batch)

    # --- service instances (orchestrations) ---

    def next_due(self) -> float | None:
        with self._store.lock:
            self._store.timer_hints.pop(self.host, None)
            return instances.next_due(self._store, self.host)

    def timer_set_before(self, at: float) -> bool:
        with self._store.lock:
            return self._store.timer_hints.get(self.host, math.inf) < at

    def fire_timers(self) -> Counter[str]:
        with self._store.lock:
            queued = instances.fire_timers(self._store, self.host)
        self._store.signal(sorted(queued))
        return queued

    def load(self, instance_ids: Sequence[str]) -> tuple[datetime, dict[str, Stored], set[str]]:
        with self._store.lock:
            return self._store.now(), instances.load(self._store, instance_ids), set()

    def commit_steps(self, steps: Sequence[Step], publisher: str) -> int:
        with self._store.lock:
            discarded = instances.commit_steps(self._store, steps, publisher)
            soonest: dict[str, float] = {}
            for s in (s for s in steps if s.timers and not s.complete):
                due = min(t.due_at.timestamp() for t in s.timers)
                soonest[s.host] = min(due, soonest.get(s.host, math.inf))
            for host, due in soonest.items():
                self._store.timer_hints[host] = min(
                    due, self._store.timer_hints.get(host, math.inf)
                )
        self._store.signal([timer_channel(h) for h in soonest])
        return discarded
