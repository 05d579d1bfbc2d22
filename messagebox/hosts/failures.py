"""What a failed delivery means for its entry: a service's exception (retried, retried
later, permanent, a zombie), the store's failure (retried, not charged), an entry used
up by host processes that ended while handling it, or one that cannot be delivered."""

from __future__ import annotations

import traceback
from typing import Any

from messagebox.claims import MAX_BACKOFF_SECONDS, Claim, Failure
from messagebox.errors import BackendUnavailable, InstanceCompleted, PermanentFailure, RetryLater
from messagebox.hosts.dispatch import InstanceStats
from messagebox.hosts.events import InstanceLog, log
from messagebox.hosts.service import Delivery
from messagebox.hosts.subscriptions import HostSubscriptions
from messagebox.models import CRASHED_HOST, SUBSCRIPTION_REMOVED, HostSettings, Subscription


class FailureJudge:
    """Turns what went wrong with a delivery into its entry's :class:`Failure`, counted
    and logged."""

    def __init__(
        self,
        settings: HostSettings,
        subscriptions: HostSubscriptions,
        stats: InstanceStats,
        events: InstanceLog,
    ) -> None:
        self._settings = settings
        self._subscriptions = subscriptions
        self._stats = stats
        self._events = events

    def used_up(self, c: Claim) -> Failure:
        """An entry charged ``max_attempts`` before this delivery: suspended unseen, as
        ``crashed-host`` when its host ended during its last delivery."""
        if not (c.interrupted and c.crashed_by):  # max_attempts was lowered since
            return Failure(
                c,
                f"it was charged {c.charges} attempts, max_attempts is "
                f"{self._settings.max_attempts}",
                permanent=True,
            )
        self._stats.add(crashed=1)
        error = (
            f"a host process ended while handling it (the last time: instance "
            f"{c.crashed_by}); with its failures that makes {c.charges} attempts, and it "
            "is suspended so that it does not end another"
        )
        log.error(
            "host instance %s: entry %d (message %s): %s",
            self._events.instance,
            c.id,
            c.msg,
            error,
            extra=self._events.fields(
                "crashed-host", entry=c.id, message_id=str(c.msg), crashed_by=c.crashed_by
            ),
        )
        return Failure(c, error, permanent=True, reason=CRASHED_HOST)

    def undeliverable(self, c: Claim, sub: Subscription | None) -> Failure:
        """The failure of an entry whose subscription is gone or whose service this
        instance does not run."""
        if sub is None:
            return Failure(
                c,
                "its subscription was removed before it was delivered",
                permanent=True,
                reason=SUBSCRIPTION_REMOVED,
            )
        return Failure(
            c,
            f"service {sub.service!r} is not registered in host instance "
            f"{self._events.instance}. " + self._subscriptions.unserved_hint(sub.service),
        )

    def store_failed(self, c: Claim, exc: BaseException) -> Failure:
        """The store failed during a delivery: retried, without using up an attempt."""
        self._stats.add(engine_failures=1)
        log.warning(
            "host instance %s: the store failed while delivering entry %d (%s); it is "
            "delivered again, not counted as an attempt",
            self._events.instance,
            c.id,
            exc,
            extra=self._events.fields("store-failed", entry=c.id, error=str(exc)),
        )
        return Failure(
            c,
            f"{type(exc).__name__}: {exc}",
            charge=False,
            retry_after=min(
                self._settings.retry_backoff_seconds * 2 ** min(c.attempts - 1, 10),
                MAX_BACKOFF_SECONDS,
            ),
        )

    def of_error(
        self, c: Claim, sub: Subscription, exc: BaseException, d: Delivery | None = None
    ) -> Failure:
        """What a service's exception means for its entry."""
        if isinstance(exc, BackendUnavailable) or (
            d is not None and isinstance(d.storage_error, BackendUnavailable)
        ):
            return self.store_failed(c, exc)
        self._stats.add(failed=1)
        instance = self._events.instance
        if isinstance(exc, PermanentFailure):
            if isinstance(exc, InstanceCompleted):
                self._stats.add(zombies=1)
                log.warning(
                    "host instance %s: zombie message %s: %s",
                    instance,
                    c.msg,
                    exc,
                    extra=self._fields("zombie", c, sub, exc),
                )
            return Failure(c, f"{type(exc).__name__}: {exc}", permanent=True, reason=exc.reason)
        if isinstance(exc, RetryLater):
            log.info(
                "host instance %s: service %r retries entry %d in %.3g s (attempt %d): %s",
                instance,
                sub.service,
                c.id,
                exc.delay,
                c.attempts,
                exc,
                extra=self._fields("retry-later", c, sub, exc),
            )
            return Failure(c, f"RetryLater: {exc}", retry_after=exc.delay, charge=False)
        if not isinstance(exc, Exception):
            log.error(
                "host instance %s: service %r raised %s on entry %d (attempt %d): a "
                "service cannot end its host instance; the entry fails",
                instance,
                sub.service,
                type(exc).__name__,
                c.id,
                c.attempts,
                extra=self._fields("delivery-failed", c, sub, exc),
            )
        else:
            log.warning(
                "host instance %s: service %r failed entry %d (attempt %d): %s",
                instance,
                sub.service,
                c.id,
                c.attempts,
                exc,
                extra=self._fields("delivery-failed", c, sub, exc),
            )
        return Failure(c, "".join(traceback.format_exception(exc)))

    def _fields(
        self, event: str, c: Claim, sub: Subscription, exc: BaseException
    ) -> dict[str, Any]:
        """Structured log fields of an event about one queue entry."""
        return self._events.fields(
            event,
            service=sub.service,
            subscription=sub.id,
            entry=c.id,
            message_id=str(c.msg),
            attempt=c.attempts,
            error=f"{type(exc).__name__}: {exc}",
        )
