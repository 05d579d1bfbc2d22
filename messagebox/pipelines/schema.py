"""Property schemas: which typed properties a message type promotes, and from where.

    orders = PropertySchema(
        "urn:orders#Order",
        {
            "orders.Region": "/o:Order/o:Region",                  # str by default
            "orders.Total": Field("/o:Order/o:Total", float),
            "orders.Rush": Field("/o:Order/@rush", bool, required=False),
            "orders.Note": Field("/o:Order/o:Note", str, promote=False),  # written only
        },
        namespaces={"o": "urn:orders"},
    )

A path is an XPath for XML message types and a JSONPath (the subset of
:mod:`messagebox.pipelines.jsonpath`) for JSON ones: the parsed document decides which. A path must
select exactly one value. Types: ``str``, ``int``, ``float``, ``Decimal``, ``bool``
(``true``/``false``/``1``/``0``) and ``datetime`` (ISO 8601 with a timezone). The
:class:`Promote` component applies the schemas to each message by its message type.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from lxml import etree

from messagebox.errors import ValidationError
from messagebox.pipelines.component import Component, PipelineContext, PipelineMessage
from messagebox.pipelines.jsonpath import JsonPath
from messagebox.pipelines.xml import compile_xpath, xml_parser
from messagebox.properties import canonical_name, is_reserved, normalize_value

TYPES: dict[type, str] = {
    str: "str",
    int: "int",
    float: "float",
    Decimal: "Decimal",
    bool: "bool",
    datetime: "datetime",
}

_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


class ConversionError(ValueError):
    pass


def convert(value: object, to: type) -> object:
    """``value`` (XML text or a JSON value) as the declared type, or ConversionError."""
    if isinstance(value, dict | list) or value is None:
        kind = "null" if value is None else type(value).__name__
        raise ConversionError(f"is a JSON {kind}, not a {TYPES[to]}")
    text = value if isinstance(value, str) else None
    if to is str:
        return text if text is not None else json.dumps(value)
    if to is bool:
        if isinstance(value, bool):
            return value
        if type(value) is int and value in (0, 1):
            return bool(value)
        word = (text or "").strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ConversionError(f"{value!r} is not a bool (true, false, 1 or 0)")
    if isinstance(value, bool):
        raise ConversionError(f"{value!r} is a bool, not a {TYPES[to]}")
    try:
        if to is int:
            if isinstance(value, int):
                return value
            if isinstance(value, float):
                if value.is_integer():
                    return int(value)
                raise ConversionError(f"{value!r} is not an integer")
            return int(str(text).strip())
        if to is float:
            return float(value) if isinstance(value, int | float) else float(str(text).strip())
        if to is Decimal:
            return Decimal(str(value).strip())
        if to is datetime:
            if text is None:
                raise ConversionError(f"{value!r} is not an ISO 8601 datetime")
            stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
            if stamp.tzinfo is None:
                raise ConversionError(f"{text!r} has no timezone")
            return stamp
    except (ValueError, InvalidOperation) as exc:
        if isinstance(exc, ConversionError):
            raise
        raise ConversionError(f"{value!r} is not a {TYPES[to]}") from exc
    raise ConversionError(f"unsupported type {to!r}")  # pragma: no cover


@dataclass(frozen=True)
class Field:
    """Where a property's value is and what type it has."""

    path: str
    type: type = str
    required: bool = True
    """A message without it is refused (``missing-property``); else it is left out."""
    promote: bool = True
    """Promoted (routable); False: written into the context only."""


