"""The suspended entries of :class:`~messagebox.engine.MessageBox`: list and count them,
group them by how they failed, resume, terminate and reroute them, one at a time or in
bulk (docs/concepts.md: Suspended entries; docs/operations.md: Failure groups)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from messagebox.models import SuspendedEntry
from messagebox.ops.failures import FailureGroup
from messagebox.ops.operations import Operations, new_expiry, suspended_query
from messagebox.storage.suspension import SuspendedQuery


class SuspendedEntries:
    """The suspended-entry methods of a MessageBox."""

    operations: Operations

    def suspended(
        self,
        *,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        subscription: int | None = None,
        message_id: uuid.UUID | str | None = None,
        before: datetime | None = None,
        limit: int = 1000,
        offset: int = 0,
        newest_first: bool = False,
        ids: Sequence[int] | None = None,
        error: str | None = None,
        group: str | None = None,
    ) -> list[SuspendedEntry]:
        """Suspended entries, oldest first (by suspension time, then id; newest first
        with ``newest_first``), after skipping ``offset`` of them, optionally only those
        of ``ids`` and filtered (``before``: suspended before that time; ``error``: text
        the error contains, in any case; ``group``: a failure group's id, see
        :meth:`failure_group`; an unknown ``host`` raises
        :class:`~messagebox.errors.UnknownHost`)."""
        query = SuspendedQuery(
            ids=None if ids is None else tuple(ids),
            reason=reason,
            host=host,
            service=service,
            subscription=subscription,
            message_id=None if message_id is None else uuid.UUID(str(message_id)),
            before=before,
            error=error,
            group=group,
        )
        return self.operations.suspended(query, limit, offset=offset, newest_first=newest_first)

    def count_suspended(
        self,
        *,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        error: str | None = None,
        group: str | None = None,
    ) -> int:
        """How many suspended entries match the filters (as :meth:`suspended`'s)."""
        return self.operations.count_suspended(
            SuspendedQuery(reason=reason, host=host, service=service, error=error, group=group)
        )

    def failure_groups(self, scan: int = 100_000) -> list[FailureGroup]:
        """The ``scan`` newest suspended entries grouped by how they failed: reason,
        service, exception type and where it was raised (or, without a traceback, the
        message with its ids masked), largest group first (:mod:`messagebox.ops.failures`)."""
        return self.operations.failure_groups(scan)

    def failure_group(self, group_id: str, scan: int = 100_000) -> FailureGroup:
        """One failure group, by its id (stable: a hash of what groups its entries);
        :class:`~messagebox.errors.UnknownFailureGroup` when none of the ``scan``
        newest entries is in it."""
        return self.operations.failure_group(group_id, scan)

    def suspended_entry(self, entry_id: int) -> SuspendedEntry:
        """One suspended entry, by id."""
        return self.operations.suspended_entry(entry_id)

    def resume(
        self,
        *entry_ids: int,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        subscription: int | None = None,
        before: datetime | None = None,
        error: str | None = None,
        group: str | None = None,
        batch: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        ttl: float | None = None,
        expires_at: datetime | None = None,
    ) -> list[int]:
        """Put suspended entries back on their queues: the given ids (each must exist
        and be resumable), or every resumable entry matching the filters (those of
        :meth:`suspended`; ``group``: a failure group's entries now). They keep
        their place in publish order and start again from attempt 1. Returns the ids.
        They expire ``ttl`` seconds after the resume, or at ``expires_at`` (an
        ``expired`` entry resumed without either never expires).

        Ids are resumed in one transaction, all or none. Filters too, unless ``batch``
        is given: then ``batch`` entries per transaction, lowest ids first, calling
        ``progress(done, total)`` after each (``total`` is counted at the start).
        """
        query = suspended_query(
            entry_ids, reason, host, service, subscription, before, error, group
        )
        return self.operations.resume(query, batch, progress, new_expiry(ttl, expires_at))

    def terminate(
        self,
        *entry_ids: int,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        subscription: int | None = None,
        before: datetime | None = None,
        error: str | None = None,
        group: str | None = None,
        batch: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        """Delete suspended entries (the given ids, or every one matching the filters)
        and release their references; cleanup then removes unreferenced messages.
        ``batch`` and ``progress`` work as for :meth:`resume`."""
        query = suspended_query(
            entry_ids, reason, host, service, subscription, before, error, group
        )
        return self.operations.terminate(query, batch, progress)

    def reroute(self, *entry_ids: int) -> dict[int, tuple[int, ...]]:
        """Route suspended routing failures, and entries whose subscription was removed,
        again (all of them when no id is given).

        Those that now match a subscription move to their hosts' queues; the rest stay
        suspended. Returns the subscriptions each moved entry went to.
        """
        return self.operations.reroute(entry_ids)
