"""The contract between transports and ports.

A **receive adapter** takes input in (a file, an HTTP request) and hands it to its
receive location as :class:`Inbound` items through a :class:`Sink`; it must not let go
of an input (delete a file, answer a request) until :meth:`Sink.submit` has returned,
which means the publish committed. If ``submit`` raises, nothing was stored and the
adapter keeps the input for a later try.

A **send adapter** transmits one message's bytes; raising means it was not sent (the
send port retries it, then uses its backup transport).
"""

from __future__ import annotations

import io
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from messagebox.engine import MessageBox


@dataclass
class Inbound:
    """One input (an interchange): a file, a request body."""

    open: Callable[[], IO[bytes]]
    """Opens the input's bytes for reading (may be called more than once)."""
    size: int
    key: str | None = None
    """The receipt key: an input with a key is published at most once."""
    properties: dict[str, object] = field(default_factory=dict)
    """Transport properties for the context (``messagebox.ReceivedFileName``, …)."""
    name: str = ""
    """How to name it in logs and errors (the file name)."""

    @classmethod
    def of_bytes(cls, data: bytes, **kwargs: object) -> Inbound:
        return cls(lambda: io.BytesIO(data), len(data), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Submitted:
    """What a receive location did with one input."""

    message_ids: tuple[uuid.UUID, ...] = ()
    """The messages published (or, when suspended, the suspended message)."""
    suspended: bool = False
    code: str | None = None
    error: str | None = None
    duplicate: bool = False
    """Its receipt was recorded before: it had been published already; nothing was."""


class Sink(Protocol):
    """What a receive adapter hands its inputs to (its receive location)."""

    max_bytes: int
    """Inputs larger than this are not parsed: they are suspended as ``too-large``."""

    def submit(self, inputs: list[Inbound]) -> list[Submitted]:
        """Run the pipeline and publish, in one transaction; raises if nothing was stored."""
        ...


class ReceiveAdapter(ABC):
    """A transport that takes messages in. Options come from the URL's query and from
    keyword arguments (which win)."""

    schemes: ClassVar[tuple[str, ...]] = ()
    transport_type: ClassVar[str] = ""

    def __init__(self, url: str, **options: object) -> None:
        self.url = url
        self.options = options

    @abstractmethod
    def start(self, box: MessageBox, owner: str, sink: Sink) -> None:
        """Start taking input on the adapter's own threads; return at once."""

    @abstractmethod
    def stop(self, timeout: float) -> None:
        """Stop taking input; return once in-flight inputs are submitted or given back."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


@dataclass(frozen=True)
class Outbound:
    """The message a send adapter transmits, beside its bytes."""

    message_id: uuid.UUID
    port: str
    message_type: str | None
    properties: Mapping[str, object]
    attempt: int = 1


class SendAdapter(ABC):
    """A transport that sends messages out; one instance serves every thread."""

    schemes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str, **options: object) -> None:
        self.url = url
        self.options = options

    @abstractmethod
    def send(self, body: bytes, message: Outbound) -> str:
        """Transmit ``body``; return where it went (a path, a URL and status)."""

    def flush(self) -> None:  # noqa: B027 - optional hook; most adapters send at once
        """Make durable what this thread sent since its last flush, or raise. A host
        instance calls it once per claimed batch, before the batch's deliveries are
        recorded as complete (so an adapter may group its syncs)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most adapters hold nothing
        """Release connections and files."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def parse_options(
    url: str, known: Mapping[str, object], given: Mapping[str, object], *, query: str = ""
) -> dict[str, object]:
    """Options from ``query`` (the URL's) and ``given`` (keyword arguments, which win),
    typed like their defaults in ``known``; an unknown option is refused by name."""
    from urllib.parse import parse_qsl

    from messagebox.errors import ValidationError

    raw: dict[str, object] = dict(parse_qsl(query, keep_blank_values=True))
    raw.update(given)
    out = dict(known)
    for name, value in raw.items():
        if name not in known:
            raise ValidationError(
                f"{url}: unknown option {name!r}; known: {', '.join(sorted(known))}"
            )
        default = known[name]
        try:
            if isinstance(default, bool):
                if isinstance(value, str):
                    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(value)
                    value = value.lower() in ("true", "1", "yes")
                out[name] = bool(value)
            elif isinstance(default, int):
                out[name] = int(value)  # type: ignore[call-overload]
            elif isinstance(default, float):
                out[name] = float(value)  # type: ignore[arg-type]
            else:
                out[name] = value
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                f"{url}: option {name}={value!r} is not a {type(default).__name__}"
            ) from exc
    return out