class PropertySchema:
    """The properties one message type promotes."""

    def __init__(
        self,
        message_type: str,
        properties: Mapping[str, Field | str | tuple[str, type]],
        *,
        namespaces: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(message_type, str) or not message_type:
            raise ValidationError("a property schema needs a message type")
        self.message_type = message_type
        self.namespaces = dict(namespaces or {})
        self.fields: dict[str, Field] = {}
        self._xpath: dict[str, etree.XPath] = {}
        self._jsonpath: dict[str, JsonPath] = {}
        for name, spec in properties.items():
            where = f"property schema {message_type!r}, property {name!r}"
            try:
                canon = canonical_name(name)
            except ValueError as exc:
                raise ValidationError(f"{where}: {exc}") from exc
            if is_reserved(canon):
                raise ValidationError(
                    f"{where}: the messagebox. namespace is the engine's; pick your own"
                )
            f = (
                spec
                if isinstance(spec, Field)
                else Field(spec)
                if isinstance(spec, str)
                else Field(spec[0], spec[1])
            )
            if f.type not in TYPES:
                raise ValidationError(
                    f"{where}: type {f.type!r} is not one of {', '.join(TYPES.values())}"
                )
            if f.path.startswith("$"):
                self._jsonpath[canon] = JsonPath(f.path)
            else:
                self._xpath[canon] = compile_xpath(f.path, self.namespaces, where)
            self.fields[canon] = f

    def extract(self, message: PipelineMessage) -> tuple[dict[str, object], dict[str, object]]:
        """The (promoted, written) values of ``message``; raises
        :class:`PromotionError` (with a code) for a missing or bad value."""
        promoted: dict[str, object] = {}
        written: dict[str, object] = {}
        for name, f in self.fields.items():
            raw = self._find(name, f, message)
            if raw is JsonPath.MISSING:
                if f.required:
                    raise PromotionError(
                        "missing-property", f"{name}: {f.path} selects nothing in the message"
                    )
                continue
            try:
                value = convert(raw, f.type)
                value = normalize_value(value, promoted=f.promote)
            except ValueError as exc:
                raise PromotionError("bad-property", f"{name} ({f.path}): {exc}") from exc
            (promoted if f.promote else written)[name] = value
        return promoted, written

    def _find(self, name: str, f: Field, message: PipelineMessage) -> object:
        doc = message.document
        if doc is None and message.format == "json":
            doc = message.document = json.loads(message.body)
        elif doc is None and message.format == "xml":
            doc = message.document = etree.fromstring(message.body, xml_parser())
        if message.format == "json":
            if name not in self._jsonpath:
                raise PromotionError("bad-property", f"{name}: {f.path!r} is not a JSON path")
            return self._jsonpath[name].find(doc)
        if message.format == "xml":
            if name not in self._xpath:
                raise PromotionError("bad-property", f"{name}: {f.path!r} is not an XPath")
            found = self._xpath[name](doc)
            if isinstance(found, list):
                if not found:
                    return JsonPath.MISSING
                if len(found) > 1:
                    raise PromotionError(
                        "bad-property", f"{name}: {f.path} selects {len(found)} nodes, not one"
                    )
                node = found[0]
                if isinstance(node, etree._Element):
                    return "".join(node.itertext())
                return str(node)
            if isinstance(found, str):
                return str(found)  # lxml returns a str subclass
            if isinstance(found, bool | float):
                return found
            return str(found)  # pragma: no cover
        raise PromotionError(
            "unknown-type", "the message was not parsed; put a disassembler before Promote"
        )

    def __repr__(self) -> str:
        return f"PropertySchema({self.message_type!r}, {list(self.fields)})"


class PromotionError(Exception):
    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class Promote(Component):
    """Promote (and write) properties by message type, from the property schemas.

    ``require=True`` refuses a message whose type has no schema (``unknown-type``)."""

    def __init__(self, schemas: Iterable[PropertySchema], *, require: bool = False) -> None:
        self.schemas: dict[str, list[PropertySchema]] = {}
        for s in schemas:
            if not isinstance(s, PropertySchema):
                raise ValidationError(f"Promote takes PropertySchema objects; got {s!r}")
            self.schemas.setdefault(s.message_type, []).append(s)
        self.require = require

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        schemas = self.schemas.get(message.message_type or "")
        if not schemas:
            if self.require:
                self.fail(
                    "unknown-type",
                    f"no property schema for message type {message.message_type!r} "
                    f"(known: {', '.join(sorted(self.schemas)) or 'none'})",
                )
            yield message
            return
        for schema in schemas:
            try:
                promoted, written = schema.extract(message)
            except PromotionError as exc:
                self.fail(exc.code, f"message type {message.message_type!r}: {exc.text}")
            message.promoted.update(promoted)
            message.written.update(written)
        yield message

    def __repr__(self) -> str:
        return f"Promote({sorted(self.schemas)})"
