"""JSON pipeline components: disassemble, validate against JSON Schema, assemble.

JSON carries no type of its own, so the disassembler is told the message type
(``message_type=``), or where to read it in each message (``type_path=``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

from messagebox.errors import ValidationError
from messagebox.pipelines.component import MESSAGE_TYPE, Component, PipelineContext, PipelineMessage
from messagebox.pipelines.jsonpath import JsonPath


def parse(body: bytes, component: Component) -> Any:
    """The JSON value, or the component refuses the message as malformed."""
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        component.fail("malformed", f"malformed JSON: {exc}")
    except (UnicodeDecodeError, ValueError) as exc:
        component.fail("malformed", f"malformed JSON: {exc}")


def dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class JsonDisassembler(Component):
    """Parse JSON, set the message type, and split batches into messages.

    A top-level array is a batch: each element is a message. ``split`` (a JSON path,
    e.g. ``$.orders``) names the array inside an envelope object instead. A single
    message keeps its bytes as they came; split ones are re-serialized compactly.
    """

    def __init__(
        self,
        message_type: str | None = None,
        *,
        type_path: str | None = None,
        split: str | None = None,
    ) -> None:
        if (message_type is None) == (type_path is None):
            raise ValidationError("JsonDisassembler needs one of message_type= or type_path=")
        self.message_type = message_type
        self.type_path = JsonPath(type_path) if type_path else None
        self.split = JsonPath(split) if split else None

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        doc = parse(message.body, self)
        if self.split is not None:
            records = self.split.find(doc)
            if not isinstance(records, list):
                self.fail("malformed", f"{self.split.path} is not an array in the envelope")
        elif isinstance(doc, list):
            records = doc
        else:
            yield self._one(message, message.body, doc)
            return
        for record in records:
            yield self._one(message, dump(record), record)

    def _one(self, message: PipelineMessage, body: bytes, doc: Any) -> PipelineMessage:
        kind = self.message_type
        if self.type_path is not None:
            found = self.type_path.find(doc)
            if not isinstance(found, str) or not found:
                self.fail(
                    "unknown-type",
                    f"{self.type_path.path} gives no message type (found {found!r})"
                    if found is not JsonPath.MISSING
                    else f"{self.type_path.path} gives no message type (absent)",
                )
            kind = found
        out = message.derive(body, message_type=kind, format="json", document=doc)
        out.promoted[MESSAGE_TYPE] = kind
        return out


class JsonValidator(Component):
    """Validate JSON messages against a JSON Schema per message type.

    ``strict=True`` refuses a message of a type not listed (``unknown-type``).
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]], *, strict: bool = False) -> None:
        self.validators: dict[str, Any] = {}
        for kind, schema in schemas.items():
            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ValidationError(f"JSON Schema for {kind!r}: {exc.message}") from exc
            self.validators[kind] = cls(schema, format_checker=cls.FORMAT_CHECKER)
        self.strict = strict

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        doc = (
            message.document
            if message.format == "json" and message.document is not None
            else parse(message.body, self)
        )
        validator = self.validators.get(message.message_type or "")
        if validator is None:
            if self.strict:
                self.fail(
                    "unknown-type", f"no JSON Schema for message type {message.message_type!r}"
                )
            yield message
            return
        error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
        if error is not None:
            where = "$" + "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
            )
            self.fail(
                "invalid",
                f"message type {message.message_type!r} does not match its JSON Schema at "
                f"{where}: {error.message}",
            )
        yield message


class JsonAssembler(Component):
    """Serialize a JSON message for sending, optionally inside an envelope object
    (``{envelope: message}``); without one the body is sent as stored."""

    def __init__(self, envelope: str | None = None, *, indent: int | None = None) -> None:
        self.envelope = envelope
        self.indent = indent

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        if self.envelope is None and self.indent is None:
            yield message
            return
        doc = parse(message.body, self)
        if self.envelope is not None:
            doc = {self.envelope: doc}
        body = json.dumps(doc, ensure_ascii=False, indent=self.indent).encode("utf-8")
        yield message.derive(body, format="json", document=doc)
