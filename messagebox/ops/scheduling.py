"""What an operator does with scheduled queue entries on
:class:`~messagebox.engine.MessageBox` (docs/concepts.md: Scheduled delivery): list
them, deliver them now, or cancel them, by id or in bulk."""

from __future__ import annotations

from collections.abc import Sequence

from messagebox.config.catalog import Catalog
from messagebox.delivery.scheduled import ScheduledEntry, ScheduledQuery
from messagebox.errors import ValidationError
from messagebox.ops.operations import Operations


class Scheduling:
    """The scheduled-entry methods of a MessageBox."""

    catalog: Catalog
    operations: Operations

    def scheduled(
        self,
        *,
        host: str | None = None,
        subscription: int | str | None = None,
        service: str | None = None,
        limit: int = 1000,
    ) -> list[ScheduledEntry]:
        """Queue entries not due yet that were never delivered (``deliver_at``,
        ``delay``), the first due first, optionally of one host, subscription (id or
        name) or service. Entries waiting for a retry are not among them."""
        if type(limit) is not int or limit < 1:
            raise ValidationError(f"limit must be a positive int, not {limit!r}")
        query = ScheduledQuery(host=host, subscription=self._sub_id(subscription), service=service)
        return self.operations.scheduled(query, limit)

    def deliver_now(
        self,
        *entry_ids: int,
        host: str | None = None,
        subscription: int | str | None = None,
        service: str | None = None,
    ) -> list[int]:
        """Make scheduled entries due now: the given ids (each must be scheduled; all or
        none), or every one of the host, subscription (id or name) or service given.
        Idle host instances are woken. Returns the ids."""
        return self.operations.deliver_now(self._query(entry_ids, host, subscription, service))

    def cancel_scheduled(
        self,
        *entry_ids: int,
        host: str | None = None,
        subscription: int | str | None = None,
        service: str | None = None,
    ) -> list[int]:
        """Delete scheduled entries and release their references (cleanup then deletes
        a message nothing else refers to): the given ids (all or none), or every one of
        the host, subscription (id or name) or service given. Returns the ids."""
        return self.operations.cancel_scheduled(self._query(entry_ids, host, subscription, service))

    def _sub_id(self, ref: int | str | None) -> int | None:
        return None if ref is None else self.catalog.subscription(ref).id

    def _query(
        self,
        entry_ids: Sequence[int],
        host: str | None,
        subscription: int | str | None,
        service: str | None,
    ) -> ScheduledQuery:
        """The scheduled entries named by ids or by filters (not both, not neither)."""
        filters = (host, subscription, service)
        if not entry_ids and all(f is None for f in filters):
            raise ValidationError(
                "name the scheduled entries: give ids, or a host, subscription or service"
            )
        if entry_ids and any(f is not None for f in filters):
            raise ValidationError("give either scheduled entry ids or filters, not both")
        for entry in entry_ids:
            if type(entry) is not int:
                raise ValidationError(f"queue entry id {entry!r} is not an int")
        return ScheduledQuery(
            ids=tuple(entry_ids) if entry_ids else None,
            host=host,
            subscription=self._sub_id(subscription),
            service=service,
        )
