"""What an operator watches on :class:`~messagebox.engine.MessageBox`: message
tracking, the audit log, per-minute rates, heartbeats and throughput
(docs/operations.md)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from messagebox.errors import ValidationError
from messagebox.models import Throughput
from messagebox.ops.operations import Operations
from messagebox.storage.audit import AuditEntry
from messagebox.storage.rollup import Rates
from messagebox.storage.tracking import TrackedEvent, TrackingSettings


class Watching:
    """The watching methods of a MessageBox."""

    operations: Operations

    def tracking(self) -> TrackingSettings:
        """Whether message tracking is enabled, and its retention."""
        return self.operations.tracking()

    def configure_tracking(
        self, enabled: bool, *, retention: timedelta | float | None = None
    ) -> TrackingSettings:
        """Enable or disable message tracking for every process using this store;
        ``retention`` (a timedelta, or seconds) is how long events are kept (default:
        unchanged, else 7 days). Other processes see the change within a few seconds."""
        return self.operations.configure_tracking(enabled, retention)

    def tracked(
        self,
        message_id: uuid.UUID | str | None = None,
        *,
        event: str | None = None,
        host: str | None = None,
        subscription: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
    ) -> list[TrackedEvent]:
        """Tracked events, oldest first: one message's history, or the newest ``limit``
        events matching the filters. Empty while tracking has never been enabled."""
        return self.operations.tracked(
            message_id,
            {
                "event": event,
                "host": host,
                "subscription": subscription,
                "since": since,
                "until": until,
                "limit": limit,
            },
        )

    def audit(
        self,
        action: str,
        *,
        who: str,
        role: str,
        via: str,
        target: str | None = None,
        count: int | None = None,
        detail: str | None = None,
    ) -> None:
        """Record an operator action in the audit log (:mod:`messagebox.storage.audit`)."""
        self.operations.audit(
            action, who=who, role=role, via=via, target=target, count=count, detail=detail
        )

    def audit_log(self, limit: int = 200) -> list[AuditEntry]:
        """The newest recorded operator actions, newest first."""
        return self.operations.audit_log(limit)

    def rates(self, minutes: int = 60) -> Rates:
        """Per-minute counts of the last ``minutes`` minutes (published, routed,
        delivered, failed, suspended…, by host or reason) and each host's sampled queue
        depth, kept whether or not tracking is on (:mod:`messagebox.storage.rollup`)."""
        if not 1 <= minutes <= 24 * 60:
            raise ValidationError(f"minutes must be from 1 to 1440, got {minutes!r}")
        return self.operations.rates(minutes)

    def heartbeat_ages(self) -> dict[str, float]:
        """Seconds since each registered host instance's last heartbeat, by instance id
        (by the database clock)."""
        return self.operations.heartbeat_ages()

    def throughput(self, windows: Sequence[float] = (60.0, 3600.0)) -> list[Throughput]:
        """Tracked events (published, delivered, suspended…) per kind over each recent
        window of seconds, by the database clock. Counted from message tracking: zero
        while it is disabled, and only since it was enabled."""
        return self.operations.throughput(windows)
