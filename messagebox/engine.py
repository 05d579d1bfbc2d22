"""The MessageBox: one front over hosts, subscriptions, publishing, stored messages and
operations. It validates nothing and stores nothing itself: each method hands over to
one of its parts (:mod:`~messagebox.config.catalog`, :mod:`~messagebox.routing.publishing`,
:mod:`~messagebox.ops.operations`), which run the storage layer's transactions.

box = MessageBox("duckdb:///orders.duckdb")   # or postgresql://…
box.create_host("shipping")
box.subscribe("ship-eu", host="shipping", filter=P("orders.Region") == "EU")
[routed] = box.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from messagebox.config.as_code import RoutingAsCode
from messagebox.config.catalog import Catalog
from messagebox.config.configs import Configs
from messagebox.delivery.consumer import Consumer
from messagebox.errors import ValidationError
from messagebox.message import Message, MessageSummary, StoredMessage
from messagebox.models import (
    Host,
    HostSettings,
    HostStats,
    InstanceInfo,
    Kind,
    OnExpiry,
    OnFailure,
    QueueDepth,
    QueueStats,
    Routed,
    RouteExplanation,
    RoutingPolicy,
    State,
    Stats,
    Subscription,
    Suspension,
)
from messagebox.ops import resubmission
from messagebox.ops.accounts import Accounts
from messagebox.ops.operations import Operations
from messagebox.ops.resubmission import Resubmits
from messagebox.ops.scheduling import Scheduling
from messagebox.ops.suspended_entries import SuspendedEntries
from messagebox.ops.users import UserStore
from messagebox.ops.watching import Watching
from messagebox.properties import Value
from messagebox.routing.publishing import Messages
from messagebox.storage.store import URL, Store
from messagebox.storage.store import StoreURL as StoreURL  # hosts name it

if TYPE_CHECKING:
    from messagebox.delivery.cleanup import CleanupReport
    from messagebox.ops.browse import FoundMessage, HeldKey, QueueEntry
    from messagebox.ops.instance_history import InstanceDetail
    from messagebox.ops.orchestrations import ServiceInstanceView, Terminated
    from messagebox.ops.search import SearchResult
    from messagebox.storage.consistency import Problem


class MessageBox(RoutingAsCode, Watching, Scheduling, SuspendedEntries, Accounts):
    """A content-based publish/subscribe router over one database.

    ``url`` picks the backend: ``duckdb:///path`` (the default, ``./messagebox.duckdb``)
    or ``postgresql+psycopg://user@host/db``. The schema is created on first open
    (``create=False`` refuses a database without it instead). ``publisher`` names this
    process in routing-failure reports. ``router`` picks how a publish finds its
    subscriptions: ``"index"`` (the default) matches in memory, against this process's
    copy of the subscriptions, kept current through a routing version in the database;
    ``"sql"`` runs the set-based routing statement in the database instead (same
    results; slower, no memory held).
    """

    def __init__(
        self,
        url: StoreURL | None = None,
        *,
        publisher: str | None = None,
        create: bool = True,
        router: str = "index",
    ) -> None:
        self.store = Store(url, create=create, router=router)
        """The storage layer under this box (for the engine's own parts and tests)."""
        self.store.count_hooks.append(_count_in_metrics)
        self.catalog = Catalog(self.store)
        self.messages = Messages(self.store, publisher or f"{socket.gethostname()}:{os.getpid()}")
        self.operations = Operations(self.store)
        self.configs = Configs(self.store)
        self.user_store = UserStore(self.store)

    @property
    def url(self) -> URL:
        return self.store.url

    @property
    def publisher(self) -> str:
        """What this process's publications name as their publisher."""
        return self.messages.publisher

    def close(self) -> None:
        """Release the database connections."""
        self.store.close()

    def __enter__(self) -> MessageBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_host(self, name: str, settings: HostSettings | None = None, **options: Any) -> Host:
        """Create a host (a logical subscriber whose instances share one queue)."""
        return self.catalog.create_host(name, settings, options)

    def configure_host(self, name: str, **options: Any) -> Host:
        """Change some of a host's settings (the others keep their values); returns the
        host as it now is. Host instances read their settings when they start: the ones
        running keep theirs until restarted. Bad settings change nothing."""
        return self.catalog.configure_host(name, options)

    def type_traps(self, filters: Mapping[str, object]) -> list[str]:
        """For filters by subscription name: a warning for each predicate that compares
        its property with a type (text, number, boolean, time) the newest stored
        messages never carry for it, so it never matches them. :meth:`subscribe` logs
        these for the subscriptions it makes."""
        from messagebox.predicates import to_filter

        return self.catalog.type_traps([(k, to_filter(v)) for k, v in filters.items()])

    def remove_host(self, name: str) -> None:
        """Remove a host that nothing refers to any more: no subscription, no queued or
        suspended entry, no registered instance (else :class:`~messagebox.errors.Conflict`
        saying what is left, and nothing changes)."""
        self.catalog.remove_host(name)

    def set_filter(self, ref: int | str, filter: object) -> Subscription:
        """Give a subscription (by id or name) a new filter, in place: it keeps its id,
        name, settings and the entries waiting on its queue (routed by the old filter);
        every publish after the change routes by the new one. Returns it as it now is."""
        return self.catalog.replace_filter(ref, filter)

    def hosts(self) -> list[Host]:
        """Every host, by name."""
        return self.catalog.hosts()

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
        on_expiry: OnExpiry | str = OnExpiry.SUSPEND,
        ordered_by: str | None = None,
    ) -> Subscription:
        """Subscribe ``service`` (running in ``host``) to messages matching ``filter``.
        The subscription's ``name`` (unique) defaults to the service's, or, when that
        is taken, the service's with ``-2``, ``-3`` … (as ``messagebox subscriptions add
        SERVICE`` names it).

        ``filter`` is a DSL expression such as ``(P("a.B") == 1) | P("a.C").exists()``
        or a :class:`~messagebox.predicates.Filter`. Instance subscriptions need ``instance_id``.
        ``ordered`` delivers strictly in publish order, one at a time; ``on_failure``
        says what an ordered subscription does with a message that exhausts its retries.
        ``correlation`` (long-running services) routes every message with the same
        values of these properties to one running instance of the service. On an
        activation subscription the first such message creates the instance and the
        rest follow in order (a convoy); on an instance subscription (no
        ``instance_id``) a message follows the running instance for its values, and
        does not route there when none runs. ``on_expiry`` says what becomes of an
        entry that expires before it is delivered: ``suspend`` (reason ``expired``,
        resumable) or ``drop`` (deleted, its reference released). ``ordered_by`` (a
        property name) delivers the messages with one value of it (a key) strictly in
        publish order, one at a time, different keys in parallel; a message without it
        has a key of its own, shared by all such messages; ``on_failure="stop"`` then
        holds only the failed message's key.
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
                    "on_expiry": on_expiry,
                    "ordered_by": ordered_by,
                }
            ]
        )
        return made

    def subscribe_many(self, specs: Iterable[Mapping[str, Any]]) -> list[Subscription]:
        """Create many subscriptions in one transaction (each a dict of
        :meth:`subscribe`'s arguments); all are created or none."""
        return self.catalog.subscribe_many(specs)

    def subscriptions(
        self,
        *,
        service: str | None = None,
        host: str | None = None,
        instance_id: str | None = None,
    ) -> list[Subscription]:
        """Subscriptions, by id, optionally only those of a service, host or instance."""
        return self.catalog.subscriptions(service=service, host=host, instance_id=instance_id)

    def subscription(self, ref: int | str) -> Subscription:
        """One subscription, by id or name."""
        return self.catalog.subscription(ref)

    def unsubscribe(self, *refs: int | str) -> int:
        """Remove subscriptions (by id or name).

        Their entries still waiting on a queue are suspended (not resumable, reason
        ``subscription-removed``); :meth:`reroute` routes them again, :meth:`terminate`
        drops them. Their resumable suspended entries become the same. An entry being
        delivered at that moment finishes its delivery (if it fails past its retries, it
        is suspended as ``subscription-removed`` too).
        """
        return self.catalog.unsubscribe(refs)

    def set_service_state(self, service: str, state: State | str) -> int:
        """Start, stop or unenlist every subscription of a service (docs/concepts.md: Kinds).

        Stopping holds its waiting messages (and routes new ones held); starting releases
        them. Unenlisting stops routing to it and suspends its waiting messages
        (resumable, reason ``service-unenlisted``). Returns the subscriptions changed.
        """
        return self.catalog.set_service_state(service, state)

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
        trusted: bool = False,
        block: bool = True,
        timeout: float = 60.0,
        suspend: Mapping[int, Suspension] | None = None,
        receipts: Sequence[tuple[str, str, Sequence[int]]] = (),
        connection: object = None,
        delay: float | None = None,
    ) -> list[Routed]:
        """Publish a batch in one transaction: all of it is stored, or none.

        Every message is validated first; each is routed to every matching subscription
        and stored once. A message that matches nothing is handled by ``policy``.
        ``trusted`` lets a receive location set ``messagebox.``/``BTS.`` properties.

        ``delay`` (seconds, at most 365 days) holds the queue entries of the messages
        without their own ``deliver_at`` until that long after the publish, by the
        database's clock (docs/concepts.md: Scheduled delivery). They are routed now.

        For receive locations: ``suspend`` stores the messages it names (by index)
        suspended with a reason instead (see :class:`~messagebox.models.Suspension`);
        ``receipts`` records ``(location, key, message indexes)`` in the same
        transaction, and raises :class:`~messagebox.errors.AlreadyReceived` (storing
        nothing) if a key is recorded already, so an input is never published twice.

        Throttling: while a host the batch routes to has more entries waiting than its
        ``throttle_queue_depth``, publishing waits for it to drain (at most ``timeout``
        seconds), or with ``block=False`` raises :class:`~messagebox.errors.Throttled`
        at once. Nothing is stored by a throttled attempt.

        ``connection``: publish in the caller's transaction instead of one of its own
        (docs/howto-transactional-publish.md): a SQLAlchemy ``Connection`` or ``Session``
        or a psycopg 3 ``Connection`` on this store's database and schema (PostgreSQL),
        or a connection of :meth:`transaction`, in a transaction its owner began.
        Nothing is visible until the caller commits, and nothing is left if it rolls
        back; nothing here commits, rolls back or closes it. A throttled host raises at
        once. If ``publish`` raises, roll the transaction back.
        """
        return self.messages.publish(
            messages,
            policy=policy,
            trusted=trusted,
            block=block,
            timeout=timeout,
            suspend=suspend,
            given=receipts,
            connection=connection,
            delay=delay,
        )

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction on the store's own database for the caller's statements and
        ``publish(..., connection=conn)``, committed when the block ends (rolled back
        if it raises). On DuckDB, where one process holds the file, this is how
        business rows and messages commit together; the connection is SQLAlchemy's."""
        with self.messages.for_caller() as conn:  # the caller's, not the front's
            yield conn

    def receipts(self, location: str, keys: Sequence[str]) -> dict[str, list[uuid.UUID]]:
        """Of ``keys``, those a receive location has recorded, with the message ids
        published for each."""
        return self.messages.receipts(location, keys)

    def would_route(self, properties: Mapping[str, object]) -> list[Subscription]:
        """The subscriptions a message with these promoted properties would reach.
        Nothing is stored."""
        return self.messages.would_route(properties)

    def explain(self, target: uuid.UUID | str | Mapping[str, object]) -> RouteExplanation:
        """Why a message would or would not reach each subscription.

        ``target`` is a stored message's id (its promoted properties are read from the
        spool) or a mapping of promoted properties. For every subscription, in id order:
        whether the message routes to it (exactly what :meth:`would_route` answers) and,
        per filter group, the first predicate that fails with the property's actual
        value, by the reference semantics. Nothing is stored.
        """
        return self.messages.explain(target)

    def read_message(self, message_id: uuid.UUID | str) -> StoredMessage:
        """A stored message: its context and parts."""
        return self.messages.read_message(message_id)

    def message_summary(self, message_id: uuid.UUID | str) -> MessageSummary:
        """A stored message's context and part sizes, without reading its parts."""
        return self.messages.message_summary(message_id)

    def read_messages(
        self,
        message_ids: Iterable[uuid.UUID | str],
        *,
        max_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """Several stored messages at once, by id; ids not in the spool are left out.
        A message with more than ``max_bytes`` in its parts comes as a
        :class:`MessageSummary` (its context and part sizes, no bytes), and so does one
        whose parts would take the bytes read, in id order, past ``total_bytes``."""
        return self.messages.read_messages(message_ids, max_bytes, total_bytes)

    def iter_part(self, message_id: uuid.UUID | str, part: str) -> Iterator[bytes]:
        """A part's bytes, a fragment at a time (for parts too large to hold whole)."""
        return self.messages.iter_part(message_id, part)

    def queue_depth(self, host: str | None = None) -> list[QueueDepth]:
        """Queue entries per host, subscription and state (of one host, if given: an
        unknown host raises :class:`~messagebox.errors.UnknownHost`)."""
        return self.operations.queue_depth(host)

    def queue_stats(self, host: str | None = None) -> list[QueueStats]:
        """Per host and subscription: entries ready, held (the service is stopped),
        blocked (behind a suspended entry of their service instance) and leased, and the
        age of the oldest (by the database clock). An unknown host raises
        :class:`~messagebox.errors.UnknownHost`."""
        return self.operations.queue_stats(host)

    def host_stats(self) -> list[HostStats]:
        """Every host, by name, with its registered instances, queued entries and
        suspended entries."""
        return self.operations.host_stats()

    def stats(self) -> Stats:
        """Counts over the whole box: messages, queue entries by state, suspended entries
        by reason, subscriptions by state, hosts, host and service instances."""
        return self.operations.stats()

    def peek_queue(
        self, host: str, *, state: str | None = None, limit: int = 100
    ) -> list[QueueEntry]:
        """The first ``limit`` entries of a host's queue in claim order, optionally of
        one state (``ready``, ``held``, ``blocked``, ``leased``), each with what holds
        it, changing nothing."""
        from messagebox.ops.browse import QUEUE_STATES

        if state is not None and state not in QUEUE_STATES:
            raise ValidationError(f"queue state {state!r} is not one of {', '.join(QUEUE_STATES)}")
        return self.operations.peek_queue(host, state, limit)

    def held_keys(self, host: str | None = None, *, limit: int = 1000) -> list[HeldKey]:
        """The keys that suspended entries hold (subscriptions ordered by a property that
        stop on failure), oldest first: each with its subscription, the entry that holds
        it (resume or terminate it to release the key), why, and how many of the key's
        entries wait behind it."""
        return self.operations.held_keys(host, limit)

    def find_messages(self, name: str, value: Value, *, limit: int = 100) -> list[FoundMessage]:
        """Stored messages whose promoted property ``name`` has ``value`` (of that type),
        newest first. Reads every stored context: an operator's search, not a hot path."""
        from messagebox.properties import canonical_name, normalize_value

        try:
            canon, normal = canonical_name(name), normalize_value(value, promoted=True)
        except ValueError as exc:
            raise ValidationError(f"property {name!r}: {exc}") from exc
        return self.operations.find_messages(canon, normal, limit)

    def search(
        self,
        filter: object = None,
        *,
        since: datetime | timedelta | None = None,
        until: datetime | timedelta | None = None,
        limit: int = 50,
        after: str | None = None,
        scan: int = 100_000,
    ) -> SearchResult:
        """The stored messages, and (while tracking is on) those cleanup deleted since,
        whose promoted properties match ``filter`` (its text, ``'orders.Total > 5000
        and orders.Region == "EU"'``, or a ``P`` expression; None: all), published from
        ``since`` (a time, or an age; default: the last 24 hours) to before ``until``
        (a time or an age; default: now),
        newest first, each with its state (queued, in hand, suspended, done, deleted).
        At most ``limit`` found and ``scan`` messages gone through: the result's
        ``next`` goes on from where it stopped (``after=``). See
        :mod:`messagebox.ops.search`."""
        from messagebox.ops.search import query

        return self.operations.search(
            query(filter, since=since, until=until, after=after, limit=limit, scan=scan)
        )

    def service_instances(
        self, *, service: str | None = None, state: str | None = None, limit: int = 200
    ) -> list[ServiceInstanceView]:
        """Instances of long-running services (orchestrations), newest first, each with
        its correlation values, the names of the instance subscriptions it waits on, its
        pending timers and its queued and suspended entries. ``state``: ``running``,
        ``suspended``, ``completed``, ``terminated`` or ``pending`` (its first step has
        not committed)."""
        return self.operations.service_instances(service, state, limit)

    def find_instances(
        self,
        correlation: Mapping[str, Value],
        *,
        service: str | None = None,
        state: str | None = None,
        limit: int = 200,
    ) -> list[ServiceInstanceView]:
        """The instances whose correlation values include these (``{"orders.OrderId":
        "A123"}``; ``42`` finds ``42.0``), newest first, as :meth:`service_instances`."""
        from messagebox.properties import canonical_name, normalize_value

        try:
            wanted = {canonical_name(k): normalize_value(v) for k, v in correlation.items()}
        except ValueError as exc:
            raise ValidationError(f"correlation: {exc}") from exc
        if not wanted:
            raise ValidationError("give at least one correlation value (NAME=VALUE)")
        return self.operations.service_instances(service, state, limit, wanted)

    def service_instance(self, instance_id: str) -> InstanceDetail:
        """One instance in full: its saved state, the messages that reached it in its
        order with what became of each, what its steps published, and their tracked
        events (:class:`~messagebox.ops.instance_history.InstanceDetail`). An unknown id
        raises :class:`~messagebox.errors.UnknownInstance`."""
        return self.operations.service_instance(instance_id)

    def terminate_instance(self, instance_id: str) -> Terminated:
        """End an instance for good, as ``terminated``: its queued messages and its
        suspended entries are terminated (their messages released), its timers, convoy
        and instance subscriptions removed; a step of it in flight commits nothing. An
        instance that has ended already is refused (ValidationError)."""
        return self.operations.terminate_instance(instance_id)

    def resubmit(
        self,
        entry_id: int,
        *,
        body: bytes | None = None,
        properties: Mapping[str, object] | None = None,
        location: Resubmits | None = None,
    ) -> list[Routed]:
        """Publish a suspended receive failure's input again, once its cause is fixed:
        its stored bytes, or ``body``; through ``location``'s pipeline (a
        ``ReceiveLocation``, refused again: nothing changes), else as it is, with the
        properties it was stored with; ``properties`` over them either way, the error
        report's (``ErrorReport.*``) left out (:mod:`messagebox.ops.resubmission`). The
        suspended entry is terminated in the transaction that publishes it."""
        entry = self.operations.suspended_entry(entry_id)
        resubmission.check(entry)
        stored = self.messages.read_message(entry.message_id)
        batch = resubmission.messages(stored, body, properties or {}, location)
        policy = RoutingPolicy.SUSPEND if location is None else location.policy
        return self.messages.resubmit(entry_id, stored.id, batch, policy)

    def instances(self, host: str | None = None) -> list[InstanceInfo]:
        """Registered host instances, with their last heartbeat (of one host, if given: an
        unknown host raises :class:`~messagebox.errors.UnknownHost`)."""
        return self.operations.instances(host)

    def now(self) -> datetime:
        """The database's time: every time the store writes or compares is read from it,
        whatever the clocks of the machines that publish and deliver."""
        return self.operations.now()

    @property
    def backend(self) -> str:
        """The backend's name: ``duckdb`` or ``postgresql``."""
        return self.store.dialect.name

    @property
    def one_process(self) -> bool:
        """Whether only one OS process may open this store (DuckDB)."""
        return self.store.dialect.one_process

    def iter_promoted(
        self, chunk: int = 10_000
    ) -> Iterator[list[tuple[uuid.UUID, dict[str, Value]]]]:
        """Every stored message's promoted properties, in id order, ``chunk`` messages
        at a time (a transaction each)."""
        return self.messages.iter_promoted(chunk)

    def consumer(self, host: str, owner: str) -> Consumer:
        """The store as the host instance ``owner`` of ``host`` uses it (for
        :mod:`messagebox.hosts`); what its services publish with their completions
        names this box's publisher."""
        return Consumer(self.store, host, owner, self.publisher)

    def host(self, name: str) -> Host:
        """One host, by name."""
        return self.catalog.host(name)

    def cleanup(
        self,
        *,
        batch: int = 10_000,
        progress: Callable[[str], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> CleanupReport:
        """Run the cleanup job once (docs/concepts.md: Spool); safe while others publish
        and deliver. Messages are deleted ``batch`` at a time, each batch a transaction;
        ``stop`` is asked before each one, and true ends the run there
        (``report.stopped``)."""
        return self.operations.cleanup(batch, progress, stop)

    def check(self) -> list[Problem]:
        """What is inconsistent between the spool, the queues and the reference logs
        (:mod:`messagebox.storage.consistency`): empty on a sound store. Reads every message's
        rows; safe while others publish and deliver."""
        return self.operations.check()

    def references(self, message_id: uuid.UUID | str) -> int:
        """The references a message holds now (added minus released)."""
        return self.messages.references(message_id)

    def __repr__(self) -> str:
        return f"MessageBox({self.url.render_as_string(hide_password=True)!r})"


def _count_in_metrics(counts: Any) -> None:
    """Count a commit's tracked events in this process's metrics (imported on the
    first change: a command that changes nothing starts faster)."""
    from messagebox import metrics

    metrics.apply(counts)
