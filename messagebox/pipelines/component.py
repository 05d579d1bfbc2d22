"""Pipeline components and pipelines: the contract every stage follows.

A :class:`Component` takes one :class:`PipelineMessage` and yields zero or more:
a disassembler splits an interchange into messages, a validator or a promoter yields
the message it was given, an assembler yields the bytes to send. A :class:`Pipeline`
is a list of components; each message one component yields goes through the next, in
order. A component refuses a message by raising :class:`PipelineError` (through
:meth:`Component.fail`) with a short code; the receive location then suspends the
whole input with that error and its original bytes.

Components keep no per-message state and may be called from several threads at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from messagebox.errors import PipelineError, ValidationError

MESSAGE_TYPE = "messagebox.MessageType"
"""The promoted property a disassembler sets: ``namespace#root`` for XML."""


@dataclass
class PipelineMessage:
    """A message on its way through a pipeline."""

    body: bytes
    message_type: str | None = None
    promoted: dict[str, object] = field(default_factory=dict)
    written: dict[str, object] = field(default_factory=dict)
    format: str | None = None
    """``"xml"`` or ``"json"`` once a disassembler has parsed it."""
    document: Any = None
    """The parsed body (an lxml element or a JSON value), kept for later components."""

    def derive(self, body: bytes, **changes: Any) -> PipelineMessage:
        """A copy with a new body (and other changes); the context is copied."""
        fields: dict[str, Any] = {
            "message_type": self.message_type,
            "promoted": dict(self.promoted),
            "written": dict(self.written),
            "format": self.format,
            "document": None,
        }
        fields.update(changes)
        return PipelineMessage(body=body, **fields)


@dataclass(frozen=True)
class PipelineContext:
    """Where the input came from (receive) or where the output goes (send)."""

    port: str = ""
    location: str = ""
    properties: Mapping[str, object] = field(default_factory=dict)


class Component:
    """A pipeline stage. Subclasses implement :meth:`process`."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        """Yield the message(s) this stage makes of ``message``; raise through
        :meth:`fail` to refuse it."""
        raise NotImplementedError

    def fail(self, code: str, text: str) -> NoReturn:
        """Refuse the message: ``code`` is a short stable word, ``text`` says why."""
        raise PipelineError(text, code=code, component=self.name)

    def __repr__(self) -> str:
        return f"{self.name}()"


class Pipeline:
    """Components run in order; a component's outputs each go through the next."""

    def __init__(self, components: Sequence[Component] = ()) -> None:
        for c in components:
            if not isinstance(c, Component):
                raise ValidationError(
                    f"a pipeline takes Component instances; got {type(c).__name__}"
                )
        self.components = list(components)

    def run(self, message: PipelineMessage, context: PipelineContext) -> list[PipelineMessage]:
        """Every message the pipeline makes of ``message``."""
        return list(self._run(0, message, context))

    def run_each(
        self, message: PipelineMessage, context: PipelineContext
    ) -> list[tuple[PipelineMessage, list[PipelineMessage] | PipelineError]]:
        """Recoverable interchange processing: the first component splits ``message``;
        each part then goes through the rest on its own. Returns each part with its
        messages, or with the error that refused it. An error in the first component
        refuses the whole interchange (raised)."""
        if not self.components:
            return [(message, [message])]
        out: list[tuple[PipelineMessage, list[PipelineMessage] | PipelineError]] = []
        for part in list(self._run_stage(0, message, context)):
            try:
                out.append((part, list(self._run(1, part, context))))
            except PipelineError as exc:
                out.append((part, exc))
        return out

    def _run_stage(
        self, stage: int, message: PipelineMessage, context: PipelineContext
    ) -> Iterator[PipelineMessage]:
        component = self.components[stage]
        try:
            yield from component.process(message, context)
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(
                f"failed: {type(exc).__name__}: {exc}",
                code="component-error",
                component=component.name,
            ) from exc

    def _run(
        self, stage: int, message: PipelineMessage, context: PipelineContext
    ) -> Iterator[PipelineMessage]:
        if stage == len(self.components):
            yield message
            return
        for out in list(self._run_stage(stage, message, context)):
            yield from self._run(stage + 1, out, context)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.components!r})"


class ReceivePipeline(Pipeline):
    """Decode, disassemble, validate, promote: bytes in, messages to publish out."""


class SendPipeline(Pipeline):
    """Assemble: one routed message in, the bytes to transmit out."""

    def assemble(self, message: PipelineMessage, context: PipelineContext) -> PipelineMessage:
        """The one message to transmit."""
        out = self.run(message, context)
        if len(out) != 1:
            raise PipelineError(
                f"a send pipeline must make exactly one message; it made {len(out)}",
                code="component-error",
                component=type(self).__name__,
            )
        return out[0]


PASS_THRU_RECEIVE = ReceivePipeline()
"""Publishes the body as it came, with the transport's properties only."""
PASS_THRU_SEND = SendPipeline()
"""Transmits the body as it was stored."""
