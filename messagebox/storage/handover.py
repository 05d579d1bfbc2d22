"""Hand-over: where one process holds the database (DuckDB), a publish leases the plain
entries it queues for an idle host instance of that process as it stores them, and hands
them to the instance once the transaction commits. The instance handles them at once,
without a claim: on DuckDB a claim (pick, then lease) cost 4-5 ms and the wake-up
before it ~2 ms of a publish-to-handler time of 18 ms.

An entry handed over is stored leased, as a claim would have left it (attempts 1,
claimed now, the instance's lease): if the transaction rolls back, nothing was stored
and the instance's permits are given back; if the instance ends before handling it,
its lease is given back or lapses, as any claimed entry's. Only entries a plain claim
would take now are handed over (ready, due, unexpired, not ordered, not a service
instance's, no key), and only to an instance whose host's entries are all plain and
whose last claim took all there was: an older entry waiting for it would have been
claimed, so none is overtaken (:class:`messagebox.hosts.handover.HandOver`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from messagebox.claims import Claim
from messagebox.port import Taker
from messagebox.storage import ids
from messagebox.storage.dialects import Same
from messagebox.storage.dialects.base import distinct


class Takers:
    """The host instances of one database in this process that take entries handed
    over, by host (kept by :class:`~messagebox.storage.database_local.DatabaseLocal`)."""

    def __init__(self) -> None:
        self._by_host: dict[str, tuple[Taker, ...]] = {}
        self._guard = threading.Lock()

    def watch(self, host: str, taker: Taker) -> Callable[[], None]:
        """Hand ``host``'s entries to ``taker`` when it is idle; returns the function
        that stops it."""
        with self._guard:
            self._by_host[host] = (*self._by_host.get(host, ()), taker)

        def unwatch() -> None:
            with self._guard:
                left = tuple(t for t in self._by_host.get(host, ()) if t is not taker)
                if left:
                    self._by_host[host] = left
                else:
                    self._by_host.pop(host, None)

        return unwatch

    def of(self, host: str) -> tuple[Taker, ...]:
        return self._by_host.get(host, ())  # a tuple, replaced whole: read without the lock

    def __bool__(self) -> bool:
        return bool(self._by_host)


class Handed(NamedTuple):
    """Entries a transaction leased to one taker, and when (monotonic)."""

    taker: Taker
    claims: list[Claim]
    at: float


_KEY = "messagebox.handover"


class _Pending:
    __slots__ = ("handed", "takers")

    def __init__(self, takers: Takers) -> None:
        self.takers = takers
        self.handed: list[Handed] = []


def begin(conn: Any, takers: Takers | None) -> None:
    """Let this transaction hand entries over to ``takers`` (None: it may not: a
    transaction the caller commits, which nothing here hears of)."""
    if takers:
        conn.info[_KEY] = _Pending(takers)
    else:
        conn.info.pop(_KEY, None)


def take(conn: Any) -> list[Handed]:
    """What this transaction handed over (to accept once it commits); forgets it."""
    pending: _Pending | None = conn.info.pop(_KEY, None)
    return [] if pending is None else pending.handed


def accept(handed: Sequence[Handed]) -> None:
    """After the commit: each taker gets its entries."""
    for taker, claims, at in handed:
        taker.accept(claims, time.monotonic() - at)


def cancel(handed: Sequence[Handed]) -> None:
    """The transaction stored nothing: each taker gets its permits back."""
    for taker, claims, _ in handed:
        taker.cancel(len(claims))


def lease(conn: Any, q: dict[str, Sequence[Any]], now: datetime) -> None:
    """Lease the entries of ``q`` (a publish's queue columns, before they are written)
    that a taker of their host reserves for (one with a thread free first), and note
    them for :func:`take`."""
    pending: _Pending | None = conn.info.get(_KEY)
    if pending is None or not pending.takers:
        return
    hosts = q["host"]
    by_host: dict[str, list[int]] = {h: [] for h in distinct(hosts) if pending.takers.of(h)}
    if not by_host:  # no instance of these hosts in this process: nothing more to do
        return
    for i in _plain_now(q, now):
        mine = by_host.get(hosts[i])
        if mine is not None:
            mine.append(i)
    leased: dict[int, Taker] = {}
    for host, entries in by_host.items():
        takers = pending.takers.of(host)
        for taker, busy in [(t, False) for t in takers] + [(t, True) for t in takers]:
            k = taker.reserve(len(entries), busy=busy) if entries else 0
            if k:
                for i in entries[:k]:
                    leased[i] = taker
                handed = Handed(taker, _claims(q, entries[:k], now), time.monotonic())
                pending.handed.append(handed)
                entries = entries[k:]
    if leased:
        _set_leases(q, leased, now)


def _plain_now(q: Mapping[str, Sequence[Any]], now: datetime) -> list[int]:
    """The entries a plain claim would take now."""
    n = len(q["id"])
    state, ordered, instance, due = q["state"], q["ordered"], q["instance_id"], q["available_at"]
    key = q.get("order_key")
    entries: Sequence[int]
    if all(isinstance(c, Same) for c in (state, ordered, instance, due)) and (
        key is None or isinstance(key, Same)
    ):  # the common case: one test for all
        if not n or state[0] != "ready" or ordered[0] or instance[0] is not None:
            return []
        if (key is not None and key[0] is not None) or due[0] > now:
            return []
        entries = range(n)
    else:
        entries = [
            i
            for i in range(n)
            if state[i] == "ready"
            and not ordered[i]
            and instance[i] is None
            and (key is None or key[i] is None)
            and due[i] <= now
        ]
    expires = q.get("expires_at")
    if expires is None:
        return list(entries)
    return [i for i in entries if expires[i] is None or expires[i] > now]


def _claims(q: Mapping[str, Sequence[Any]], entries: list[int], now: datetime) -> list[Claim]:
    """The claims of these entries, as a claim would return them on their first claim."""
    return [
        Claim(
            int(q["id"][i]),
            ids.as_uuid(q["msg"][i]),
            int(q["sub"][i]),
            1,
            int(q["priority"][i]),
            None,
            False,
            now,
            0.0,
        )
        for i in entries
    ]


def _set_leases(q: dict[str, Sequence[Any]], leased: Mapping[int, Taker], now: datetime) -> None:
    """The lease columns of ``q``: what a claim sets on the leased entries."""
    n = len(q["id"])
    owners: list[str | None] = [None] * n
    expires: list[datetime | None] = [None] * n
    claimed: list[datetime | None] = [None] * n
    attempts = list(q["attempts"])
    for i, taker in leased.items():
        owners[i] = taker.owner
        expires[i] = now + timedelta(seconds=taker.lease_seconds)
        claimed[i] = now
        attempts[i] = 1
    q["lease_owner"] = owners
    q["lease_expires"] = expires
    q["claimed_at"] = claimed
    q["attempts"] = attempts
