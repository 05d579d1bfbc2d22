"""What an operator reads and steers: queues, statistics, suspended entries (resume,
terminate, reroute), registered instances, message tracking and cleanup (the storage
side of :class:`~messagebox.engine.MessageBox`'s operations methods)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from messagebox import timing
from messagebox.config.catalog import check_host
from messagebox.delivery import registry, scheduled
from messagebox.delivery.scheduled import ScheduledEntry, ScheduledQuery
from messagebox.errors import UnknownFailureGroup, UnknownSuspendedEntry, ValidationError
from messagebox.models import (
    REROUTABLE,
    ROUTING_FAILURE,
    HostStats,
    InstanceInfo,
    QueueDepth,
    QueueStats,
    Stats,
    SuspendedEntry,
    Throughput,
)
from messagebox.ops import browse, failures, orchestrations
from messagebox.ops import stats as box_stats
from messagebox.ops.failures import FailureGroup, FailureRow
from messagebox.properties import Value
from messagebox.routing import router
from messagebox.storage import audit as audits
from messagebox.storage import rollup, schema, store_clock, suspension, tracking
from messagebox.storage.fence import Fence
from messagebox.storage.store import Store
from messagebox.storage.suspension import SuspendedQuery
from messagebox.storage.tracking import EventQuery, TrackedEvent, TrackingSettings

if TYPE_CHECKING:
    from messagebox.delivery.cleanup import CleanupReport
    from messagebox.ops.instance_history import InstanceDetail
    from messagebox.ops.search import SearchQuery, SearchResult
    from messagebox.storage.consistency import Problem

Action = Callable[[sa.Connection, Any, SuspendedQuery, int | None], list[int]]
"""A suspended-queue action (:func:`suspension.resume`, :func:`suspension.terminate`)."""


def suspended_query(
    entry_ids: Sequence[int],
    reason: str | None,
    host: str | None,
    service: str | None,
    subscription: int | None,
    before: datetime | None,
    error: str | None = None,
    group: str | None = None,
) -> SuspendedQuery:
    """The suspended entries named by ids or by filters (not both, not neither)."""
    filters = (reason, host, service, subscription, before, error, group)
    if not entry_ids and all(f is None for f in filters):
        raise ValidationError(
            "name the suspended entries: give ids, or at least one filter "
            "(reason, host, service, subscription, before, error, group)"
        )
    if entry_ids and any(f is not None for f in filters):
        raise ValidationError("give either suspended entry ids or filters, not both")
    for entry in entry_ids:
        if type(entry) is not int:
            raise ValidationError(f"suspended entry id {entry!r} is not an int")
    return SuspendedQuery(
        ids=tuple(entry_ids) if entry_ids else None,
        reason=reason,
        host=host,
        service=service,
        subscription=subscription,
        before=before,
        error=error,
        group=group,
    )


def new_expiry(ttl: float | None, expires_at: datetime | None) -> suspension.NewExpiry:
    """The expiry resumed entries get (checked): ``ttl`` seconds after the resume, or
    ``expires_at``; neither: none."""
    if ttl is not None and expires_at is not None:
        raise ValidationError("give ttl or expires_at, not both")
    if ttl is not None and not timing.seconds("ttl", ttl):
        raise ValidationError("ttl must be more than 0 seconds")
    at = None if expires_at is None else timing.instant("expires_at", expires_at)
    return suspension.NewExpiry(ttl=None if ttl is None else float(ttl), at=at)


def _suspended_entry(r: Any) -> SuspendedEntry:
    report = json.loads(r.report) if r.report else None
    if report is None and r.reason == ROUTING_FAILURE and r.context is not None:
        report = routing_failure_report(r.context, r.published_at, r.publisher)
    return SuspendedEntry(
        id=r.id,
        message_id=r.msg,
        subscription=r.sub,
        host=r.host,
        resumable=bool(r.resumable),
        reason=r.reason,
        error=r.error,
        report=report,
        attempts=r.attempts,
        suspended_at=r.suspended_at,
    )


def _with_spool(select: sa.Select[Any]) -> sa.Select[Any]:
    """``select`` of suspended entries with what a routing-failure report is made of."""
    s, sp = schema.suspended, schema.spool
    return select.add_columns(sp.c.context, sp.c.published_at, sp.c.publisher).outerjoin(
        sp, sa.and_(sp.c.id == s.c.msg, s.c.reason == ROUTING_FAILURE, s.c.report.is_(None))
    )


def routing_failure_report(context: str, published_at: datetime, publisher: str) -> dict[str, Any]:
    """A routing failure's report, from its message's spool row (a publish stores none:
    it would repeat the spool): the properties the message had, when and by whom it was
    published."""
    return {
        "properties": json.loads(context)["promoted"],
        "time": published_at.isoformat(),
        "publisher": publisher,
    }


class Snapshot(NamedTuple):
    """What the metrics gauges read, from one transaction."""

    queues: list[QueueStats]
    hosts: list[HostStats]
    counts: Stats
    ages: list[tuple[str, str, float]]
    """(host, instance id, seconds since its last heartbeat)."""


class Operations:
    """Reads and actions over one store's queues, suspended entries and instances."""

    def __init__(self, store: Store) -> None:
        self._store = store

    # --- queues and statistics ---

    def queue_depth(self, host: str | None) -> list[QueueDepth]:
        q = schema.queue
        query = (
            sa.select(q.c.host, q.c.sub, q.c.state, sa.func.count())
            .group_by(q.c.host, q.c.sub, q.c.state)
            .order_by(q.c.host, q.c.sub, q.c.state)
        )
        if host is not None:
            query = query.where(q.c.host == host)
        with self._store.transaction() as conn:
            check_host(conn, host)
            return [QueueDepth(h, s, st, int(n)) for h, s, st, n in conn.execute(query)]

    def queue_stats(self, host: str | None) -> list[QueueStats]:
        with self._store.transaction() as conn:
            check_host(conn, host)
            return box_stats.queue_stats(conn, host)

    def host_stats(self) -> list[HostStats]:
        with self._store.transaction() as conn:
            return box_stats.host_stats(conn)

    def stats(self) -> Stats:
        with self._store.transaction() as conn:
            return box_stats.counts(conn)

    def snapshot(self) -> Snapshot:
        with self._store.transaction() as conn:
            return Snapshot(
                box_stats.queue_stats(conn),
                box_stats.host_stats(conn),
                box_stats.counts(conn),
                box_stats.heartbeat_ages(conn),
            )

    def instances(self, host: str | None) -> list[InstanceInfo]:
        with self._store.transaction() as conn:
            check_host(conn, host)
            return registry.instances(conn, host)

    def now(self) -> datetime:
        with self._store.transaction() as conn:
            return store_clock.now(conn)

    def heartbeat_ages(self) -> dict[str, float]:
        with self._store.transaction() as conn:
            return {inst: age for _host, inst, age in box_stats.heartbeat_ages(conn)}

    def throughput(self, windows: Sequence[float]) -> list[Throughput]:
        with self._store.transaction() as conn:
            return box_stats.throughput(conn, windows)

    def cleanup(
        self,
        batch: int,
        progress: Callable[[str], None] | None,
        stop: Callable[[], bool] | None = None,
    ) -> CleanupReport:
        from messagebox.delivery.cleanup import run

        return run(self._store, batch=batch, progress=progress, stop=stop)

    def check(self) -> list[Problem]:
        from messagebox.storage import consistency

        with self._store.transaction() as conn:
            return consistency.check(conn)

    # --- suspended entries ---

    def suspended(
        self, query: SuspendedQuery, limit: int, *, offset: int = 0, newest_first: bool = False
    ) -> list[SuspendedEntry]:
        s = schema.suspended
        order = (
            (s.c.suspended_at.desc(), s.c.id.desc()) if newest_first else (s.c.suspended_at, s.c.id)
        )
        query = self._resolved(query)
        with self._store.transaction() as conn:
            check_host(conn, query.host)
            select = (
                _with_spool(sa.select(s))
                .where(*query.where(conn))
                .order_by(*order)
                .limit(limit)
                .offset(offset)
            )
            return [_suspended_entry(r) for r in conn.execute(select)]

    def audit(self, action: str, **fields: Any) -> None:
        with self._store.transaction() as conn:
            audits.record(conn, action=action, **fields)

    def audit_log(self, limit: int) -> list[audits.AuditEntry]:
        with self._store.transaction() as conn:
            return audits.read(conn, limit)

    def sample_depth(self, host: str, source: str) -> int:
        with self._store.transaction() as conn:
            return rollup.sample_depth(conn, host, source)

    def rates(self, minutes: int) -> rollup.Rates:
        with self._store.transaction() as conn:
            return rollup.read(conn, minutes)

    def peek_queue(self, host: str, state: str | None, limit: int) -> list[browse.QueueEntry]:
        with self._store.transaction() as conn:
            check_host(conn, host)
            return browse.peek_queue(conn, host, state, limit)

    def held_keys(self, host: str | None, limit: int) -> list[browse.HeldKey]:
        with self._store.transaction() as conn:
            check_host(conn, host)
            return browse.held_keys(conn, host, limit)

    def find_messages(self, name: str, value: Any, limit: int) -> list[browse.FoundMessage]:
        with self._store.transaction() as conn:
            return browse.find_by_property(conn, name, value, limit)

    def search(self, query: SearchQuery) -> SearchResult:
        from messagebox.ops.search import search

        with self._store.transaction() as conn:
            return search(conn, query)

    def service_instances(
        self,
        service: str | None,
        state: str | None,
        limit: int,
        correlation: Mapping[str, Value] | None = None,
    ) -> list[orchestrations.ServiceInstanceView]:
        with self._store.transaction() as conn:
            return orchestrations.list_instances(
                conn, service=service, state=state, correlation=correlation, limit=limit
            )

    def service_instance(self, instance_id: str) -> InstanceDetail:
        from messagebox.ops.instance_history import detail

        with self._store.transaction() as conn:
            return detail(conn, instance_id)

    def terminate_instance(self, instance_id: str) -> orchestrations.Terminated:
        with self._store.transaction(serial=True) as conn:
            return orchestrations.terminate(conn, self._store.dialect, instance_id)

    def count_suspended(self, query: SuspendedQuery) -> int:
        s = schema.suspended
        query = self._resolved(query)
        with self._store.transaction() as conn:
            check_host(conn, query.host)
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(s).where(*query.where(conn))
                ).scalar_one()
            )

    def failure_rows(self, scan: int) -> list[FailureRow]:
        """The ``scan`` newest suspended entries, with what grouping them needs."""
        s, sub = schema.suspended, schema.subscription
        select = (
            sa.select(s.c.id, s.c.reason, sub.c.service, s.c.host, s.c.error, s.c.suspended_at)
            .select_from(s.outerjoin(sub, sub.c.id == s.c.sub))
            .order_by(s.c.suspended_at.desc(), s.c.id.desc())
            .limit(scan)
        )
        with self._store.transaction() as conn:
            rows = conn.execute(select).all()  # at once: 100,000 fetches of a row cost more
        return [FailureRow(*r) for r in rows]

    def failure_groups(self, scan: int) -> list[FailureGroup]:
        """The failure groups of the ``scan`` newest suspended entries."""
        return failures.groups(self.failure_rows(scan))

    def failure_group(self, group_id: str, scan: int) -> FailureGroup:
        """One failure group, by id, among the ``scan`` newest suspended entries."""
        for g in self.failure_groups(scan):
            if g.id == group_id:
                return g
        raise UnknownFailureGroup(
            f"no failure group {group_id} among the newest {scan:,} suspended entries "
            "(its entries may have been resumed or terminated)"
        )

    def _resolved(self, query: SuspendedQuery) -> SuspendedQuery:
        """``query`` with its failure group (if any) as the ids of its entries now."""
        if query.group is None:
            return query
        found = self.failure_group(query.group, failures.SCAN)
        return replace(query, group=None, among=tuple(found.entry_ids))

    def suspended_entry(self, entry_id: int) -> SuspendedEntry:
        s = schema.suspended
        with self._store.transaction() as conn:
            row = conn.execute(_with_spool(sa.select(s)).where(s.c.id == entry_id)).first()
        if row is None:
            raise UnknownSuspendedEntry(f"no suspended entry {entry_id}")
        return _suspended_entry(row)

    def resume(
        self,
        query: SuspendedQuery,
        batch: int | None,
        progress: Callable[[int, int], None] | None,
        expiry: suspension.NewExpiry = suspension.NO_EXPIRY,
    ) -> list[int]:
        def action(
            conn: sa.Connection, dialect: Any, q: SuspendedQuery, n: int | None
        ) -> list[int]:
            return suspension.resume(conn, dialect, q, n, expiry)

        return self._in_batches(query, action, batch, progress, resumable=True)

    def terminate(
        self, query: SuspendedQuery, batch: int | None, progress: Callable[[int, int], None] | None
    ) -> list[int]:
        return self._in_batches(query, suspension.terminate, batch, progress, resumable=False)

    def _matching(self, query: SuspendedQuery, resumable: bool) -> tuple[int, int, int]:
        """How many entries match, and their lowest and highest ids."""
        s = schema.suspended
        with self._store.transaction() as conn:
            count = sa.select(sa.func.count(), sa.func.min(s.c.id), sa.func.max(s.c.id))
            count = count.where(*query.where(conn))
            if resumable:  # what suspension.resume takes in bulk
                count = count.where(
                    s.c.resumable == sa.true(),
                    s.c.sub.in_(sa.select(schema.subscription.c.id)),
                )
            counted, low, high = conn.execute(count).one()
        return (int(counted), int(low), int(high)) if counted else (0, 0, 0)

    def _in_batches(
        self,
        query: SuspendedQuery,
        action: Action,
        batch: int | None,
        progress: Callable[[int, int], None] | None,
        *,
        resumable: bool,
    ) -> list[int]:
        """Run a suspended-queue action (resume, terminate) once, or in batches.

        Batches walk the ids that matched at the start, lowest first, so an entry
        suspended again meanwhile (a resumed entry failing again) is not taken twice."""
        if batch is not None and (type(batch) is not int or batch < 1):
            raise ValidationError(f"batch must be a positive int, not {batch!r}")
        query = self._resolved(query)
        chunked = batch is not None and query.ids is None
        total = last = highest = 0
        if chunked:
            total, low, highest = self._matching(query, resumable)
            if not total:
                return []
            last = low - 1
        done: list[int] = []
        while True:
            if chunked:
                query = replace(query, id_range=(last, highest))
            with self._store.transaction(serial=True) as conn:
                ids = action(conn, self._store.dialect, query, batch if chunked else None)
                if ids:
                    last = max(ids)
            done.extend(ids)
            if progress is not None and (ids or not chunked):
                progress(len(done), max(total, len(done)))
            if not chunked or len(ids) < (batch or 0) or not ids:
                return done

    def reroute(self, entry_ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
        s = schema.suspended
        reroutable = s.c.reason.in_(REROUTABLE)
        with self._store.transaction(serial=True, fence=Fence.ROUTES) as conn:
            router.prelude(conn, self._store.dialect)  # the routing fence first (fence.py)
            if entry_ids:
                known = set(
                    conn.execute(
                        sa.select(s.c.id).where(s.c.id.in_(list(entry_ids)), reroutable)
                    ).scalars()
                )
                missing = [e for e in entry_ids if e not in known]
                if missing:
                    raise UnknownSuspendedEntry(
                        f"no suspended routing failure or removed-subscription entry {missing[0]}"
                    )
                ids = list(entry_ids)
            else:
                ids = list(conn.execute(sa.select(s.c.id).where(reroutable)).scalars())
            return (
                router.reroute(conn, self._store.dialect, ids, store_clock.now(conn)) if ids else {}
            )

    # --- scheduled entries ---

    def scheduled(self, query: ScheduledQuery, limit: int) -> list[ScheduledEntry]:
        with self._store.transaction() as conn:
            check_host(conn, query.host)
            return scheduled.listing(conn, query, limit)

    def deliver_now(self, query: ScheduledQuery) -> list[int]:
        with self._store.transaction(serial=True) as conn:
            check_host(conn, query.host)
            return scheduled.deliver_now(conn, self._store.dialect, query)

    def cancel_scheduled(self, query: ScheduledQuery) -> list[int]:
        with self._store.transaction(serial=True) as conn:
            check_host(conn, query.host)
            return scheduled.cancel(conn, self._store.dialect, query)

    # --- tracking ---

    def tracking(self) -> TrackingSettings:
        with self._store.transaction() as conn:
            return tracking.read_settings(conn)

    def configure_tracking(
        self, enabled: bool, retention: timedelta | float | None
    ) -> TrackingSettings:
        if isinstance(retention, bool) or not isinstance(retention, timedelta | int | float | None):
            raise ValidationError(
                f"tracking retention must be a timedelta or seconds, not {retention!r}"
            )
        keep = timedelta(seconds=retention) if isinstance(retention, int | float) else retention
        with self._store.transaction(serial=True) as conn:
            current = tracking.read_settings(conn)
            settings = TrackingSettings(
                enabled=enabled, retention=current.retention if keep is None else keep
            )
            tracking.write_settings(conn, settings)
        self._store.tracking.invalidate()
        return settings

    def tracked(
        self, message_id: uuid.UUID | str | None, query: dict[str, Any]
    ) -> list[TrackedEvent]:
        try:
            msg = None if message_id is None else uuid.UUID(str(message_id))
        except ValueError as exc:
            raise ValidationError(f"not a message id: {message_id!r}") from exc
        with self._store.transaction() as conn:
            return tracking.query(conn, EventQuery(message_id=msg, **query))
