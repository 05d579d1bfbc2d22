"""Messages in and out of the spool: publishing (validated, routed, stored and queued in
one transaction), what a message would route to and why, and reading stored messages
(the storage side of :class:`~messagebox.engine.MessageBox`'s message methods)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from messagebox import timing
from messagebox.errors import (
    AlreadyExists,
    Conflict,
    MessageValidationError,
    Throttled,
    UnknownMessage,
    ValidationError,
)
from messagebox.message import Message, MessageSummary, StoredMessage
from messagebox.models import (
    Routed,
    RouteExplanation,
    RoutingPolicy,
    State,
    Subscription,
    SubscriptionExplanation,
    Suspension,
)
from messagebox.predicates import normalize_properties
from messagebox.predicates.explain import explain as explain_filter
from messagebox.properties import Value, decode_context
from messagebox.routing import receipts, router
from messagebox.routing.receipts import Receipt
from messagebox.routing.throttle import Throttle
from messagebox.storage import recent, schema, spool, store_clock, subscriptions, suspension
from messagebox.storage.dialects.base import Prelude
from messagebox.storage.fence import Fence
from messagebox.storage.ids import uuid7s
from messagebox.storage.sharing import Group
from messagebox.storage.store import Store

PUBLISH_CONFLICT_RETRIES = 20
MAX_TIMEOUT_SECONDS = 86_400.0
"""The longest a throttled publish may be told to wait."""

_Batch = tuple[list[Message], list[uuid.UUID]]


def _policy(policy: RoutingPolicy | str) -> RoutingPolicy:
    try:
        return RoutingPolicy(policy)
    except ValueError:
        raise ValidationError(
            f"routing policy {policy!r} is not one of " + ", ".join(p.value for p in RoutingPolicy)
        ) from None


def _check_joined(found: Prelude, store: str | None) -> None:
    """Refuse a caller's connection that sees another store, or whose transaction is
    not read committed (routing must see the subscriptions committed as it runs, as
    every publish does, and wait for a subscription change in flight)."""
    if found.store is None or found.store != store:
        raise ValidationError(
            "connection= is connected to another messagebox store than this box's "
            f"(its store id {found.store!r}, this box's {store!r}): same database and "
            "schema (search_path) needed; nothing was published"
        )
    if found.isolation != "read committed":
        raise ValidationError(
            f"connection= is in a {found.isolation} transaction; publish needs read "
            "committed (the default) to route by the subscriptions as they are now"
        )


def _batch(messages: object) -> list[Message]:
    """The batch as a list; one :class:`Message` given alone is refused, naming it."""
    if isinstance(messages, Message):
        raise MessageValidationError(
            "publish takes a list of messages, not one Message: publish([message])"
        )
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise MessageValidationError(
            f"publish takes a list of messages, not {type(messages).__name__}"
        )
    return list(messages)


def _message_ids(batch: Sequence[object], trusted: bool) -> list[uuid.UUID]:
    """Each message's id (given or new), after checking it is a Message that sets no
    reserved property unless ``trusted``."""
    given: list[uuid.UUID | None] = []
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
        given.append(message.id)
    made = given.count(None)
    if made == len(given):  # new ids only (the common case): none can repeat
        return uuid7s(made)
    new = iter(uuid7s(made))
    ids = [next(new) if m is None else m for m in given]
    if len(set(ids)) != len(ids):
        raise MessageValidationError("the batch gives one message id twice")
    return ids


def _promoted(properties: Mapping[str, object]) -> dict[str, Value]:
    try:
        return normalize_properties(properties)
    except ValueError as exc:
        raise MessageValidationError(f"properties: {exc}") from exc


class Messages:
    """Publishing to and reading from one store's spool."""

    def __init__(self, store: Store, publisher: str) -> None:
        self._store = store
        self.publisher = publisher
        self._throttle = Throttle()
        self._groups: dict[RoutingPolicy, Group[_Batch, list[Routed]]] = {
            policy: Group(threading.Lock()) for policy in RoutingPolicy
        }
        """Batches waiting for the next publish, by routing policy (DuckDB)."""

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str,
        trusted: bool,
        block: bool,
        timeout: float,
        suspend: Mapping[int, Suspension] | None,
        given: Sequence[Receipt],
        connection: object = None,
        delay: float | None = None,
    ) -> list[Routed]:
        """Publish a batch in one transaction (see ``MessageBox.publish``): its own, or
        with ``connection`` the caller's."""
        batch = _batch(messages)
        if delay is not None:
            delay = timing.seconds("delay", delay) or None
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ValidationError(f"timeout must be a number of seconds, not {timeout!r}")
        if not 0 <= timeout <= MAX_TIMEOUT_SECONDS:  # (NaN is in no range)
            raise ValidationError(
                f"timeout must be 0 to {MAX_TIMEOUT_SECONDS:g} seconds, not {timeout!r}"
            )
        routing = _policy(policy)
        ids = _message_ids(batch, trusted)
        for i in suspend or {}:
            if not 0 <= i < len(batch):
                raise ValidationError(f"suspend names message {i}; the batch has {len(batch)}")
        if not batch and not given:
            return []
        if connection is not None:
            return self._publish_joined(connection, batch, ids, routing, suspend, given, delay)
        deadline = time.monotonic() + timeout
        conflicts = 0
        while True:
            try:
                return self._publish_once(batch, ids, routing, suspend, given, delay)
            except Throttled as exc:
                if not block or time.monotonic() >= deadline:
                    raise
                self._throttle.wait(self._store, exc.hosts, deadline)
            except AlreadyExists as exc:
                if not given:
                    raise
                # a concurrent publish recorded one of the receipts after our check (its
                # insert won the unique key): say so as the check would have
                with self._store.transaction() as conn:
                    receipts.refuse_received(conn, [(loc, key) for loc, key, _ in given], exc)
                raise
            except Conflict:
                # a concurrent publish created the same convoy instance first (DuckDB
                # refuses the later commit); nothing was stored, so route again
                conflicts += 1
                if conflicts > PUBLISH_CONFLICT_RETRIES:
                    raise
                time.sleep(random.uniform(0, 0.002 * 2 ** min(conflicts, 8)))

    def _publish_once(
        self,
        batch: list[Message],
        ids: list[uuid.UUID],
        routing: RoutingPolicy,
        suspend: Mapping[int, Suspension] | None,
        given: Sequence[Receipt],
        delay: float | None,
    ) -> list[Routed]:
        """One attempt at publishing a batch in one transaction. Where transactions
        are serialised in-process (DuckDB), the batches that other threads publish
        through this object (same policy, no receipts, suspension or delay asked for)
        while one publish runs go in the next transaction together: a handler's publish
        of one message costs the statements of a whole batch there. If that shared
        publish fails, each thread publishes its own batch alone, so an error (a routing
        failure, a throttled host) stays with the batch that caused it."""
        if given or suspend or delay or not self._store.dialect.one_process:
            return self._publish_tx(batch, ids, routing, suspend, given, delay)
        return self._groups[routing].run(
            (batch, ids),
            lambda batches: self._publish_together(batches, routing),
            lambda alone: self._publish_tx(*alone, routing),
        )

    def _publish_together(
        self, batches: list[_Batch], routing: RoutingPolicy
    ) -> list[list[Routed]]:
        """Several batches in one transaction; each one's results."""
        results = self._publish_tx(
            [m for messages, _ in batches for m in messages],
            [i for _, ids in batches for i in ids],
            routing,
        )
        out: list[list[Routed]] = []
        start = 0
        for _, ids in batches:
            out.append(results[start : start + len(ids)])
            start += len(ids)
        return out

    def _publish_tx(
        self,
        batch: list[Message],
        ids: list[uuid.UUID],
        routing: RoutingPolicy,
        suspend: Mapping[int, Suspension] | None = None,
        given: Sequence[Receipt] = (),
        delay: float | None = None,
    ) -> list[Routed]:
        """Publish a batch in one transaction of its own."""
        with self._store.transaction(fence=Fence.ROUTES) as conn:
            router.prelude(conn, self._store.dialect)
            results, hosts = self._routed(conn, batch, ids, routing, suspend, given, delay)
        self._throttle.added(hosts)
        return results

    def _routed(
        self,
        conn: sa.Connection,
        batch: list[Message],
        ids: list[uuid.UUID],
        routing: RoutingPolicy,
        suspend: Mapping[int, Suspension] | None,
        given: Sequence[Receipt],
        delay: float | None = None,
    ) -> tuple[list[Routed], Counter[str]]:
        """Record the receipts, route and store the batch in ``conn``'s transaction,
        after its prelude."""
        now = store_clock.now(conn)
        if given:
            receipts.record(conn, given, ids, now)
        return router.publish(
            conn,
            self._store.dialect,
            batch,
            ids,
            policy=routing,
            publisher=self.publisher,
            now=now,
            before_write=self._throttle.check,
            suspensions=suspend,
            delay=delay,
        )

    def resubmit(
        self,
        entry_id: int,
        message_id: uuid.UUID,
        messages: Sequence[Message],
        policy: RoutingPolicy | str,
    ) -> list[Routed]:
        """Publish ``messages`` (trusted: a receive location's, or what one stored) and
        terminate suspended receive failure ``entry_id`` of ``message_id`` in one
        transaction (:func:`suspension.withdraw`)."""
        batch = _batch(messages)
        ids = _message_ids(batch, True)
        with self._store.transaction(serial=True, fence=Fence.ROUTES) as conn:
            router.prelude(conn, self._store.dialect)
            suspension.withdraw(conn, self._store.dialect, entry_id, message_id)
            results, hosts = self._routed(conn, batch, ids, _policy(policy), None, ())
        self._throttle.added(hosts)
        return results

    @contextmanager
    def for_caller(self) -> Iterator[sa.Connection]:
        """A transaction of the caller's on this store (``MessageBox.transaction``),
        holding the routing fence as a publish does, for ``publish(connection=)``."""
        with self._store.transaction(fence=Fence.ROUTES, owned=True) as conn:
            yield conn

    def _publish_joined(
        self,
        connection: object,
        batch: list[Message],
        ids: list[uuid.UUID],
        routing: RoutingPolicy,
        suspend: Mapping[int, Suspension] | None,
        given: Sequence[Receipt],
        delay: float | None,
    ) -> list[Routed]:
        """Publish a batch in the caller's transaction: its first statement checks the
        connection sees this store, in read committed (``router.prelude``); nothing is
        written before. A throttled host raises at once (waiting would hold the caller's
        transaction open, and a publish cannot be retried inside it)."""
        with self._store.joined(connection) as conn:
            try:
                found = router.prelude(conn, self._store.dialect)
            except sa.exc.DBAPIError as exc:  # no such function: another schema or database
                raise ValidationError(
                    "connection= does not see this box's store (same database and schema, "
                    f"search_path, needed); nothing was published: {exc}"
                ) from exc
            if found is not None:
                _check_joined(found, self._store.id)
            results, hosts = self._routed(conn, batch, ids, routing, suspend, given, delay)
        self._throttle.added(hosts)
        return results

    def receipts(self, location: str, keys: Sequence[str]) -> dict[str, list[uuid.UUID]]:
        if not keys:
            return {}
        with self._store.transaction() as conn:
            return receipts.lookup(conn, location, keys)

    def would_route(self, properties: Mapping[str, object]) -> list[Subscription]:
        promoted = _promoted(properties)
        with self._store.transaction() as conn:
            [rows] = router.route(conn, self._store.dialect, [promoted])
            return subscriptions.list_subscriptions(conn, ids=[r.sub for r in rows])

    def explain(self, target: uuid.UUID | str | Mapping[str, object]) -> RouteExplanation:
        message_id: uuid.UUID | None = None
        with self._store.transaction() as conn:
            if isinstance(target, Mapping):
                promoted = _promoted(target)
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

    # --- stored messages ---

    def read_message(self, message_id: uuid.UUID | str) -> StoredMessage:
        msg_id = uuid.UUID(str(message_id))
        kept = self._kept([msg_id], None)
        if msg_id in kept:
            return kept[msg_id]  # type: ignore[return-value]  # whole: no max_bytes
        with self._store.transaction() as conn:
            found = spool.read_message(conn, self._store.dialect, msg_id)
        self._keep([found])
        return found

    def message_summary(self, message_id: uuid.UUID | str) -> MessageSummary:
        msg_id = uuid.UUID(str(message_id))
        kept = self._kept([msg_id], -1)
        if msg_id in kept:
            return kept[msg_id]  # type: ignore[return-value]  # a summary: max_bytes -1
        with self._store.transaction() as conn:
            return spool.describe(conn, self._store.dialect, msg_id)

    def read_messages(
        self,
        message_ids: Iterable[uuid.UUID | str],
        max_bytes: int | None,
        total_bytes: int | None = None,
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        for name, value in (("max_bytes", max_bytes), ("total_bytes", total_bytes)):
            if value is not None and (type(value) is not int or value < 0):
                raise ValidationError(f"{name} must be None or an int of at least 0, not {value!r}")
        ids = [m if type(m) is uuid.UUID else uuid.UUID(str(m)) for m in message_ids]
        found = self._kept(ids, max_bytes)
        missing = [i for i in ids if i not in found] if found else ids
        if missing:  # a message never changes: no transaction around its statements
            with self._store.transaction(autocommit=True) as conn:
                read = spool.read_messages(
                    conn, self._store.dialect, missing, max_bytes=max_bytes, total_bytes=total_bytes
                )
            self._keep(m for m in read.values() if isinstance(m, StoredMessage))
            found.update(read)
        return found

    def _kept(
        self, ids: list[uuid.UUID], max_bytes: int | None
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """The messages of ``ids`` held in memory (:mod:`messagebox.storage.recent`)."""
        kept = self._store.recent
        return kept.get(ids, max_bytes) if kept is not None and len(kept) else {}

    def _keep(self, messages: Iterable[StoredMessage]) -> None:
        """Hold messages just read in memory, for the next read of them."""
        kept = self._store.recent
        if kept is not None:
            kept.put((m.id, e) for m in messages if (e := recent.read(m)) is not None)

    def iter_part(self, message_id: uuid.UUID | str, part: str) -> Iterator[bytes]:
        msg_id = uuid.UUID(str(message_id))
        with self._store.transaction() as conn:
            part_id, n = spool.part_fragments(conn, msg_id, part)
        for seq in range(n):
            with self._store.transaction() as conn:
                chunk = spool.fragment(conn, part_id, seq)
            yield chunk

    def iter_promoted(self, chunk: int) -> Iterator[list[tuple[uuid.UUID, dict[str, Value]]]]:
        if type(chunk) is not int or chunk < 1:
            raise ValidationError(f"chunk must be a positive int, not {chunk!r}")
        return self._pages(chunk)

    def _pages(self, chunk: int) -> Iterator[list[tuple[uuid.UUID, dict[str, Value]]]]:
        after: uuid.UUID | None = None
        while True:
            with self._store.transaction() as conn:
                page = spool.promoted_page(conn, after, chunk)
            if not page:
                return
            yield page
            after = page[-1][0]

    def references(self, message_id: uuid.UUID | str) -> int:
        msg = uuid.UUID(str(message_id))
        total = 0
        with self._store.transaction() as conn:
            for table, sign in ((schema.ref_add, 1), (schema.ref_release, -1)):
                n = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(table.c.n), 0)).where(table.c.msg == msg)
                ).scalar_one()
                total += sign * int(n)
        return total
