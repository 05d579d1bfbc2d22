"""Receive ports and send ports (BizTalk's shape).

A **receive location** (an adapter URL and a receive pipeline) belongs to a **receive
port**. What its adapter takes in goes through the pipeline and is published in one
transaction with a receipt, so an input is published once, whole, or not at all. When
the pipeline refuses an input, the input is stored suspended (``receive-failure``, not
resumable) with its original bytes and the error; with ``route_failed=True`` it is also
routed as an error report, with ``ErrorReport.*`` properties promoted.

A **send port** is a service with a filter subscription, a send pipeline and a
transport. A failed transmission is retried ``retry_count`` times, ``retry_interval``
seconds apart; then the backup transport (if any) gets its own retries; then the
message is suspended (resumable). A **send port group** sends what its filter matches
through each of its ports: each port's subscription is its own filter OR'ed with its
groups' filters, so a message reaches a port once however many of them match.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from messagebox import clock
from messagebox.adapters import Inbound, Outbound, Submitted, receive_adapter, send_adapter
from messagebox.errors import (
    MessageValidationError,
    PermanentFailure,
    PipelineError,
    RetryLater,
    ValidationError,
)
from messagebox.hosts.dispatch import Counters
from messagebox.message import Message
from messagebox.models import RECEIVE_FAILURE, RoutingPolicy, Suspension
from messagebox.pipelines import (
    MESSAGE_TYPE,
    PASS_THRU_RECEIVE,
    PASS_THRU_SEND,
    PipelineContext,
    PipelineMessage,
    ReceivePipeline,
    SendPipeline,
)
from messagebox.predicates import to_filter
from messagebox.predicates.model import Filter

if TYPE_CHECKING:
    from messagebox.engine import MessageBox
    from messagebox.hosts.service import Delivery

log = logging.getLogger("messagebox.ports")

DEFAULT_MAX_BYTES = 32 << 20
READ_CHUNK = 1 << 20
MAX_PROMOTED = 256


def _put(promoted: dict[str, object], written: dict[str, object], name: str, value: object) -> None:
    """Promote a transport property when it fits a promoted string, else write it."""
    if isinstance(value, str) and len(value) > MAX_PROMOTED:
        written[name] = value
    else:
        promoted[name] = value


@dataclass
class LocationStats(Counters):
    """What a receive location took in."""

    inputs: int = 0
    published: int = 0
    suspended: int = 0
    duplicates: int = 0
    """Inputs whose receipt was recorded before (taken over after a crash)."""


@dataclass
class PortStats(Counters):
    """What a send port sent."""

    sent: int = 0
    sent_backup: int = 0
    retried: int = 0
    suspended: int = 0


class ReceiveLocation:
    """An adapter URL and a receive pipeline, publishing into the MessageBox."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        port: ReceivePort,
        pipeline: ReceivePipeline | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        recoverable: bool = False,
        policy: RoutingPolicy | str = RoutingPolicy.SUSPEND,
        **options: Any,
    ) -> None:
        if pipeline is not None and not isinstance(pipeline, ReceivePipeline):
            raise ValidationError(
                f"receive location {name!r}: pipeline must be a ReceivePipeline, "
                f"not {type(pipeline).__name__}"
            )
        if max_bytes < 1:
            raise ValidationError(f"receive location {name!r}: max_bytes must be positive")
        self.name = name
        self.url = url
        self.port = port
        self.pipeline = pipeline or PASS_THRU_RECEIVE
        self.max_bytes = max_bytes
        self.recoverable = recoverable
        self.policy = RoutingPolicy(policy)
        self.adapter = receive_adapter(url, **options)
        self.key = f"{port.name}/{name}"
        """Names this location's receipts."""
        self.stats = LocationStats()
        self._box: MessageBox | None = None

    # --- Receiver: run by a host instance ---

    def start(self, box: MessageBox, owner: str) -> None:
        self._box = box
        self.adapter.start(box, owner, self)
        with _RUNNING_LOCK:
            _RUNNING.append(self)
        log.info(
            "receive location %s listening on %s",
            self.key,
            self.url,
            extra={"event": "receive-listening", "location": self.key, "url": self.url},
        )

    def stop(self, timeout: float) -> None:
        with _RUNNING_LOCK:
            if self in _RUNNING:
                _RUNNING.remove(self)
        self.adapter.stop(timeout)

    def resubmission(self, body: bytes, properties: Mapping[str, object]) -> list[Message]:
        """The messages this location's pipeline makes of a resubmitted input (``body``,
        with ``properties`` as its transport's): ``MessageBox.resubmit``. A refusal
        raises :class:`~messagebox.errors.PipelineError` (nothing is stored)."""
        inbound = Inbound.of_bytes(body, properties=dict(properties), name="a resubmitted input")
        with ExitStack() as stack:
            made = self._prepare(inbound, stack)
        for _, failure in made:
            if failure is not None:
                code = str((failure.report or {}).get("code") or "refused")
                raise PipelineError(
                    f"refuses the resubmitted input again: {failure.error}; nothing was changed",
                    code=code,
                    component=self.key,
                )
        return [message for message, _ in made]

    # --- Sink: called by the adapter ---

    def submit(self, inputs: list[Inbound]) -> list[Submitted]:
        """Run the pipeline over each input and publish everything in one transaction
        with the inputs' receipts. Raises if nothing could be stored."""
        box = self._box
        if box is None:
            raise ValidationError(f"receive location {self.key} is not started")
        keys = [i.key for i in inputs if i.key]
        done = box.receipts(self.key, keys) if keys else {}
        messages: list[Message] = []
        suspend: dict[int, Suspension] = {}
        receipts: list[tuple[str, str, Sequence[int]]] = []
        spans: list[tuple[int, int] | None] = []
        errors: dict[int, tuple[str, str]] = {}
        with ExitStack() as stack:
            for inb in inputs:
                if inb.key and inb.key in done:
                    spans.append(None)
                    continue
                start = len(messages)
                for message, failure in self._prepare(inb, stack):
                    if failure is not None:
                        suspend[len(messages)] = failure
                        errors.setdefault(
                            start, (str((failure.report or {}).get("code", "")), failure.error)
                        )
                    messages.append(message)
                if inb.key:
                    receipts.append((self.key, inb.key, range(start, len(messages))))
                spans.append((start, len(messages)))
            routed = (
                box.publish(
                    messages,
                    trusted=True,
                    policy=self.policy,
                    suspend=suspend,
                    receipts=receipts,
                )
                if messages or receipts
                else []
            )
        results: list[Submitted] = []
        for inb, span in zip(inputs, spans, strict=True):
            if span is None:
                results.append(Submitted(tuple(done[inb.key or ""]), duplicate=True))
                self.stats.add(inputs=1, duplicates=1)
                continue
            a, b = span
            failed = [i for i in range(a, b) if i in suspend]
            code: str | None = None
            error: str | None = None
            if failed:
                code, error = errors[a]
            results.append(
                Submitted(
                    tuple(r.message_id for r in routed[a:b]),
                    suspended=bool(failed),
                    code=code,
                    error=error,
                )
            )
            self.stats.add(inputs=1, published=b - a - len(failed), suspended=len(failed))
            if failed:
                log.warning(
                    "%s: suspended %s: %s",
                    self.key,
                    inb.name,
                    error,
                    extra={
                        "event": "receive-suspended",
                        "location": self.key,
                        "input": inb.name,
                        "error": error,
                    },
                )
        return results

    def _transport(self, inb: Inbound) -> tuple[dict[str, object], dict[str, object]]:
        promoted: dict[str, object] = {
            "messagebox.ReceivePortName": self.port.name,
            "messagebox.ReceiveLocationName": self.name,
            "messagebox.InboundTransportType": self.adapter.transport_type,
        }
        written: dict[str, object] = {}
        _put(promoted, written, "messagebox.InboundTransportLocation", self.url)
        for name, value in inb.properties.items():
            _put(promoted, written, name, value)
        return promoted, written

    def _prepare(self, inb: Inbound, stack: ExitStack) -> list[tuple[Message, Suspension | None]]:
        promoted, written = self._transport(inb)
        if inb.size > self.max_bytes:
            stream = stack.enter_context(inb.open())  # stored as it is read, never whole
            return [
                self._failed(
                    stream,
                    promoted,
                    written,
                    inb,
                    PipelineError(
                        f"{inb.size} bytes; at most {self.max_bytes} are run through the "
                        "pipeline (max_bytes)",
                        code="too-large",
                        component=self.key,
                    ),
                )
            ]
        data, read_error = self._read(inb)
        if read_error is not None:
            return [self._failed(data, promoted, written, inb, read_error)]
        ctx = PipelineContext(port=self.port.name, location=self.url, properties=inb.properties)
        first = PipelineMessage(data, promoted=dict(promoted), written=dict(written))
        try:
            if not self.recoverable:
                return [(self._message(o), None) for o in self.pipeline.run(first, ctx)]
            out: list[tuple[Message, Suspension | None]] = []
            for part, made in self.pipeline.run_each(first, ctx):
                if isinstance(made, PipelineError):
                    out.append(self._failed(part.body, promoted, written, inb, made, part))
                    continue
                try:
                    out.extend((self._message(o), None) for o in made)
                except PipelineError as exc:
                    out.append(self._failed(part.body, promoted, written, inb, exc, part))
            return out
        except PipelineError as exc:
            return [self._failed(data, promoted, written, inb, exc)]

    def _read(self, inb: Inbound) -> tuple[bytes, PipelineError | None]:
        buf = io.BytesIO()
        try:
            with inb.open() as f:
                while chunk := f.read(READ_CHUNK):
                    buf.write(chunk)
                    if buf.tell() > self.max_bytes:
                        return buf.getvalue(), PipelineError(
                            f"grew past {self.max_bytes} bytes while it was read",
                            code="too-large",
                            component=self.key,
                        )
        except OSError as exc:
            return buf.getvalue(), PipelineError(
                f"{inb.name} could not be read after {buf.tell()} bytes: {exc}",
                code="read-failed",
                component=self.key,
            )
        return buf.getvalue(), None

    @staticmethod
    def _message(out: PipelineMessage) -> Message:
        try:
            return Message(out.body, promoted=out.promoted, written=out.written)
        except MessageValidationError as exc:
            raise PipelineError(str(exc), code="bad-property", component="promotion") from exc

    def _failed(
        self,
        body: bytes | IO[bytes],
        promoted: dict[str, object],
        written: dict[str, object],
        inb: Inbound,
        error: PipelineError,
        part: PipelineMessage | None = None,
    ) -> tuple[Message, Suspension]:
        promoted = dict(promoted)
        written = dict(written)
        kind = part.message_type if part is not None else None
        if kind:
            promoted[MESSAGE_TYPE] = kind
        if self.port.route_failed:
            promoted.update(
                {
                    "ErrorReport.ErrorType": "FailedMessage",
                    "ErrorReport.FailureCode": error.code,
                    "ErrorReport.ReceivePortName": self.port.name,
                    "ErrorReport.FailureTime": clock.local_now(),
                    "ErrorReport.ProcessingServer": socket.gethostname()[:MAX_PROMOTED],
                }
            )
            _put(promoted, written, "ErrorReport.InboundTransportLocation", self.url)
            if kind:
                promoted["ErrorReport.MessageType"] = kind
            written["ErrorReport.Description"] = str(error)
        report = {
            "code": error.code,
            "component": error.component,
            "port": self.port.name,
            "location": self.url,
            "input": inb.name,
            "size": inb.size,
        }
        return (
            Message(body, promoted=promoted, written=written),
            Suspension(
                RECEIVE_FAILURE, f"{error.code}: {error}", report, route=self.port.route_failed
            ),
        )

    def __repr__(self) -> str:
        return f"ReceiveLocation({self.key!r}, {self.url!r})"


