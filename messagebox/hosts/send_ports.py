"""Send ports and send port groups (see :mod:`messagebox.hosts.ports`): a send port is a
service with a filter subscription, a send pipeline and a transport; a failed
transmission is retried ``retry_count`` times, ``retry_interval`` seconds apart, then
through the backup transport (if any), then the message is suspended (resumable). A
send port group sends what its filter matches through each of its ports."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from messagebox.adapters import Outbound, send_adapter
from messagebox.errors import PermanentFailure, PipelineError, RetryLater, ValidationError
from messagebox.hosts.dispatch import Counters
from messagebox.pipelines import (
    MESSAGE_TYPE,
    PASS_THRU_SEND,
    PipelineContext,
    PipelineMessage,
    SendPipeline,
)
from messagebox.predicates import to_filter
from messagebox.predicates.model import Filter

if TYPE_CHECKING:
    from messagebox.hosts.service import Delivery

log = logging.getLogger("messagebox.ports")


@dataclass
class PortStats(Counters):
    """What a send port sent."""

    sent: int = 0
    sent_backup: int = 0
    retried: int = 0
    suspended: int = 0


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
