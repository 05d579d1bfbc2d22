"""What a host instance does to the store, one transaction a call: the storage side of
:mod:`messagebox.hosts` (procrastinate's manager over its connector is the model).

Hosts call this and nothing below it: the queries live in :mod:`messagebox.delivery.leases`
and :mod:`messagebox.delivery.service_instances`; this module decides which transactions take the
in-process write lock (DuckDB) and its store sends the wake-ups when they commit.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox import clock
from messagebox.claims import Claim, in_claim_order
from messagebox.delivery import leases, registry, scheduled, service_instances
from messagebox.errors import Conflict
from messagebox.models import InstanceInfo, RoutingPolicy
from messagebox.outcomes import ClaimAsk, Keys, Outcomes, Recorded, merged
from messagebox.port import Taker
from messagebox.routing import router
from messagebox.steps import Step, Stored
from messagebox.storage import expiry, ids, store_clock
from messagebox.storage.fence import Fence
from messagebox.storage.sharing import Group
from messagebox.storage.store import Store
from messagebox.upkeep import EXPIRY_BATCH, Swept


def timer_channel(host: str) -> str:
    """The in-process wake-up name of a host's timer loop."""
    return f"{host}#timers"


@dataclass(frozen=True)
class _Steps:
    """One thread's steps waiting for a commit (see :meth:`Consumer.commit_steps`)."""

    steps: Sequence[Step]
    publisher: str


def _group(store: Store, key: str) -> Group[Any, Any]:
    """The store's group ``key``, its turn the database's in-process lock."""
    return store.groups.get(key)


def _claim_group(store: Store, owner: str) -> Group[ClaimAsk, tuple[list[Claim], Recorded | None]]:
    """The claims of one host instance waiting for the next transaction."""
    return _group(store, f"claims {owner}")


def _step_group(store: Store) -> Group[_Steps, int]:
    """The steps of a store waiting for the next commit."""
    return _group(store, "steps")


