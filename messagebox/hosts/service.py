"""What a service receives: one :class:`Delivery` per queue entry.

A service is a callable taking a ``Delivery``, or a class (instantiated once per host
instance) whose instances are callable or have a ``handle(delivery)`` method. Returning
completes the entry; raising fails it (retried after a back-off, suspended past the
host's ``max_attempts``); raising :class:`~messagebox.errors.PermanentFailure`
suspends it at once. Delivery is at least once: use ``attempt`` and ``message_id`` to
make a service idempotent.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Literal, overload

from messagebox.errors import MessageValidationError, StorageError, ValidationError
from messagebox.message import Message, MessageSummary, StoredMessage, from_handler
from messagebox.models import Routed, Subscription
from messagebox.properties import Value

if TYPE_CHECKING:
    from messagebox.claims import Claim
    from messagebox.port import HostBox

Handler = Callable[["Delivery"], object]

BATCH_READ_BYTES = 256 * 1024
"""A claimed batch's messages are read together, except those with more than this in
their parts: each of those is read alone when its service asks for its parts, so a
service that reads only properties never loads a large body."""
BATCH_READ_TOTAL = 16 * 1024 * 1024
"""At most this many bytes of parts are read together for a batch (in id order); a
message past it is read alone when its service asks for its parts. A batch of
orchestration steps can hold many ``claim_batch`` (``hosts.cutting.STEP_BATCHES``)."""


class Delivery:
    """One delivery of a message to a subscription's service."""

    def __init__(
        self,
        box: HostBox,
        *,
        entry_id: int,
        message_id: uuid.UUID,
        subscription: Subscription,
        attempt: int,
        host_instance: str,
        batch: MessageBatch | None = None,
        instance_id: str | None = None,
        claim: Claim | None = None,
        completing: Callable[[Callable[[], Claim]], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.box = box
        self._batch = batch
        self._claim = claim
        self._completing = completing
        """A transaction for the service that completes the entry (:meth:`transaction`)."""
        self.entry_id = entry_id
        """The queue entry; unique per (message, subscription), kept across retries."""
        self.message_id = message_id
        self.subscription = subscription
        self.attempt = attempt
        """1 for the first delivery; more after a failure or a lost lease."""
        self.host_instance = host_instance
        self._instance_id = instance_id
        self.settled = False
        """Set by a service that completed the queue entry itself, in its own
        transaction (an orchestration step); the host instance then leaves it alone."""
        self.in_step = False
        """True while an orchestration step handles it (publishing is the step's)."""
        self.storage_error: StorageError | None = None
        """Set when reading the message failed in the store: the engine's failure, not
        the service's (the delivery is retried without using up an attempt)."""
        self._message: StoredMessage | None = None
        self._summary: MessageSummary | None = None
        self.outbox: list[Message] = []
        """What the service published with its completion (:meth:`publish_on_completion`)."""

    @property
    def instance_id(self) -> str | None:
        """The service instance this was routed to: an instance subscription's, or the
        convoy's for a correlated activation subscription."""
        return self._instance_id or self.subscription.instance_id

    # Read once and kept, without functools.cached_property: on Python 3.11 that holds
    # one lock for the attribute across every instance, so each thread's first
    # ``d.message`` waited while another thread's batch was read (half the time of
    # running orchestration steps on DuckDB went to waiting there).

    @property
    def message(self) -> StoredMessage:
        """The stored message with its parts (read on first use, with the rest of its
        claimed batch unless it is large)."""
        if self._message is None:
            found = self._read(lambda: self._batch.get(self.message_id) if self._batch else None)
            if not isinstance(found, StoredMessage):
                found = self._read(lambda: self.box.read_message(self.message_id))
            self._message = found
        return self._message

    @property
    def summary(self) -> MessageSummary:
        """The message's context and part sizes, without its bytes."""
        if self._summary is None:
            found = self._read(lambda: self._batch.get(self.message_id) if self._batch else None)
            if found is None:
                found = self._read(lambda: self.box.message_summary(self.message_id))
            self._summary = found if isinstance(found, MessageSummary) else found.summary()
        return self._summary

    @property
    def properties(self) -> dict[str, Value]:
        """The message's promoted properties (the parts of a message larger than
        ``BATCH_READ_BYTES`` are not read)."""
        if self._message is not None:  # read already (an orchestration step reads it first)
            return self._message.promoted
        return self.summary.promoted

    def _read(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except StorageError as exc:
            self.storage_error = exc
            raise

    @property
    def body(self) -> bytes:
        """The body part's bytes."""
        return self.message.body

    def iter_part(self, part: str) -> Iterator[bytes]:
        """A part's bytes a fragment at a time, for parts too large to hold whole."""
        chunks = self.box.iter_part(self.message_id, part)
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except StorageError as exc:
                self.storage_error = exc
                raise
            yield chunk

    @overload
    def publish(self, messages: Message | Iterable[Message]) -> None: ...

    @overload
    def publish(
        self, messages: Message | Iterable[Message], *, at_once: Literal[True], **options: Any
    ) -> list[Routed]: ...

    @overload
    def publish(
        self, messages: Message | Iterable[Message], *, at_once: bool, **options: Any
    ) -> list[Routed] | None: ...

    def publish(
        self, messages: Message | Iterable[Message], *, at_once: bool = False, **options: Any
    ) -> list[Routed] | None:
        """Publish messages made from this delivery with its completion
        (:meth:`publish_on_completion`): stored and routed in the transaction that
        completes its queue entry, once; nothing if the service fails. With
        ``at_once=True``, now, in a transaction of its own (or the ``connection=``
        given), with ``MessageBox.publish``'s options, returning what routing did; a
        retry of this delivery then publishes them again."""
        if at_once:
            if self.in_step:
                raise ValidationError(
                    f"{self.subscription.service}: an orchestration publishes with "
                    "self.publish(), which commits with its step; Delivery.publish(..., "
                    "at_once=True) would publish again on a retry"
                )
            return self.box.publish(
                [messages] if isinstance(messages, Message) else messages, **options
            )
        if options:
            raise ValidationError(
                f"{self.subscription.service}: Delivery.publish publishes with the "
                f"completion and takes no options ({', '.join(sorted(options))}): pass "
                "at_once=True to publish now with them (a retry publishes again)"
            )
        self._defer("publish", [messages])
        return None

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction on the store's database (a SQLAlchemy connection) in which the
        service writes its own rows and which completes this delivery: when the block
        ends, the queue entry is completed in it, with what was published with
        :meth:`publish_on_completion` (or with ``publish(..., connection=conn)``), and
        it all commits together, or nothing does. If the entry is no longer this
        instance's (its lease lapsed and another delivery took it), it raises
        :class:`~messagebox.errors.Conflict` and the service's rows roll back with it.
        Once it has committed, the delivery is done: what the service does after is not
        its outcome."""
        service = self.subscription.service
        if self._completing is None or self._claim is None:
            raise ValidationError(f"{service}: a delivery handed out by a host instance only")
        if self.in_step:
            raise ValidationError(
                f"{service}: an orchestration's step commits its state with its completion"
            )
        if self.settled:
            raise ValidationError(f"{service}: this delivery is completed already")
        claim = self._claim
        with self._completing(lambda: claim._replace(publish=tuple(self.outbox))) as conn:
            yield conn
        self.outbox.clear()
        self.settled = True

    def publish_on_completion(self, *messages: Message | Iterable[Message]) -> None:
        """Publish messages with this delivery's completion: stored and routed in the
        transaction that completes its queue entry, with the rest of its batch. If the
        service fails, or the process ends before that commit, nothing is published,
        and the next delivery publishes again: no duplicates, where
        ``publish(..., at_once=True)`` publishes again on every retry. A message that
        no subscription takes is suspended (a routing failure), never failing the
        completion, as an orchestration step's publications are; no host is throttled.
        The messages get their ids when they are stored: one that gives its own is
        refused, as is one that sets a property in the reserved namespace.
        ``publish(messages)`` does the same."""
        self._defer("publish_on_completion", messages)

    def _defer(self, call: str, messages: Iterable[Any]) -> None:
        service = self.subscription.service
        if self.in_step:
            raise ValidationError(
                f"{service}: an orchestration publishes with self.publish(), which commits "
                "with its step"
            )
        if self.settled:
            raise ValidationError(
                f"{service}: {call} after this delivery completed (its transaction() "
                "committed): publish inside that block"
            )
        batch = from_handler(f"{service}: {call}", messages)
        given = next((m for m in batch if m.id is not None), None)
        if given is not None:  # stored with the batch's completions: a clash fails them all
            raise MessageValidationError(
                f"{service}: {call} publishes with the completion and gives each message "
                f"its id; message {given.id} gives its own (publish it with "
                "publish(..., at_once=True))"
            )
        self.outbox.extend(batch)

    def __repr__(self) -> str:
        return (
            f"Delivery(entry={self.entry_id}, message={self.message_id}, "
            f"service={self.subscription.service!r}, attempt={self.attempt})"
        )


class MessageBatch:
    """The messages of a claimed batch (or of several batches of one claim), read
    together on first use: each with its parts, or, past ``BATCH_READ_BYTES``, only its
    summary. At most ``BATCH_READ_TOTAL`` bytes of parts are read at a time, in id
    order; a message past them is read with the next such chunk when asked for."""

    def __init__(self, box: HostBox, message_ids: Sequence[uuid.UUID]) -> None:
        self._box = box
        self._ids = message_ids  # each once at the first read: many handlers read none
        self._messages: dict[uuid.UUID, StoredMessage | MessageSummary] | None = None
        self._lock = threading.Lock()
        self._wanted: dict[uuid.UUID, int] | None = None
        """Entries yet to finish per message, once :meth:`done` is first called."""

    def done(self, message_ids: Iterable[uuid.UUID]) -> None:
        """Entries (one per id given) are finished: a message no other entry of the
        batches sharing this read still wants is let go, so that several batches read
        together hold no more than each would alone, beside one chunk."""
        with self._lock:
            if self._wanted is None:
                self._wanted = {}
                for i in self._ids:
                    self._wanted[i] = self._wanted.get(i, 0) + 1
            for i in message_ids:
                left = self._wanted.get(i, 0) - 1
                if left > 0:
                    self._wanted[i] = left
                    continue
                self._wanted.pop(i, None)
                if self._messages is not None:
                    self._messages.pop(i, None)

    def get(self, message_id: uuid.UUID) -> StoredMessage | MessageSummary | None:
        with self._lock:
            if self._messages is None:
                self._messages = {}
                wanted = self._wanted
                self._read([i for i in dict.fromkeys(self._ids) if wanted is None or i in wanted])
            found = self._messages.get(message_id)
            while found is not None and _left_for_later(found):
                if not self._read([i for i, m in self._messages.items() if _left_for_later(m)]):
                    break  # nothing more came whole: it is read alone
                found = self._messages.get(message_id)
            return found

    def _read(self, ids: list[uuid.UUID]) -> bool:
        """Read a chunk: the first of ``ids``, in id order, up to ``BATCH_READ_TOTAL``
        (at least one message: one is at most ``BATCH_READ_BYTES``). Returns whether
        any came whole."""
        assert self._messages is not None
        read = self._box.read_messages(
            ids, max_bytes=BATCH_READ_BYTES, total_bytes=BATCH_READ_TOTAL
        )
        self._messages.update(read)
        return any(isinstance(m, StoredMessage) for m in read.values())


def _left_for_later(found: StoredMessage | MessageSummary) -> bool:
    """Whether a message came without its parts only because the chunk was full (not
    because it is larger than ``BATCH_READ_BYTES``)."""
    return not isinstance(found, StoredMessage) and (
        sum(found.part_sizes.values()) <= BATCH_READ_BYTES
    )


def as_handler(name: str, service: object) -> Handler:
    """The callable that handles deliveries for a registered service."""
    if isinstance(service, type):
        cls = service
        try:
            service = cls()
        except TypeError as exc:
            raise ValidationError(
                f"service {name!r}: the class {cls.__name__} must be creatable "
                f"without arguments ({exc})"
            ) from exc
    handle = getattr(service, "handle", None)
    if callable(handle):
        return handle  # type: ignore[no-any-return]
    if callable(service):
        return service
    raise ValidationError(
        f"service {name!r} must be a callable taking a Delivery, or a class with a "
        f"handle(delivery) method; got {type(service).__name__}"
    )