_RUNNING: list[ReceiveLocation] = []
"""The receive locations started in this process (:func:`running_location`)."""
_RUNNING_LOCK = threading.Lock()


def running_location(box: MessageBox, port: str, name: str) -> ReceiveLocation | None:
    """Receive location ``port/name`` if one is running in this process on ``box``'s
    store (a command served by a ``host run`` process finds its locations so)."""
    with _RUNNING_LOCK:
        for loc in _RUNNING:
            if (
                loc.port.name == port
                and loc.name == name
                and loc._box is not None
                and loc._box.store.key == box.store.key
            ):
                return loc
    return None


class ReceivePort:
    """A named group of receive locations; ``route_failed`` also routes refused inputs
    as error reports."""

    def __init__(self, name: str, *, route_failed: bool = False) -> None:
        if not name:
            raise ValidationError("a receive port needs a name")
        self.name = name
        self.route_failed = route_failed
        self.locations: list[ReceiveLocation] = []

    def location(
        self, name: str, url: str, *, pipeline: ReceivePipeline | None = None, **options: Any
    ) -> ReceiveLocation:
        """Add a receive location (options: ``max_bytes``, ``recoverable``, ``policy``,
        and the adapter's own)."""
        if any(loc.name == name for loc in self.locations):
            raise ValidationError(f"receive port {self.name!r} has a location {name!r} already")
        loc = ReceiveLocation(name, url, port=self, pipeline=pipeline, **options)
        self.locations.append(loc)
        return loc


