"""Receive locations (see :mod:`messagebox.hosts.ports`): an adapter URL and a receive
pipeline; what the adapter takes in is published in one transaction with a receipt, or
stored suspended (``receive-failure``) with its original bytes when the pipeline refuses
it."""

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
from messagebox.adapters import Inbound, Submitted, receive_adapter
from messagebox.errors import (
    MessageValidationError,
    PipelineError,
    ValidationError,
)
from messagebox.hosts.dispatch import Counters
from messagebox.message import Message
from messagebox.models import RECEIVE_FAILURE, RoutingPolicy, Suspension
from messagebox.pipelines import (
    MESSAGE_TYPE,
    PASS_THRU_RECEIVE,
    PipelineContext,
    PipelineMessage,
    ReceivePipeline,
)

if TYPE_CHECKING:
    from messagebox.engine import MessageBox

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
