"""XML pipeline components (lxml): disassemble, validate against XSD, assemble.

Parsing is hardened: no DTD loading, no entity expansion, no network access (XXE and
"billion laughs" inputs are refused as malformed, not expanded).

The message type of an XML message is ``namespace#root`` (``root`` when the root
element has no namespace), as BizTalk writes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from lxml import etree

from messagebox.errors import ValidationError
from messagebox.pipelines.component import MESSAGE_TYPE, Component, PipelineContext, PipelineMessage


def xml_parser() -> etree.XMLParser:
    """A parser that loads no DTD, expands no entity and touches no network."""
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


def compile_xpath(path: str, namespaces: Mapping[str, str], where: str) -> etree.XPath:
    """A compiled XPath, refused now (not per message) if it cannot be evaluated:
    libxml2 compiles undeclared prefixes and unknown functions, so it is tried once."""
    try:
        xpath = etree.XPath(path, namespaces=dict(namespaces))
        xpath(etree.Element("_"))
    except etree.XPathError as exc:
        raise ValidationError(f"{where}: bad XPath {path!r}: {exc}") from exc
    return xpath


def message_type(element: etree._Element) -> str:
    """``namespace#root`` of an element."""
    q = etree.QName(element)
    return f"{q.namespace}#{q.localname}" if q.namespace else q.localname


def _clark(name: str) -> str:
    """``ns#root`` or ``{ns}root`` as Clark notation."""
    if "#" in name and not name.startswith("{"):
        ns, _, local = name.rpartition("#")
        return f"{{{ns}}}{local}" if ns else local
    return name


def parse(body: bytes, component: Component) -> etree._Element:
    """The root element, or the component refuses the message as malformed."""
    try:
        root = etree.fromstring(body, xml_parser())
    except etree.XMLSyntaxError as exc:
        component.fail("malformed", f"malformed XML: {exc}")
    if root is None:  # pragma: no cover - fromstring raises instead
        component.fail("malformed", "malformed XML: no root element")
    for node in root.iter():
        if isinstance(node, etree._Entity):
            component.fail("malformed", "malformed XML: entity references are not allowed")
    return root


class XmlDisassembler(Component):
    """Parse XML, set the message type, and split envelopes into their records.

    ``envelopes`` maps an envelope's message type (``ns#root``) to the XPath of its
    records (``None``: every child element of the root). A document of any other type
    is one message. An envelope with no record makes no message.
    """

    def __init__(
        self,
        envelopes: Mapping[str, str | None] | None = None,
        *,
        namespaces: Mapping[str, str] | None = None,
    ) -> None:
        self.namespaces = dict(namespaces or {})
        self.envelopes: dict[str, etree.XPath | None] = {}
        for env, path in (envelopes or {}).items():
            self.envelopes[env] = (
                None
                if path is None
                else compile_xpath(path, self.namespaces, f"envelope {env!r}: records")
            )

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        root = parse(message.body, self)
        kind = message_type(root)
        if kind not in self.envelopes:
            yield self._one(message, message.body, root)
            return
        path = self.envelopes[kind]
        records = [c for c in root if isinstance(c.tag, str)] if path is None else path(root)
        if not isinstance(records, list) or not all(isinstance(r, etree._Element) for r in records):
            self.fail("malformed", f"envelope {kind!r}: the record XPath must select elements")
        for record in records:
            body = etree.tostring(record, with_tail=False, encoding="utf-8", xml_declaration=True)
            yield self._one(message, body, etree.fromstring(body, xml_parser()))

    @staticmethod
    def _one(message: PipelineMessage, body: bytes, root: etree._Element) -> PipelineMessage:
        kind = message_type(root)
        out = message.derive(body, message_type=kind, format="xml", document=root)
        out.promoted[MESSAGE_TYPE] = kind
        return out

    def __repr__(self) -> str:
        return f"XmlDisassembler(envelopes={sorted(self.envelopes)})"


class XmlValidator(Component):
    """Validate XML messages against an XSD per message type.

    ``schemas`` maps a message type to an XSD (a path, the XSD's bytes, or an
    ``lxml.etree.XMLSchema``). With ``strict=True`` a message of a type not listed is
    refused (``unknown-type``); otherwise it passes.
    """

    def __init__(
        self, schemas: Mapping[str, str | Path | bytes | etree.XMLSchema], *, strict: bool = False
    ) -> None:
        self.schemas: dict[str, etree.XMLSchema] = {}
        for kind, xsd in schemas.items():
            try:
                if isinstance(xsd, etree.XMLSchema):
                    self.schemas[kind] = xsd
                elif isinstance(xsd, bytes):
                    self.schemas[kind] = etree.XMLSchema(etree.fromstring(xsd, xml_parser()))
                else:
                    self.schemas[kind] = etree.XMLSchema(etree.parse(str(xsd), xml_parser()))
            except (etree.XMLSchemaParseError, etree.XMLSyntaxError, OSError) as exc:
                raise ValidationError(f"XSD for message type {kind!r}: {exc}") from exc
        self.strict = strict

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        root = message.document
        if message.format != "xml" or root is None:
            root = parse(message.body, self)
        kind = message.message_type or message_type(root)
        schema = self.schemas.get(kind)
        if schema is None:
            if self.strict:
                self.fail("unknown-type", f"no XSD for message type {kind!r}")
            yield message
            return
        if not schema.validate(root):
            errors = schema.error_log
            first = errors[0] if len(errors) else None
            where = f"line {first.line}: " if first is not None else ""
            text = first.message if first is not None else "invalid"
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            self.fail(
                "invalid", f"message type {kind!r} does not match its XSD: {where}{text}{more}"
            )
        yield message


class XmlAssembler(Component):
    """Serialize an XML message for sending, optionally inside an envelope element.

    ``envelope`` is the envelope root (``ns#root`` or ``{ns}root``); without one the
    body is sent as stored.
    """

    def __init__(self, envelope: str | None = None, *, encoding: str = "utf-8") -> None:
        self.envelope = _clark(envelope) if envelope else None
        self.encoding = encoding

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        if self.envelope is None:
            yield message
            return
        root = parse(message.body, self)
        env = etree.Element(self.envelope)
        env.append(root)
        body = etree.tostring(env, encoding=self.encoding, xml_declaration=True)
        yield message.derive(body, format="xml", document=env)