@dataclass(frozen=True)
class Transport:
    """An adapter URL with its retry policy and adapter options."""

    url: str
    retry_count: int = 3
    retry_interval: float = 60.0
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, spec: Transport | str, retry_count: int, retry_interval: float) -> Transport:
        if isinstance(spec, Transport):
            return spec
        return cls(spec, retry_count, retry_interval)


class SendPort:
    """A service that sends what its subscription matches through a transport."""

    def __init__(
        self,
        name: str,
        *,
        transport: Transport | str,
        filter: object = None,
        pipeline: SendPipeline | None = None,
        retry_count: int = 3,
        retry_interval: float = 60.0,
        backup: Transport | str | None = None,
        ordered: bool = False,
        stop_on_failure: bool = False,
        priority: int = 0,
        ordered_by: str | None = None,
    ) -> None:
        if not name:
            raise ValidationError("a send port needs a name")
        if pipeline is not None and not isinstance(pipeline, SendPipeline):
            raise ValidationError(
                f"send port {name!r}: pipeline must be a SendPipeline, "
                f"not {type(pipeline).__name__}"
            )
        self.name = name
        self.filter: Filter | None = None if filter is None else to_filter(filter)
        self.primary = Transport.of(transport, retry_count, retry_interval)
        self.backup = None if backup is None else Transport.of(backup, retry_count, retry_interval)
        for t in (self.primary, self.backup):
            if t is not None and (t.retry_count < 0 or t.retry_interval < 0):
                raise ValidationError(
                    f"send port {name!r}: retry_count and retry_interval must not be negative"
                )
        self.pipeline = pipeline or PASS_THRU_SEND
        self.ordered = ordered
        self.ordered_by = ordered_by
        self.stop_on_failure = stop_on_failure
        self.priority = priority
        self.adapters = {"primary": send_adapter(self.primary.url, **dict(self.primary.options))}
        if self.backup is not None:
            self.adapters["backup"] = send_adapter(self.backup.url, **dict(self.backup.options))
        self.stats = PortStats()

    def _which(self, attempt: int) -> tuple[str, Transport, int]:
        """The transport for delivery ``attempt`` and the attempt number on it."""
        tries = self.primary.retry_count + 1
        if attempt <= tries or self.backup is None:
            return "primary", self.primary, attempt
        return "backup", self.backup, attempt - tries

    def handle(self, delivery: Delivery) -> None:
        stored = delivery.message
        message = PipelineMessage(
            stored.body,
            message_type=str(stored.promoted.get(MESSAGE_TYPE) or "") or None,
            promoted=dict(stored.promoted),
            written=dict(stored.written),
        )
        ctx = PipelineContext(port=self.name, location=self.primary.url)
        try:
            out = self.pipeline.assemble(message, ctx)
        except PipelineError as exc:
            self.stats.add(suspended=1)
            raise PermanentFailure(f"send port {self.name!r}: send pipeline: {exc}") from exc
        which, transport, n = self._which(delivery.attempt)
        outbound = Outbound(
            message_id=delivery.message_id,
            port=self.name,
            message_type=message.message_type,
            properties={**stored.written, **stored.promoted},
            attempt=delivery.attempt,
        )
        try:
            where = self.adapters[which].send(out.body, outbound)
        except Exception as exc:
            text = f"send port {self.name!r}: {which} transport {transport.url}: {exc}"
            if n <= transport.retry_count:
                self.stats.add(retried=1)
                raise RetryLater(
                    f"{text} (retry {n} of {transport.retry_count})",
                    delay=transport.retry_interval,
                ) from exc
            if which == "primary" and self.backup is not None:
                self.stats.add(retried=1)
                raise RetryLater(f"{text}; retries used up, trying the backup", delay=0) from exc
            self.stats.add(suspended=1)
            raise PermanentFailure(
                f"{text}; failed {n} times"
                + (" after the primary transport's retries" if which == "backup" else "")
            ) from exc
        self.stats.add(**{"sent_backup" if which == "backup" else "sent": 1})
        log.debug("send port %s: %s -> %s", self.name, delivery.message_id, where)

    def flush(self) -> None:
        """Make this thread's sends durable (called before its batch is completed)."""
        errors = []
        for which, adapter in self.adapters.items():
            try:
                adapter.flush()
            except Exception as exc:
                errors.append(f"{which} transport {adapter.url}: {exc}")
        if errors:
            raise OSError(f"send port {self.name!r}: " + "; ".join(errors))

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()

    def __repr__(self) -> str:
        return f"SendPort({self.name!r}, {self.primary.url!r})"


class SendPortGroup:
    """One filter, fanned out to several send ports."""

    def __init__(self, name: str, *, filter: object, ports: Sequence[str]) -> None:
        if not ports:
            raise ValidationError(f"send port group {name!r} needs at least one port")
        self.name = name
        self.filter = to_filter(filter)
        self.ports = list(ports)


def port_filter(port: SendPort, groups: Sequence[SendPortGroup]) -> Filter | None:
    """A port's own filter OR'ed with the filters of the groups it belongs to."""
    groups_of = [g.filter for g in groups if port.name in g.ports]
    parts = ([port.filter] if port.filter is not None else []) + groups_of
    if not parts:
        return None
    return Filter(groups=tuple(grp for f in parts for grp in f.groups))
