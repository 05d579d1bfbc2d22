"""The subscriptions of a host as one of its instances knows them: read from the store
at start, by each heartbeat, and when an entry names one not known yet; and what they
say about how to claim (ordered runs, keyed runs, service instances) and record
(subscriptions that stop at a failure)."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Collection, Sequence
from typing import Protocol

from messagebox.hosts.events import InstanceLog, log
from messagebox.models import Kind, OnFailure, State, Subscription


class SubscriptionSource(Protocol):
    """Where the subscriptions are read (the engine)."""

    def subscriptions(self, *, host: str | None = None) -> Sequence[Subscription]: ...


class HostSubscriptions:
    """The host's subscriptions, replaced whole on each :meth:`refresh` (read without a
    lock), and those already logged as naming a service the instance does not run."""

    def __init__(
        self,
        source: SubscriptionSource,
        host: str,
        services: Collection[str],
        *,
        uses_instances: bool,
        events: InstanceLog,
    ) -> None:
        self._source = source
        self._host = host
        self._services = services
        self._uses_instances = uses_instances
        self._events = events
        self._subs: dict[int, Subscription] = {}
        self._lock = threading.Lock()
        self._warned_unserved: set[int] = set()

    def refresh(self) -> None:
        """Read them again; warn once of each that routes to a service not run here."""
        subs = {s.id: s for s in self._source.subscriptions(host=self._host)}
        with self._lock:
            self._subs = subs
            unserved = [
                s
                for s in subs.values()
                if s.service not in self._services
                and s.state is not State.UNENLISTED
                and s.id not in self._warned_unserved
            ]
            self._warned_unserved.update(s.id for s in unserved)
        for sub in unserved:
            log.warning(
                "host instance %s: subscription %r (id %d) routes to service %r, which this "
                "instance does not run; its messages fail and are suspended after their "
                "attempts. %s",
                self._events.instance,
                sub.name,
                sub.id,
                sub.service,
                self.unserved_hint(sub.service),
                extra=self._events.fields(
                    "unserved-subscription", subscription=sub.id, service=sub.service
                ),
            )

    def unserved_hint(self, service: str) -> str:
        """What this instance runs instead of ``service``, and the likeliest misspelling."""
        runs = sorted(self._services)
        close = difflib.get_close_matches(service, runs, n=1, cutoff=0.6)
        hint = f"Did you mean {close[0]!r}? " if close else ""
        return hint + f"It runs: {', '.join(runs) or 'no service'}."

    def unserved(self) -> list[Subscription]:
        """The enlisted subscriptions that route to a service this instance does not run."""
        with self._lock:
            return [
                s
                for s in self._subs.values()
                if s.service not in self._services and s.state is not State.UNENLISTED
            ]

    def get(self, sub_id: int) -> Subscription | None:
        """Subscription ``sub_id``, read again from the store when it is not known."""
        found = self._subs.get(sub_id)  # replaced whole, never changed in place: no lock
        if found is None:
            self.refresh()
            with self._lock:
                found = self._subs.get(sub_id)
        return found

    def known(self) -> dict[int, Subscription]:
        """Those known now, without asking the store (where that must not fail)."""
        with self._lock:
            return dict(self._subs)

    def any_ordered(self) -> bool:
        with self._lock:
            return any(s.ordered for s in self._subs.values())

    def keyed_share(self, n: int) -> tuple[int, bool]:
        """How many of a claim of ``n`` may be keyed runs (subscriptions ordered by a
        property), and whether nothing else is to be claimed: none without such a
        subscription; all of it when every other subscription of the host is one too
        (nothing else then); else half (at least one), so that neither the keyed
        entries nor the others wait for all of the other kind."""
        with self._lock:
            subs = [s for s in self._subs.values() if s.state is not State.UNENLISTED]
        keyed = sum(1 for s in subs if s.ordered_by)
        if not keyed:
            return 0, False
        only = keyed == len(subs) and not self._uses_instances
        return (n, True) if only else (max(1, n // 2), False)

    def may_name_instances(self) -> bool:
        """Whether entries of this host can be for a service instance (claimed one at
        a time per instance)."""
        if self._uses_instances:
            return True
        with self._lock:
            return any(s.kind is Kind.INSTANCE or s.correlation for s in self._subs.values())

    def stopping_on_failure(self) -> set[int]:
        """The ids of the subscriptions that stop at a suspended message."""
        with self._lock:
            return {s.id for s in self._subs.values() if s.on_failure is OnFailure.STOP}
