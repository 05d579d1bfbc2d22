"""The in-memory store as a box a host instance runs on: :class:`MemoryBox` is the part
of :class:`messagebox.engine.MessageBox` that :mod:`messagebox.hosts` uses (the
:class:`messagebox.port.HostBox` protocol): hosts and subscriptions, a
:class:`~messagebox.memory.MemoryConsumer` per instance, reading and publishing
messages, cleanup. No SQL: a :class:`~messagebox.hosts.HostInstance` runs on it
without a database.

    box = MemoryBox(clock=ManualClock())
    box.create_host("shipping")
    box.subscribe("ship", host="shipping", filter=P("orders.Region") == "EU")
    with HostInstance(box, "shipping", services={"ship": ship}):
        box.publish([Message(b"<order/>", promoted={"orders.Region": "EU"})])
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from messagebox.errors import UnknownHost, UnknownMessage, UnknownSubscription, ValidationError
from messagebox.memory.clocks import Clock
from messagebox.memory.consumer import MemoryConsumer
from messagebox.memory.state import MemoryStore
from messagebox.message import Message, MessageSummary, PartData, StoredMessage
from messagebox.models import Host, HostSettings, Routed, RoutingPolicy, Subscription
from messagebox.upkeep import CleanupReport

FRAGMENT_BYTES = 64 * 1024
"""The size of the fragments :meth:`MemoryBox.iter_part` yields."""


class MemoryOperations:
    """The box's operations a host instance calls (its queue-depth samples, counted)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.depths: list[tuple[str, str, int]] = []
        """(host, source, depth) of each sample taken."""

    def sample_depth(self, host: str, source: str) -> int:
        depth = len(self._store.entries(host))
        self.depths.append((host, source, depth))
        return depth


class MemoryBox:
    """A :class:`~messagebox.port.HostBox` over a :class:`MemoryStore` (a new one on
    ``clock`` unless ``store`` is given)."""

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        clock: Clock | None = None,
        publisher: str = "memory",
    ) -> None:
        self.store = store or MemoryStore(clock, publisher=publisher)
        self.operations = MemoryOperations(self.store)
        self.closed = False

    @property
    def publisher(self) -> str:
        """What this box's publications name as their publisher."""
        return self.store.publisher

    # --- hosts and subscriptions ---

    def create_host(self, name: str, settings: HostSettings | None = None, **options: Any) -> Host:
        """Create a host (``options``: :class:`HostSettings` fields)."""
        self.store.create_host(name, settings, **options)
        return self.host(name)

    def host(self, name: str) -> Host:
        with self.store.lock:
            found = self.store.rows.hosts.get(name)
        if found is None:
            raise UnknownHost(f"no host {name!r}")
        return Host(name=name, settings=found, created_at=self.store.now())

    def subscribe(
        self, service: str, *, correlation: Sequence[str] = (), **options: Any
    ) -> Subscription:
        """Subscribe ``service`` (see :meth:`MemoryStore.subscribe`); no correlation
        here (an orchestration's specs name an empty one)."""
        if correlation:
            raise ValidationError("the memory store does not correlate (no convoys)")
        return self.store.subscribe(service, **options)

    def subscriptions(self, *, host: str | None = None) -> list[Subscription]:
        with self.store.lock:
            subs = sorted(self.store.rows.subs.values(), key=lambda s: s.id)
        return [s for s in subs if host is None or s.host == host]

    def subscription(self, ref: int | str) -> Subscription:
        """One subscription, by id or name."""
        for s in self.subscriptions():
            if ref in (s.id, s.name):
                return s
        raise UnknownSubscription(f"no subscription {ref!r}")

    def consumer(self, host: str, owner: str) -> MemoryConsumer:
        return MemoryConsumer(self.store, host, owner, self.publisher)

    # --- messages ---

    def publish(
        self,
        messages: Iterable[Message],
        *,
        policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
        delay: float | None = None,
    ) -> list[Routed]:
        """Route and store a batch at once (no throttling, no receipts here)."""
        return self.store.publish(messages, policy=policy, delay=delay)

    def read_message(self, message_id: uuid.UUID | str) -> StoredMessage:
        msg_id = uuid.UUID(str(message_id))
        with self.store.lock:
            found = self.store.rows.messages.get(msg_id)
        if found is None:
            raise UnknownMessage(f"no message {msg_id}")
        message, publisher, at = found
        parts = {name: _bytes(data) for name, data in message.parts.items()}
        message.parts.update(parts)  # a file object is read once: keep its bytes
        return StoredMessage(
            id=msg_id,
            promoted=dict(message.promoted),
            written=dict(message.written),
            parts=parts,
            body_part=message.body_part,
            published_at=at,
            publisher=publisher,
            part_sizes={name: len(data) for name, data in parts.items()},
        )

    def message_summary(self, message_id: uuid.UUID | str) -> MessageSummary:
        return self.read_message(message_id).summary()

    def read_messages(
        self,
        message_ids: Iterable[uuid.UUID | str],
        *,
        max_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> dict[uuid.UUID, StoredMessage | MessageSummary]:
        """The messages of ``message_ids`` held (others left out); a message past
        ``max_bytes``, or past ``total_bytes`` read in all, as its summary."""
        out: dict[uuid.UUID, StoredMessage | MessageSummary] = {}
        total = 0
        for i in message_ids:
            try:
                m = self.read_message(i)
            except UnknownMessage:
                continue
            size = sum(m.part_sizes.values())
            whole = (max_bytes is None or size <= max_bytes) and (
                total_bytes is None or total + size <= total_bytes
            )
            total += size if whole else 0
            out[m.id] = m if whole else m.summary()
        return out

    def iter_part(self, message_id: uuid.UUID | str, part: str) -> Iterator[bytes]:
        data = self.read_message(message_id).parts[part]
        for at in range(0, len(data), FRAGMENT_BYTES):
            yield data[at : at + FRAGMENT_BYTES]

    # --- upkeep ---

    def cleanup(
        self, *, batch: int = 10_000, stop: Callable[[], bool] | None = None
    ) -> CleanupReport:
        """Delete up to ``batch`` messages that no queue or suspended entry holds."""
        with self.store.lock:
            rows = self.store.rows
            held = {e.msg for e in rows.queue.values()} | {s.msg for s in rows.suspended.values()}
            unheld = [i for i in rows.messages if i not in held][:batch]
            for i in unheld:
                del rows.messages[i]
        return CleanupReport(messages=len(unheld))

    def close(self) -> None:
        """Nothing to let go of; marks the box closed."""
        self.closed = True


def _bytes(data: PartData) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    return data.read()