class Consumer:
    """The store as one host instance (``owner``) of ``host`` uses it."""

    def __init__(self, store: Store, host: str, owner: str, publisher: str | None = None) -> None:
        self._store = store
        self._dialect = store.dialect
        self.host = host
        self.owner = owner
        self.publisher = publisher or owner
        """What the messages services publish with their completions name as publisher."""
        if store.outage is not None:
            store.outage.used_by(owner, host)

    @property
    def outages(self) -> int:
        """How many times the store was found lost since it opened
        (:mod:`messagebox.storage.outage`)."""
        return self._store.outage.count if self._store.outage is not None else 0

    @property
    def claims_serialised(self) -> bool:
        """Whether claims are serialised in-process (DuckDB): one claim for several
        threads' batches then does the same work in fewer statements."""
        return self._dialect.one_process

    @property
    def listens(self) -> bool:
        """Whether other processes' publications arrive as wake-ups (:meth:`listen`)."""
        return self._dialect.supports_notify

    # --- wake-ups ---

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when this process queues work for the host; returns the
        function that stops watching."""
        return self._store.local.wakes.watch(self.host, wake)

    def hand_over_to(self, taker: Taker) -> Callable[[], None] | None:
        """Where one process holds the database (DuckDB), have this process's publishes
        hand the host's entries to ``taker`` while it is idle (:mod:`messagebox.storage.handover`);
        returns the function that stops it, or None where nothing is handed over."""
        if not self._dialect.one_process:
            return None
        return self._store.local.takers.watch(self.host, taker)

    def watch_timers(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when a step in this process sets a timer on the host."""
        return self._store.local.wakes.watch(timer_channel(self.host), wake)

    def listen(self, wake: Callable[[], None], stop: threading.Event) -> None:
        """Call ``wake`` when another process queues work for the host, until ``stop``
        (blocks; only where :attr:`listens`)."""
        self._dialect.listen(self._store.url, self.host, wake, stop)

    # --- membership ---

    def register(self, info: InstanceInfo) -> list[str]:
        """Register; returns warnings about the server (see ``Dialect.warnings``).
        Where one process holds the database (DuckDB), the instances registered by a
        process that ended are unregistered, and their leases released, at once."""
        mine = self._store.local.instance_registered(self.owner)
        with self._store.transaction(serial=True) as conn:
            registry.register(conn, info)
            warnings = self._dialect.warnings(conn)
            if self._dialect.one_process:
                gone, released = registry.release_other_processes(conn, self._dialect, mine)
                if gone:
                    warnings.append(
                        f"unregistered {len(gone)} instances of a process that ended "
                        f"({', '.join(gone[:3])}{'…' if len(gone) > 3 else ''}) and released "
                        f"their {released} leases"
                    )
        if self._store.recent is not None:  # it reads the messages published here
            self._store.recent.reader_started()
        return warnings

    def unregister(self) -> int:
        """Unregister; returns the leases released (their host is woken)."""
        try:
            with self._store.transaction(serial=True) as conn:
                released = registry.unregister(conn, self.owner)
                if released:
                    self._dialect.notify(conn, [self.host])
        finally:
            self._store.local.instance_unregistered(self.owner)
            if self._store.recent is not None:
                self._store.recent.reader_stopped()
        return released

    def heartbeat(self, lease_seconds: float, in_flight: Sequence[int], info: InstanceInfo) -> bool:
        """Prove the instance alive and extend the leases in flight; re-registers and
        returns False if it had been declared dead meanwhile."""
        with self._store.transaction(serial=True) as conn:
            alive = registry.heartbeat(conn, self._dialect, self.owner, lease_seconds, in_flight)
            if not alive:
                registry.register(conn, info)
        return alive

    def release_dead(self, dead_after_seconds: float) -> tuple[list[str], int]:
        """Unregister the host's dead instances (never this one) and release their
        leases."""
        with self._store.transaction(serial=True) as conn:
            return registry.release_dead(
                conn, self._dialect, self.host, dead_after_seconds, me=self.owner
            )

    def held_elsewhere(self) -> bool:
        """Whether entries of the host are leased by an instance that is not one of
        this process's (another process at work, or one that ended)."""
        mine = self._store.local.instances()
        with self._store.transaction() as conn:
            return registry.held_elsewhere(conn, self._dialect, self.host, mine)

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
        """Lease up to ``n`` ready entries; with ``outcomes`` (the previous batch's),
        record those first in the same transaction: one commit per batch instead of
        two. Returns the claims and what was recorded (None without ``outcomes``).
        With ``ordered``, the run of an ordered subscription comes first: at most
        ``ordered_most`` entries of it (default ``n``); then at most ``rest_most``
        others (default: ``n`` less the run), so that permits held for a long run
        alone do not take plain entries. Of those, at most ``keyed`` are the runs of
        free keys of subscriptions ordered by a property (``per_key`` a key; see
        :func:`messagebox.delivery.leases.claim_keyed`), all this thread's; with ``keyed_only``
        nothing else is claimed.

        Where transactions are serialised in-process (DuckDB), the claims that other
        threads of this instance ask for while one transaction runs are made together
        in the next one, with all their outcomes: one claim statement for the lot, each
        thread taking its share in claim order. What was recorded is returned to one of
        them (it holds the others' outcomes too; all are the same host instance's), None
        to the others. If that shared claim fails, each thread claims alone."""
        run = (n if ordered_most is None else min(n, ordered_most)) if ordered else 0
        keys = Keys(min(keyed, n), per_key or n, keyed_only and bool(keyed))
        if not self._dialect.one_process or rest_most is not None:
            return self._claim(n, lease_seconds, run, instances, outcomes, rest_most, keys)
        return _claim_group(self._store, self.owner).run(
            ClaimAsk(n, instances, outcomes, run, keys),
            lambda asks: self._claim_shares(asks, lease_seconds),
            lambda ask: self._claim(
                ask.n,
                lease_seconds,
                ask.ordered,
                ask.instances,
                ask.outcomes,
                None,
                ask.keys,
            ),
        )

    def _claim_shares(
        self, asks: list[ClaimAsk], lease_seconds: float
    ) -> list[tuple[list[Claim], Recorded | None]]:
        """One claim for every ask, with all their outcomes; a share each in claim order,
        what was recorded to the first. An ordered run (the first ask that takes one
        asks for at most its own share) goes whole to that ask, as a claim alone would
        give it: a run stays with one thread. So do keyed runs, all to one ask (another
        than the ordered run's where there is one): a key's run stays with one thread."""
        runner = next((i for i, a in enumerate(asks) if a.ordered), None)
        keyer = next((i for i, a in enumerate(asks) if a.keys.most and i != runner), None)
        if keyer is None and runner is not None and asks[runner].keys.most:
            keyer = runner
        keys = Keys()
        if keyer is not None:  # beside the run, within the ask (a claim alone: within it)
            ask = asks[keyer]
            room = ask.n - (ask.ordered if keyer == runner and len(asks) > 1 else 0)
            keys = ask.keys._replace(most=max(0, min(ask.keys.most, room)))
        claims, recorded = self._claim(
            sum(a.n for a in asks),
            lease_seconds,
            0 if runner is None else asks[runner].ordered,
            any(a.instances for a in asks),
            merged([a.outcomes for a in asks if a.outcomes is not None]),
            None,
            keys,
        )
        run = [c for c in claims if c.run] if runner is not None else []
        keyed = [c for c in claims if c.key is not None] if keys.most else []
        rest = [c for c in claims if not c.run and c.key is None] if run or keyed else claims
        shares: list[tuple[list[Claim], Recorded | None]] = []
        start = 0
        for i, ask in enumerate(asks):
            mine = (run if i == runner else []) + (keyed if i == keyer else [])
            room = max(0, ask.n - len(mine))  # the run is at most the runner's ask
            share = mine + rest[start : start + room]
            if mine:
                in_claim_order(share)
            shares.append((share, None if shares else recorded))
            start += room
        return shares

    def _claim(
        self,
        n: int,
        lease_seconds: float,
        ordered: int,
        instances: bool,
        outcomes: Outcomes | None,
        rest_most: int | None = None,
        keys: Keys | None = None,
    ) -> tuple[list[Claim], Recorded | None]:
        """:meth:`claim` in one transaction; ``ordered``: the most entries of an ordered
        run to take first (0: none); ``rest_most``: the most others; ``keys``: of those,
        the most of keyed runs (none by default). Where completions
        and a claim are one statement (PostgreSQL), an ordered run is claimed first,
        alone, and that statement then claims the rest: a transaction of several
        statements made a host with an ordered subscription deliver everything at half
        the rate. After a batch with ordered entries it is that transaction still:
        completed first, a run's subscription is free for its next run in the same
        claim."""
        fused = (
            self._dialect.complete_claim_sql is not None
            and not instances
            and (
                outcomes is None
                or not (
                    outcomes.failed or outcomes.unstarted or any(c.publish for c in outcomes.done)
                )
            )
        )
        # after a batch with ordered entries, those are completed first, in the transaction
        # that claims the next run (their subscription is busy until then)
        keys = keys or Keys()
        if fused and ordered and not (outcomes and any(c.ordered for c in outcomes.done)):
            return self._claim_run_first(
                n, lease_seconds, ordered, instances, outcomes, rest_most, keys
            )
        fused = fused and not ordered and (not keys.most or rest_most is None)
        # the common case is one statement: alone, with no transaction round trips, when
        # tracking (which writes rows of its own) is off
        with self._store.transaction(
            serial=True, autocommit=fused and self._store.tracking_off()
        ) as conn:
            if fused:
                finished, claims = leases.complete_and_claim(
                    conn,
                    self._dialect,
                    host=self.host,
                    owner=self.owner,
                    completed=outcomes.done if outcomes is not None else (),
                    n=n,
                    lease_seconds=lease_seconds,
                    keyed=keys.most,
                    per_key=keys.per_key,
                )
                return claims, None if outcomes is None else Recorded(finished, 0)
            if outcomes is not None and any(c.publish for c in outcomes.done):
                router.prelude(conn, self._dialect)  # the routing fence first (fence.py)
            recorded = self._record(conn, outcomes) if outcomes is not None else None
            claims = leases.claim(
                conn,
                self._dialect,
                host=self.host,
                owner=self.owner,
                n=n,
                lease_seconds=lease_seconds,
                ordered=bool(ordered),
                instances=instances,
                ordered_most=ordered,
                rest_most=rest_most,
                keyed=keys.most,
                per_key=keys.per_key,
                plain=not keys.only,
            )
        return claims, recorded

    def _claim_run_first(
        self,
        n: int,
        lease_seconds: float,
        ordered: int,
        instances: bool,
        outcomes: Outcomes | None,
        rest_most: int | None,
        keys: Keys,
    ) -> tuple[list[Claim], Recorded | None]:
        """:meth:`_claim` where completions and a claim are one statement: the run alone
        first, then that statement for the rest (given back if it fails)."""
        with self._store.transaction(serial=True, autocommit=self._store.tracking_off()) as conn:
            first = leases.claim_run(
                conn,
                self._dialect,
                host=self.host,
                owner=self.owner,
                n=ordered,
                lease_seconds=lease_seconds,
            )
        room = n - len(first) if rest_most is None else min(n - len(first), rest_most)
        if room == 0 and outcomes is None:
            return first, None
        try:
            rest, recorded = self._claim(
                room,
                lease_seconds,
                0,
                instances,
                outcomes,
                None,
                keys._replace(most=min(keys.most, room)),
            )
        except BaseException:
            with contextlib.suppress(Exception), self._store.transaction(serial=True) as conn:
                leases.give_back(conn, self.owner, first)  # the run goes on elsewhere
            raise
        claims = first + rest
        in_claim_order(claims)
        return claims, recorded

    def mark_started(self, claims: Sequence[Claim]) -> None:
        with self._store.transaction(serial=True) as conn:
            leases.mark_started(conn, self.owner, claims)

    def record(self, outcomes: Outcomes, *, recheck: bool = False) -> Recorded:
        """Complete, fail and give back in one transaction. ``recheck``: only entries
        whose delivery is still the one claimed (outcomes written late)."""
        with self._store.transaction(serial=True) as conn:
            if any(c.publish for c in outcomes.done):
                router.prelude(conn, self._dialect)  # the routing fence first (fence.py)
            if recheck:
                mine = leases.held(
                    conn,
                    self._dialect,
                    self.owner,
                    [*outcomes.done, *(f.claim for f in outcomes.failed), *outcomes.unstarted],
                )
                outcomes = replace(
                    outcomes,
                    done=[c for c in outcomes.done if c.id in mine],
                    failed=[f for f in outcomes.failed if f.claim.id in mine],
                    unstarted=[c for c in outcomes.unstarted if c.id in mine],
                )
            return self._record(conn, outcomes)

    def _record(self, conn: sa.Connection, outcomes: Outcomes) -> Recorded:
        o = outcomes
        result = leases.finish(
            conn, self._dialect, self.owner, o.done, o.failed, o.settings, o.stop_on_failure
        )
        if any(c.publish for c in o.done):  # for the entries completed here (still ours)
            completed = set(result.completed_ids)
            self._publish([c for c in o.done if c.publish and c.id in completed], conn)
        given = leases.give_back(conn, self.owner, o.unstarted)
        if given:
            self._dialect.notify(conn, [self.host])
        return Recorded(result, given)

    @contextmanager
    def completing(self, claim: Callable[[], Claim]) -> Iterator[sa.Connection]:
        """A transaction for a service's own statements (``Delivery.transaction``) that
        completes the entry ``claim()`` gives when the block ends (with what its service
        published on completion meanwhile): see :meth:`complete_in`."""
        with self._store.transaction(fence=Fence.ROUTES, owned=True) as conn:
            yield conn
            self.complete_in(conn, claim())

    def complete_in(self, conn: sa.Connection, claim: Claim) -> None:
        """Complete ``claim`` in a transaction of the caller's (a service's own, through
        ``Delivery.transaction``), with what its service published on completion.
        Raises :class:`~messagebox.errors.Conflict` if the entry is no longer this
        instance's: the caller's transaction then rolls back, its rows with it."""
        if claim.publish:
            router.prelude(conn, self._dialect)  # the routing fence (fence.py)
        done = leases.complete(conn, self._dialect, self.owner, [claim])
        if not done.completed:
            raise Conflict(
                f"queue entry {claim.id} is no longer leased by {self.owner} (its lease "
                "lapsed and another delivery took it): nothing of this transaction commits"
            )
        self._publish([claim], conn)

    def _publish(self, claims: Sequence[Claim], conn: sa.Connection) -> None:
        """Publish what the services of completed entries published with their
        completions, in the completing transaction: as an orchestration step's
        publications, a message that no subscription takes is suspended (it never fails
        the completions), and no host is throttled."""
        messages = [m for c in claims for m in c.publish]
        if messages:
            router.publish(
                conn,
                self._dialect,
                messages,
                ids.uuid7s(len(messages)),
                policy=RoutingPolicy.SUSPEND,
                publisher=self.publisher,
                now=store_clock.now(conn),
                strict=False,  # a message due after its expiry expires: the completion stands
            )

    def next_available(self) -> float | None:
        """Seconds until the host's next entry that is not due yet becomes due
        (scheduled, or waiting for its retry), or None when there is none."""
        with self._store.transaction() as conn:  # a read: no write lock while idle
            return scheduled.next_available(conn, self.host)

    def expire(self, batch: int = EXPIRY_BATCH) -> Swept:
        """Suspend or drop up to ``batch`` of the host's expired entries not in hand."""
        with self._store.transaction(serial=True) as conn:
            return expiry.sweep(conn, self._dialect, self.host, batch)

    # --- service instances (orchestrations) ---

    def next_due(self) -> float | None:
        """Seconds until the host's next timer is due (0 if one is), or None. A look at
        the timers: what :meth:`timer_set_before` says starts again from here."""
        self._store.local.timers_looked_at(self.host)
        with self._store.transaction() as conn:  # a read: no write lock while idle
            return service_instances.next_due(conn, self.host)

    @property
    def timers_set_here(self) -> bool:
        """Whether every timer of the store is set by a step in this process (DuckDB:
        one process), so that :meth:`timer_set_before` knows of each one."""
        return self._dialect.one_process

    def timer_set_before(self, at: float) -> bool:
        """Whether a step in this process set a timer of the host due before ``at``
        (seconds since the epoch) since the host's timers were last looked at
        (:meth:`next_due`). A timer loop that looks by ``at`` anyway need not be woken
        for a later one: timers set with long time-outs then cost it no read."""
        return self._store.local.timer_set_before(self.host, at)

    def fire_timers(self) -> Counter[str]:
        """Queue the host's due timeouts; returns the entries queued per host."""
        with self._store.transaction(serial=True) as conn:
            return service_instances.fire_timers(
                conn, self._dialect, self.host, store_clock.now(conn)
            )

    def load(self, instance_ids: Sequence[str]) -> tuple[datetime, dict[str, Stored], set[str]]:
        """The store's time, the saved instances of these ids, and which of the missing
        ones are convoys still being created (their first step has not committed)."""
        with self._store.transaction(autocommit=True) as conn:  # one statement
            stored, convoys = (
                service_instances.load(conn, self._dialect, instance_ids)
                if instance_ids
                else ({}, set())
            )
            return store_clock.now(conn), stored, convoys  # timeouts fall due by the store's clock

    def commit_steps(self, steps: Sequence[Step], publisher: str) -> int:
        """Commit steps at once (see :func:`messagebox.delivery.service_instances.commit_steps`);
        returns the messages discarded by completions.

        Where transactions are serialised in-process (DuckDB), the steps that other
        threads of the store bring while one commit runs are committed together in the
        next one (a group commit: DuckDB costs about a millisecond a statement whatever
        its row count). If that shared commit fails, each thread commits its own steps
        alone, so an error stays with the steps that caused it."""
        mine = _Steps(steps, publisher)
        if not self._dialect.one_process:
            return self._commit_steps([mine])[0]
        return _step_group(self._store).run(
            mine, self._commit_steps, lambda alone: self._commit_steps([alone])[0]
        )

    def _commit_steps(self, together: list[_Steps]) -> list[int]:
        """Commit the steps of ``together`` in one transaction (those of one publisher and
        owner set-based); the messages each one's completions discarded, counted once
        per run (by its first)."""
        by_run: dict[tuple[str, str], list[int]] = {}
        for i, asked in enumerate(together):
            by_run.setdefault((asked.publisher, asked.steps[0].owner), []).append(i)
        discarded = [0] * len(together)
        with self._store.transaction(serial=True) as conn:
            if any(s.publish for a in together for s in a.steps):
                router.prelude(conn, self._dialect)  # the routing fence first (fence.py)
            for (publisher, _), run in by_run.items():
                steps = [s for i in run for s in together[i].steps]
                _, discarded[run[0]] = service_instances.commit_steps(
                    conn, self._dialect, steps, publisher=publisher
                )
            # timers fall due by the store's clock; the timer loop waits by this process's
            ahead = store_clock.now(conn).timestamp() - clock.local_now().timestamp()
        soonest: dict[str, float] = {}  # per host, the earliest timer these steps set
        for s in (s for a in together for s in a.steps if s.timers and not s.complete):
            due = min(t.due_at.timestamp() for t in s.timers) - ahead
            soonest[s.host] = min(due, soonest.get(s.host, math.inf))
        if soonest:  # committed: hint first, then wake (a look now sees the timers)
            local = self._store.local
            for host, due in soonest.items():
                local.timer_set(host, due)
            local.wakes.signal([timer_channel(h) for h in soonest])
        return discarded
