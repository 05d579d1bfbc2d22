"""The MessageBox: hosts, subscriptions, publishing and the stored messages.

box = MessageBox("duckdb:///orders.duckdb")   # or postgresql+psycopg://…
box.create_host("shipping")
box.subscribe("ship-eu", host="shipping", filter=P("orders.Region") == "EU")
[routed] = box.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from messagebox import clock, delivery, notify, router, schema, spool, subscriptions, tracking
from messagebox import stats as box_stats
from messagebox.delivery import SuspendedQuery
from messagebox.errors import (
    AlreadyExists,
    AlreadyReceived,
    Conflict,
    MessageValidationError,
    Throttled,
    UnknownHost,
    UnknownMessage,
    UnknownSubscription,
    UnknownSuspendedEntry,
    ValidationError,
)
from messagebox.ids import uuid7
from messagebox.message import Message, MessageSummary, StoredMessage
from messagebox.models import (
    SERVICE_UNENLISTED,
    SUBSCRIPTION_REMOVED,
    Host,
    HostSettings,
    HostStats,
    InstanceInfo,
    Kind,
    OnFailure,
    QueueDepth,
    QueueStats,
    Routed,
    RouteExplanation,
    RoutingPolicy,
    State,
    Stats,
    Subscription,
    SubscriptionExplanation,
    SuspendedEntry,
    Throughput,
)
from messagebox.properties import canonical_name, check_text, decode_context
from messagebox.store import Store
from messagebox.throttle import Throttle as _Throttle
from messagebox.tracking import EventQuery, TrackedEvent, TrackingSettings
from predicates import normalize_properties, to_filter
from predicates.explain import explain as explain_filter

if TYPE_CHECKING:
    from messagebox.cleanup import CleanupReport


PUBLISH_CONFLICT_RETRIES = 20


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise ValidationError(
            f"{what} name {name!r} must be a non-empty str of at most 256 characters"
        )
    try:
        check_text(name)  # PostgreSQL refuses NUL, every driver a lone surrogate
    except ValueError as exc:
        raise ValidationError(f"{what} name {name!r}: {exc}") from exc
    return name


def _check_host(conn: sa.Connection, host: str | None) -> None:
    """Raise :class:`UnknownHost` for a host filter that names no host (a typo would
    otherwise match nothing, silently)."""
    if host is None:
        return
    try:
        check_text(host)
    except ValueError:  # no host can have this name (and PostgreSQL refuses to look it up)
        raise UnknownHost(f"no host named {host!r}") from None
    h = schema.host
    if conn.execute(sa.select(h.c.name).where(h.c.name == host)).first() is None:
        raise UnknownHost(f"no host named {host!r}")


def _correlation(
    index: int, service: str, kind: Kind, instance_id: object, names: object
) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValidationError(
            f"subscription {index} of {service!r}: correlation must be a list of property names"
        )
    checked = []
    for name in names:
        try:
            checked.append(canonical_name(name))
        except (ValueError, TypeError) as exc:
            raise ValidationError(
                f"subscription {index} of {service!r}: correlation property {name!r}: {exc}"
            ) from exc
    if len(set(checked)) != len(checked):
        raise ValidationError(
            f"subscription {index} of {service!r}: a correlation property is given twice"
        )
    return tuple(checked)


class MessageBox:
    """A content-based publish/subscribe router over one database.

    ``url`` picks the backend: ``duckdb:///path`` (the default, ``./messagebox.duckdb``)
    or ``postgresql+psycopg://user@host/db``. The schema is created on first open
    (``create=False`` refuses a database without it instead). ``publisher`` names this
    process in routing-failure reports.
    """

    def __init__(
        self,
        url: str | sa.URL | None = None,
        *,
        publisher: str | None = None,
        create: bool = True,
    ) -> None:
        self.store = Store(url, create=create)
        self.publisher = publisher or f"{socket.gethostname()}:{os.getpid()}"
        self._throttle = _Throttle()

    @property
    def url(self) -> sa.URL:
        return self.store.url

    def close(self) -> None:
        """Release the database connections."""
        self.store.close()

    def __enter__(self) -> MessageBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- hosts ---

    def create_host(self, name: str, settings: HostSettings | None = None, **options: Any) -> Host:
        """Create a host (a logical subscriber whose instances share one queue)."""
        _check_name("host", name)
        config = settings or HostSettings.checked(f"host {name!r}", options)
        with self.store.transaction(serial=True) as conn:
            return subscriptions.create_host(conn, name, config, clock.now(conn))

    def hosts(self) -> list[Host]:
        """Every host, by name."""
        with self.store.transaction() as conn:
            return subscriptions.list_hosts(conn)

    # --- subscriptions ---

    def subscribe(
        self,
        service: str,
        *,
        host: str,
        filter: object,
        name: str | None = None,
        kind: Kind | str = Kind.ACTIVATION,
        instance_id: str | None = None,
        priority: int = 0,
        state: State | str = State.STARTED,
        ordered: bool = False,
        on_failure: OnFailure | str = OnFailure.SUSPEND,
        correlation: Sequence[str] = (),
    ) -> Subscription:
        """Subscribe ``service`` (running in ``host``) to messages matching ``filter``.

        ``filter`` is a DSL expression such as ``(P("a.B") == 1) | P("a.C").exists()``
        or a :class:`~predicates.Filter`. Instance subscriptions need ``instance_id``.
        ``ordered`` delivers strictly in publish order, one at a time; ``on_failure``
        says what an ordered subscription does with a message that exhausts its retries.
        ``correlation`` (long-running services) routes every message with the same
        values of these properties to one running instance of the service. On an
        activation subscription the first such message creates the instance and the
        rest follow in order (a convoy); on an instance subscription (no
        ``instance_id``) a message follows the running instance for its values, and
        does not route there when none runs.
        """
        [made] = self.subscribe_many(
            [
                {
                    "service": service,
                    "host": host,
                    "filter": filter,
                    "name": name,
                    "kind": kind,
                    "instance_id": instance_id,
                    "priority": priority,
                    "state": state,
                    "ordered": ordered,
                    "on_failure": on_failure,
                    "correlation": correlation,
                }
            ]
        )
        return made

    def subscribe_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Subscription]:
        """Create many subscriptions in one transaction (each a dict of
        :meth:`subscribe`'s arguments); all are created or none."""
        checked = [self._spec(i, spec) for i, spec in enumerate(specs)]
        if not checked:
            return []
        with self.store.transaction(serial=True) as conn:
            return subscriptions.subscribe(conn, self.store.dialect, checked, clock.now(conn))

    @staticmethod
    def _spec(index: int, spec: Mapping[str, Any]) -> subscriptions.SubscriptionSpec:
        args = dict(spec)
        unknown = set(args) - {
            "service",
            "host",
            "filter",
            "name",
            "kind",
            "instance_id",
            "priority",
            "state",
            "ordered",
            "on_failure",
            "correlation",
        }
        if unknown:
            raise ValidationError(f"subscription {index}: unknown field {sorted(unknown)[0]!r}")
        try:
            service = _check_name("service", args.get("service"))
            host = _check_name("host", args.get("host"))
            name = args.get("name")
            if name is not None:
                _check_name("subscription", name)
            kind = Kind(args.get("kind", Kind.ACTIVATION))
            state = State(args.get("state", State.STARTED))
            instance_id = args.get("instance_id")
            priority = args.get("priority", 0)
            on_failure = OnFailure(args.get("on_failure", OnFailure.SUSPEND))
        except ValueError as exc:
            raise ValidationError(f"subscription {index}: {exc}") from exc
        if instance_id is not None:
            try:
                check_text(str(instance_id))
            except ValueError as exc:
                raise ValidationError(
                    f"subscription {index} of {service!r}: instance_id {instance_id!r}: {exc}"
                ) from exc
        correlation = _correlation(index, service, kind, instance_id, args.get("correlation") or ())
        if kind is Kind.ACTIVATION and instance_id is not None:
            raise ValidationError(
                f"subscription {index} of {service!r}: only instance subscriptions take an "
                "instance_id"
            )
        if kind is Kind.INSTANCE and (instance_id is None) == (not correlation):
            raise ValidationError(
                f"subscription {index} of {service!r}: an instance subscription needs "
                "either an instance_id or a correlation (not both)"
            )
        if type(priority) is not int or not -1000 <= priority <= 1000:
            raise ValidationError(f"subscription {index}: priority must be an int in -1000..1000")
        filt = to_filter(args.get("filter"))
        return subscriptions.SubscriptionSpec(
            service=service,
            host=host,
            filter=filt,
            name=name,
            kind=kind,
            instance_id=None if instance_id is None else str(instance_id),
            priority=priority,
            state=state,
            ordered=bool(args.get("ordered", False)),
            on_failure=on_failure,
            correlation=correlation,
        )

    def subscriptions(
        self,
        *,
        service: str | None = None,
        host: str | None = None,
        instance_id: str | None = None,
    ) -> list[Subscription]:
        """Subscriptions, by id, optionally only those of a service, host or instance."""
        with self.store.transaction() as conn:
            return subscriptions.list_subscriptions(
                conn, service=service, host=host, instance_id=instance_id
            )

    def subscription(self, ref: int | str) -> Subscription:
        """One subscription, by id or name."""
        with self.store.transaction() as conn:
            return self._resolve(conn, [ref])[0]

    @staticmethod
    def _resolve(conn: sa.Connection, refs: Sequence[int | str]) -> list[Subscription]:
        s = schema.subscription
        ids = [r for r in refs if isinstance(r, int)]
        names = [r for r in refs if isinstance(r, str)]
        rows = (
            conn.execute(sa.select(s.c.id).where(sa.or_(s.c.id.in_(ids), s.c.name.in_(names))))
            .scalars()
            .all()
        )
        found = subscriptions.list_subscriptions(conn, ids=list(rows))
        known = {x.id for x in found} | {x.name for x in found}
        for ref in refs:
            if ref not in known:
                raise UnknownSubscription(f"no subscription {ref!r}")
        return found

    def unsubscribe(self, *refs: int | str) -> int:
        """Remove subscriptions (by id or name).

        Their entries still waiting on a queue are suspended (not resumable, reason
        ``subscription-removed``); :meth:`reroute` routes them again, :meth:`terminate`
        drops them. Their resumable suspended entries become the same. An entry being
        delivered at that moment finishes its delivery (if it fails past its retries, it
        is suspended as ``subscription-removed`` too).
        """
        with self.store.transaction(serial=True) as conn:
            found = self._resolve(conn, refs)
            ids = [s.id for s in found]
            delivery.suspend_waiting(conn, self.store.dialect, ids, SUBSCRIPTION_REMOVED)
            removed = subscriptions.unsubscribe(conn, self.store.dialect, ids)
            delivery.orphan_suspended(conn, ids)  # after: sees a suspension that raced it
            return removed

    def set_service_state(self, service: str, state: State | str) -> int:
        """Start, stop or unenlist every subscription of a service (DESIGN.md §4).

        Stopping holds its waiting messages (and routes new ones held); starting releases
        them. Unenlisting stops routing to it and suspends its waiting messages
        (resumable, reason ``service-unenlisted``). Returns the subscriptions changed.
        """
        new = State(state)
        with self.store.transaction(serial=True) as conn:
            subs = subscriptions.list_subscriptions(conn, service=service)
            if not subs:
                raise UnknownSubscription(f"service {service!r} has no subscription")
            ids = [s.id for s in subs]
            delivery.hold(conn, ids, new)
            if new is State.UNENLISTED:
                delivery.suspend_waiting(conn, self.store.dialect, ids, SERVICE_UNENLISTED)
            elif new is State.STARTED:
                self.store.dialect.notify(conn, sorted({s.host for s in subs}))
        if new is State.STARTED:
            notify.signal(self.store.key, {s.host for s in subs})
        return len(subs)

    # --- publishing ---

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
        trusted: bool = False,
        block: bool = True,
        timeout: float = 60.0,
        suspend: Mapping[int, router.Suspension] | None = None,
        receipts: Sequence[tuple[str, str, Sequence[int]]] = (),
    ) -> list[Routed]:
        """Publish a batch in one transaction: all of it is stored, or none.

        Every message is validated first; each is routed to every matching subscription
        and stored once. A message that matches nothing is handled by ``policy``.
        ``trusted`` lets a receive location set ``messagebox.``/``BTS.`` properties.

        For receive locations: ``suspend`` stores the messages it names (by index)
        suspended with a reason instead (see :class:`~messagebox.router.Suspension`);
        ``receipts`` records ``(location, key, message indexes)`` in the same
        transaction, and raises :class:`~messagebox.errors.AlreadyReceived` (storing
        nothing) if a key is recorded already, so an input is never published twice.

        Throttling: while a host the batch routes to has more entries waiting than its
        ``throttle_queue_depth``, publishing waits for it to drain (at most ``timeout``
        seconds), or with ``block=False`` raises :class:`~messagebox.errors.Throttled`
        at once. Nothing is stored by a throttled attempt.
        """
        batch = list(messages)
        try:
            routing = RoutingPolicy(policy)
        except ValueError:
            raise ValidationError(
                f"routing policy {policy!r} is not one of "
                + ", ".join(p.value for p in RoutingPolicy)
            ) from None
        ids: list[uuid.UUID] = []
        for i, message in enumerate(batch):
            if not isinstance(message, Message):
                raise MessageValidationError(
                    f"message {i}: expected a Message, got {type(message).__name__}"
                )
            if not trusted:
                reserved = message.reserved()
                if reserved:
                    raise MessageValidationError(
                        f"message {i}: property {reserved[0]!r} is in the reserved "
                        "namespace messagebox. (alias BTS.); only a trusted receive "
                        "location may set it"
                    )
            ids.append(message.id or uuid7())
        if len(set(ids)) != len(ids):
            raise MessageValidationError("the batch gives one message id twice")
        for i in suspend or {}:
            if not 0 <= i < len(batch):
                raise ValidationError(f"suspend names message {i}; the batch has {len(batch)}")
        if not batch and not receipts:
            return []
        deadline = time.monotonic() + timeout
        conflicts = 0
        while True:
            try:
                with self.store.transaction() as conn:
                    if receipts:
                        self._record_receipts(conn, receipts, ids)
                    results, hosts = router.publish(
                        conn,
                        self.store.dialect,
                        batch,
                        ids,
                        policy=routing,
                        publisher=self.publisher,
                        now=clock.now(conn),
                        before_write=self._throttle.check,
                        suspensions=suspend,
                    )
            except Throttled as exc:
                if not block or time.monotonic() >= deadline:
                    raise
                self._throttle.wait(self.store, exc.hosts, deadline)
                continue
            except AlreadyExists as exc:
                if not receipts:
                    raise
                # a concurrent publish recorded one of the receipts after our check (its
                # insert won the unique key): say so as the check would have
                with self.store.transaction() as conn:
                    self._refuse_received(conn, [(loc, key) for loc, key, _ in receipts], exc)
                raise
            except Conflict:
                # a concurrent publish created the same convoy instance first (DuckDB
                # refuses the later commit); nothing was stored, so route again
                conflicts += 1
                if conflicts > PUBLISH_CONFLICT_RETRIES:
                    raise
                time.sleep(random.uniform(0, 0.002 * 2 ** min(conflicts, 8)))
                continue
            self._throttle.added(hosts)
            notify.signal(self.store.key, hosts)
            return results

    @staticmethod
    def _record_receipts(
        conn: sa.Connection,
        receipts: Sequence[tuple[str, str, Sequence[int]]],
        ids: Sequence[uuid.UUID],
    ) -> None:
        r = schema.receipt
        keys = [(loc, key) for loc, key, _ in receipts]
        if len(set(keys)) != len(keys):
            raise ValidationError("the batch records one receipt twice")
        MessageBox._refuse_received(conn, keys)
        now = clock.now(conn)
        conn.execute(
            r.insert(),
            [
                {
                    "location": loc,
                    "key": key,
                    "messages": json.dumps([str(ids[i]) for i in indexes]),
                    "received_at": now,
                }
                for loc, key, indexes in receipts
            ],
        )

    @staticmethod
    def _refuse_received(
        conn: sa.Connection, keys: Sequence[tuple[str, str]], cause: Exception | None = None
    ) -> None:
        """Raise :class:`AlreadyReceived` if a (location, key) has a receipt already."""
        r = schema.receipt
        found = conn.execute(
            sa.select(r.c.location, r.c.key, r.c.messages).where(
                r.c.location.in_(sorted({loc for loc, _ in keys})),
                r.c.key.in_([k for _, k in keys]),
            )
        ).all()
        dupes = [row for row in found if (row.location, row.key) in set(keys)]
        if dupes:
            raise AlreadyReceived(
                f"{dupes[0].location}: input {dupes[0].key!r} was published already"
                + (f" (and {len(dupes) - 1} more)" if len(dupes) > 1 else "")
                + "; nothing was stored",
                message_ids=json.loads(dupes[0].messages),
            ) from cause

    def receipts(self, location: str, keys: Sequence[str]) -> dict[str, list[uuid.UUID]]:
        """Of ``keys``, those a receive location has recorded, with the message ids
        published for each."""
        r = schema.receipt
        if not keys:
            return {}
        with self.store.transaction() as conn:
            rows = conn.execute(
                sa.select(r.c.key, r.c.messages).where(
                    r.c.location == location, r.c.key.in_(list(keys))
                )
            ).all()
        return {row.key: [uuid.UUID(m) for m in json.loads(row.messages)] for row in rows}

    def would_route(self, properties: Mapping[str, object]) -> list[Subscription]:
        """The subscriptions a message with these promoted properties would reach.
        Nothing is stored."""
        try:
            promoted = normalize_properties(properties)
        except ValueError as exc:
            raise MessageValidationError(f"properties: {exc}") from exc
        with self.store.transaction() as conn:
            [rows] = router.route(conn, self.store.dialect, [promoted])
            return subscriptions.list_subscriptions(conn, ids=[r[1] for r in rows])

    def explain(self, target: uuid.UUID | str | Mapping[str, object]) -> RouteExplanation:
        """Why a message would or would not reach each subscription.

        ``target`` is a stored message's id (its promoted properties are read from the
        spool) or a mapping of promoted properties. For every subscription, in id order:
        whether the message routes to it (exactly what :meth:`would_route` answers) and,
        per filter group, the first predicate that fails with the property's actual
        value, by the reference semantics. Nothing is stored.
        """
        message_id: uuid.UUID | None = None
        with self.store.transaction() as conn:
            if isinstance(target, Mapping):
                try:
                    promoted = normalize_properties(target)
                except ValueError as exc:
                    raise MessageValidationError(f"properties: {exc}") from exc
            else:
                try:
                    message_id = uuid.UUID(str(target))
                except ValueError as exc:
                    raise ValidationError(f"{target!r} is not a message id (a UUID)") from exc
                row = spool.read_context(conn, [message_id]).get(message_id)
                if row is None:
                    raise UnknownMessage(f"no message {message_id} in the spool")
                promoted, _written = decode_context(row.context)
            subs = subscriptions.list_subscriptions(conn)
        found = []
        for sub in subs:
            why = explain_filter(sub.filter, promoted)
            routes = why.matched and sub.state is not State.UNENLISTED
            found.append(SubscriptionExplanation(subscription=sub, routes=routes, filter=why))
        return RouteExplanation(
            message_id=message_id, properties=promoted, subscriptions=tuple(found)
        )

    # --- stored messages and queues ---

    def read_message(self, message_id: uuid.UUID | str) -> StoredMessage:
        """A stored message: its context and parts."""
        with self.store.transaction() as conn:
            return spool.read_message(conn, uuid.UUID(str(message_id)))

    def message_summary(self, message_id: uuid.UUID | str) -> MessageSummary:
        """A stored message's context and part sizes, without reading its parts."""
        with self.store.transaction() as conn:
            return spool.describe(conn, uuid.UUID(str(message_id)))

    def read_messages(
        self, message_ids: Iterable[uuid.UUID | str], *, max_bytes: int | None = None
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """Several stored messages at once, by id; ids not in the spool are left out.
        A message with more than ``max_bytes`` in its parts comes as a
        :class:`MessageSummary` (its context and part sizes, no bytes)."""
        ids = [uuid.UUID(str(m)) for m in message_ids]
        with self.store.transaction() as conn:
            return spool.read_messages(conn, ids, max_bytes=max_bytes)

    def iter_part(self, message_id: uuid.UUID | str, part: str) -> Iterator[bytes]:
        """A part's bytes, a fragment at a time (for parts too large to hold whole)."""
        msg_id = uuid.UUID(str(message_id))
        with self.store.transaction() as conn:
            part_id, n = spool.part_fragments(conn, msg_id, part)
        for seq in range(n):
            with self.store.transaction() as conn:
                chunk = spool.fragment(conn, part_id, seq)
            yield chunk

    def queue_depth(self, host: str | None = None) -> list[QueueDepth]:
        """Queue entries per host, subscription and state (of one host, if given: an
        unknown host raises :class:`~messagebox.errors.UnknownHost`)."""
        q = schema.queue
        query = (
            sa.select(q.c.host, q.c.sub, q.c.state, sa.func.count())
            .group_by(q.c.host, q.c.sub, q.c.state)
            .order_by(q.c.host, q.c.sub, q.c.state)
        )
        if host is not None:
            query = query.where(q.c.host == host)
        with self.store.transaction() as conn:
            _check_host(conn, host)
            return [QueueDepth(h, s, st, int(n)) for h, s, st, n in conn.execute(query)]

    def queue_stats(self, host: str | None = None) -> list[QueueStats]:
        """Per host and subscription: entries ready, held and leased, and the age of the
        oldest (by the database clock). An unknown host raises
        :class:`~messagebox.errors.UnknownHost`."""
        with self.store.transaction() as conn:
            _check_host(conn, host)
            return box_stats.queue_stats(conn, host)

    def host_stats(self) -> list[HostStats]:
        """Every host, by name, with its registered instances, queued entries and
        suspended entries."""
        with self.store.transaction() as conn:
            return box_stats.host_stats(conn)

    def stats(self) -> Stats:
        """Counts over the whole box: messages, queue entries by state, suspended entries
        by reason, subscriptions by state, hosts, host and service instances."""
        with self.store.transaction() as conn:
            return box_stats.counts(conn)

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
    ) -> list[SuspendedEntry]:
        """Suspended entries, oldest first (by suspension time, then id), optionally
        filtered (``before``: suspended before that time; an unknown ``host`` raises
        :class:`~messagebox.errors.UnknownHost`)."""
        s = schema.suspended
        query = SuspendedQuery(
            reason=reason,
            host=host,
            service=service,
            subscription=subscription,
            message_id=None if message_id is None else uuid.UUID(str(message_id)),
            before=before,
        )
        select = sa.select(s).where(*query.where()).order_by(s.c.suspended_at, s.c.id).limit(limit)
        with self.store.transaction() as conn:
            _check_host(conn, host)
            return [_suspended_entry(r) for r in conn.execute(select)]

    def suspended_entry(self, entry_id: int) -> SuspendedEntry:
        """One suspended entry, by id."""
        s = schema.suspended
        with self.store.transaction() as conn:
            row = conn.execute(sa.select(s).where(s.c.id == entry_id)).first()
        if row is None:
            raise UnknownSuspendedEntry(f"no suspended entry {entry_id}")
        return _suspended_entry(row)

    def resume(
        self,
        *entry_ids: int,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        subscription: int | None = None,
        before: datetime | None = None,
        batch: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        """Put suspended entries back on their queues: the given ids (each must exist
        and be resumable), or every resumable entry matching the filters. They keep
        their place in publish order and start again from attempt 1. Returns the ids.

        Ids are resumed in one transaction, all or none. Filters too, unless ``batch``
        is given: then ``batch`` entries per transaction, lowest ids first, calling
        ``progress(done, total)`` after each (``total`` is counted at the start).
        """
        query = self._suspended_query(entry_ids, reason, host, service, subscription, before)
        return self._in_batches(query, delivery.resume, batch, progress, resumable=True)

    def _in_batches(
        self,
        query: SuspendedQuery,
        action: Callable[[sa.Connection, Any, SuspendedQuery, int | None], list[int]],
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
        chunked = batch is not None and query.ids is None
        total = last = highest = 0
        if chunked:
            s = schema.suspended
            count = sa.select(sa.func.count(), sa.func.min(s.c.id), sa.func.max(s.c.id))
            count = count.where(*query.where())
            if resumable:  # what delivery.resume takes in bulk
                count = count.where(
                    s.c.resumable == sa.true(),
                    s.c.sub.in_(sa.select(schema.subscription.c.id)),
                )
            with self.store.transaction() as conn:
                counted, low, high = conn.execute(count).one()
            if not counted:
                return []
            total, last, highest = int(counted), int(low) - 1, int(high)
        done: list[int] = []
        while True:
            if chunked:
                query = replace(query, id_range=(last, highest))
            with self.store.transaction(serial=True) as conn:
                ids = action(conn, self.store.dialect, query, batch if chunked else None)
                if ids:
                    last = max(ids)
                hosts = set(
                    conn.execute(
                        sa.select(schema.queue.c.host).where(schema.queue.c.id.in_(ids)).distinct()
                    ).scalars()
                )
            notify.signal(self.store.key, hosts)
            done.extend(ids)
            if progress is not None and (ids or not chunked):
                progress(len(done), max(total, len(done)))
            if not chunked or len(ids) < (batch or 0) or not ids:
                return done

    def terminate(
        self,
        *entry_ids: int,
        reason: str | None = None,
        host: str | None = None,
        service: str | None = None,
        subscription: int | None = None,
        before: datetime | None = None,
        batch: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        """Delete suspended entries (the given ids, or every one matching the filters)
        and release their references; cleanup then removes unreferenced messages.
        ``batch`` and ``progress`` work as for :meth:`resume`."""
        query = self._suspended_query(entry_ids, reason, host, service, subscription, before)
        return self._in_batches(query, delivery.terminate, batch, progress, resumable=False)

    @staticmethod
    def _suspended_query(
        entry_ids: Sequence[int],
        reason: str | None,
        host: str | None,
        service: str | None,
        subscription: int | None,
        before: datetime | None,
    ) -> SuspendedQuery:
        filters = (reason, host, service, subscription, before)
        if not entry_ids and all(f is None for f in filters):
            raise ValidationError(
                "name the suspended entries: give ids, or at least one filter "
                "(reason, host, service, subscription, before)"
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
        )

    def reroute(self, *entry_ids: int) -> dict[int, tuple[int, ...]]:
        """Route suspended routing failures, and entries whose subscription was removed,
        again (all of them when no id is given).

        Those that now match a subscription move to their hosts' queues; the rest stay
        suspended. Returns the subscriptions each moved entry went to.
        """
        s = schema.suspended
        reroutable = s.c.reason.in_(router.REROUTABLE)
        with self.store.transaction(serial=True) as conn:
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
            done = router.reroute(conn, self.store.dialect, ids, clock.now(conn)) if ids else {}
            hosts = set(
                conn.execute(
                    sa.select(schema.subscription.c.host).where(
                        schema.subscription.c.id.in_({x for v in done.values() for x in v})
                    )
                ).scalars()
            )
        notify.signal(self.store.key, hosts)
        return done

    # --- tracking ---

    def tracking(self) -> TrackingSettings:
        """Whether message tracking is enabled, and its retention."""
        with self.store.transaction() as conn:
            return tracking.read_settings(conn)

    def configure_tracking(
        self, enabled: bool, *, retention: timedelta | float | None = None
    ) -> TrackingSettings:
        """Enable or disable message tracking for every process using this store;
        ``retention`` (a timedelta, or seconds) is how long events are kept (default:
        unchanged, else 7 days). Other processes see the change within a few seconds."""
        if isinstance(retention, bool) or not isinstance(retention, timedelta | int | float | None):
            raise ValidationError(
                f"tracking retention must be a timedelta or seconds, not {retention!r}"
            )
        keep = timedelta(seconds=retention) if isinstance(retention, int | float) else retention
        with self.store.transaction(serial=True) as conn:
            current = tracking.read_settings(conn)
            settings = TrackingSettings(
                enabled=enabled, retention=current.retention if keep is None else keep
            )
            tracking.write_settings(conn, settings)
        self.store.tracking.invalidate()
        return settings

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
        try:
            msg = None if message_id is None else uuid.UUID(str(message_id))
        except ValueError as exc:
            raise ValidationError(f"not a message id: {message_id!r}") from exc
        q = EventQuery(
            message_id=msg,
            event=event,
            host=host,
            subscription=subscription,
            since=since,
            until=until,
            limit=limit,
        )
        with self.store.transaction() as conn:
            return tracking.query(conn, q)

    # --- delivery and operations ---

    def instances(self, host: str | None = None) -> list[InstanceInfo]:
        """Registered host instances, with their last heartbeat (of one host, if given: an
        unknown host raises :class:`~messagebox.errors.UnknownHost`)."""
        with self.store.transaction() as conn:
            _check_host(conn, host)
            return delivery.instances(conn, host)

    def now(self) -> datetime:
        """The database's time: every time the store writes or compares is read from it,
        whatever the clocks of the machines that publish and deliver."""
        with self.store.transaction() as conn:
            return clock.now(conn)

    def heartbeat_ages(self) -> dict[str, float]:
        """Seconds since each registered host instance's last heartbeat, by instance id
        (by the database clock)."""
        with self.store.transaction() as conn:
            return {inst: age for _host, inst, age in box_stats.heartbeat_ages(conn)}

    def throughput(self, windows: Sequence[float] = (60.0, 3600.0)) -> list[Throughput]:
        """Tracked events (published, delivered, suspended…) per kind over each recent
        window of seconds, by the database clock. Counted from message tracking: zero
        while it is disabled, and only since it was enabled."""
        with self.store.transaction() as conn:
            return box_stats.throughput(conn, windows)

    def host(self, name: str) -> Host:
        """One host, by name."""
        for h in self.hosts():
            if h.name == name:
                return h
        raise UnknownHost(f"no host named {name!r}")

    def cleanup(
        self, *, batch: int = 10_000, progress: Callable[[str], None] | None = None
    ) -> CleanupReport:
        """Run the cleanup job once (DESIGN.md §10); safe while others publish and deliver."""
        from messagebox.cleanup import run

        return run(self.store, batch=batch, progress=progress)

    def references(self, message_id: uuid.UUID | str) -> int:
        """The references a message holds now (added minus released)."""
        msg = uuid.UUID(str(message_id))
        total = 0
        with self.store.transaction() as conn:
            for table, sign in ((schema.ref_add, 1), (schema.ref_release, -1)):
                n = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(table.c.n), 0)).where(table.c.msg == msg)
                ).scalar_one()
                total += sign * int(n)
        return total

    def __repr__(self) -> str:
        return f"MessageBox({self.url.render_as_string(hide_password=True)!r})"


def _suspended_entry(r: Any) -> SuspendedEntry:
    return SuspendedEntry(
        id=r.id,
        message_id=r.msg,
        subscription=r.sub,
        host=r.host,
        resumable=bool(r.resumable),
        reason=r.reason,
        error=r.error,
        report=json.loads(r.report) if r.report else None,
        attempts=r.attempts,
        suspended_at=r.suspended_at,
    )
