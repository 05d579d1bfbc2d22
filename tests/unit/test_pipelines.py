"""Receive and send pipeline components: XML and JSON disassembly, validation, assembly,
property promotion, the JSONPath subset and the pipeline runner (no database)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from messagebox.errors import PipelineError, ValidationError
from messagebox.pipelines import (
    MESSAGE_TYPE,
    Component,
    Field,
    JsonAssembler,
    JsonDisassembler,
    JsonValidator,
    PipelineContext,
    PipelineMessage,
    Promote,
    PropertySchema,
    ReceivePipeline,
    XmlAssembler,
    XmlDisassembler,
    XmlValidator,
)
from messagebox.pipelines.jsonpath import JsonPath
from messagebox.pipelines.schema import ConversionError, convert
from messagebox.properties import decode_context, encode_context

CTX = PipelineContext(port="in", location="test")

ORDER_XSD = b"""<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"
    targetNamespace="urn:orders" xmlns="urn:orders" elementFormDefault="qualified">
  <xs:element name="Order">
    <xs:complexType>
      <xs:sequence>
        <xs:element name="Total" type="xs:decimal"/>
      </xs:sequence>
    </xs:complexType>
  </xs:element>
</xs:schema>"""

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "total": {"type": "number"},
        "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
    },
    "required": ["total"],
}


def run(component: Component, body: bytes) -> list[PipelineMessage]:
    """Every message ``component`` makes of ``body``."""
    return list(component.process(PipelineMessage(body), CTX))


def refusal(component: Component, message: PipelineMessage) -> PipelineError:
    """The error ``component`` refuses ``message`` with."""
    with pytest.raises(PipelineError) as info:
        list(component.process(message, CTX))
    return info.value


def xml(body: bytes) -> PipelineMessage:
    """``body`` as the XML disassembler hands it on."""
    [message] = run(XmlDisassembler(), body)
    return message


def json_message(body: bytes, message_type: str = "t") -> PipelineMessage:
    """``body`` as the JSON disassembler hands it on."""
    [message] = run(JsonDisassembler(message_type), body)
    return message


def promote(schema: PropertySchema, message: PipelineMessage) -> PipelineMessage:
    [out] = list(Promote([schema]).process(message, CTX))
    return out


def promote_error(schema: PropertySchema, message: PipelineMessage) -> PipelineError:
    return refusal(Promote([schema]), message)


# --- XmlDisassembler: message types and single messages ---------------------------------


def test_the_xml_message_type_is_namespace_hash_root() -> None:
    # Given a document whose root element has a namespace
    body = b'<o:Order xmlns:o="urn:orders"><o:Total>5</o:Total></o:Order>'

    # When it is disassembled
    [message] = run(XmlDisassembler(), body)

    # Then its type is ns#root, set on the message and promoted
    assert message.message_type == "urn:orders#Order"
    assert message.promoted[MESSAGE_TYPE] == "urn:orders#Order"
    assert message.format == "xml"


def test_the_xml_message_type_is_the_root_name_without_a_namespace() -> None:
    [message] = run(XmlDisassembler(), b"<Order><Total>5</Total></Order>")

    assert message.message_type == "Order"
    assert message.promoted[MESSAGE_TYPE] == "Order"


def test_a_single_xml_message_keeps_its_original_bytes_exactly() -> None:
    # Given a document with a declaration, odd whitespace, a comment and single quotes
    body = (
        b"<?xml version='1.0' encoding='utf-8'?>\n"
        b"<!-- first -->\n<Order  id='7' >\r\n  <Total>5.00</Total>\n</Order>\n"
    )

    # When it is disassembled as one message
    [message] = run(XmlDisassembler(), body)

    # Then the body is byte for byte what came in
    assert message.body == body


def test_a_document_of_another_type_than_the_envelope_is_one_message() -> None:
    body = b'<o:Order xmlns:o="urn:orders"/>'

    [message] = run(XmlDisassembler({"urn:batch#Batch": None}), body)

    assert message.body == body


# --- XmlDisassembler: envelopes ---------------------------------------------------------

BATCH = (
    b'<b:Batch xmlns:b="urn:batch" xmlns:o="urn:orders">'
    b'<o:Order id="1"><o:Total>5</o:Total></o:Order>'
    b"<!-- not a record -->"
    b'<o:Order id="2"><o:Total>6</o:Total></o:Order>'
    b"<Note>hi</Note>"
    b"</b:Batch>"
)


def test_an_envelope_is_split_into_its_records_each_with_its_own_type() -> None:
    # Given an envelope holding two orders, a comment and a note
    disassembler = XmlDisassembler({"urn:batch#Batch": None})

    # When it is disassembled
    messages = run(disassembler, BATCH)

    # Then every child element is a message of its own type (comments are not records)
    assert [m.message_type for m in messages] == ["urn:orders#Order", "urn:orders#Order", "Note"]
    assert [m.promoted[MESSAGE_TYPE] for m in messages] == [m.message_type for m in messages]
    assert [m.document.get("id") for m in messages[:2]] == ["1", "2"]


def test_a_split_record_is_a_standalone_document_with_its_namespaces() -> None:
    [first, *_] = run(XmlDisassembler({"urn:batch#Batch": None}), BATCH)

    # Then the record's body parses on its own, with its namespace declared
    [again] = run(XmlDisassembler(), first.body)
    assert again.message_type == "urn:orders#Order"
    assert again.document.findtext("{urn:orders}Total") == "5"
    assert b"<b:Batch" not in first.body


def test_an_envelope_with_a_records_xpath_takes_only_what_it_selects() -> None:
    # Given an envelope whose records are the orders only
    disassembler = XmlDisassembler(
        {"urn:batch#Batch": "/b:Batch/o:Order"},
        namespaces={"b": "urn:batch", "o": "urn:orders"},
    )

    # When it is disassembled
    messages = run(disassembler, BATCH)

    # Then the note is left out
    assert [m.message_type for m in messages] == ["urn:orders#Order"] * 2
    assert [m.document.get("id") for m in messages] == ["1", "2"]


def test_an_envelope_without_the_namespace_uses_the_bare_root_name() -> None:
    messages = run(XmlDisassembler({"Batch": None}), b"<Batch><A/><B/></Batch>")

    assert [m.message_type for m in messages] == ["A", "B"]


def test_an_empty_envelope_makes_no_message() -> None:
    body = b'<b:Batch xmlns:b="urn:batch">  <!-- nothing --> </b:Batch>'

    assert run(XmlDisassembler({"urn:batch#Batch": None}), body) == []


def test_a_records_xpath_that_selects_no_elements_is_refused() -> None:
    # Given a record XPath that selects text, not elements
    disassembler = XmlDisassembler({"Batch": "/Batch/A/text()"})

    error = refusal(disassembler, PipelineMessage(b"<Batch><A>x</A></Batch>"))

    assert error.code == "malformed"
    assert "must select elements" in str(error)


def test_a_bad_records_xpath_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="records: bad XPath"):
        XmlDisassembler({"Batch": "/Batch["})


# --- XmlDisassembler: refusals ------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"<Order><Total>5</Order>", b"", b"not xml", b"<a/><b/>", b"\xff\xfe<a/>"],
    ids=["unclosed", "empty", "text", "two-roots", "bad-bytes"],
)
def test_malformed_xml_is_refused_as_malformed(body: bytes) -> None:
    error = refusal(XmlDisassembler(), PipelineMessage(body))

    assert error.code == "malformed"
    assert error.component == "XmlDisassembler"


SECRET = "TOP-SECRET-42"


@pytest.fixture
def secret_url(tmp_path: Path) -> str:
    """The file: URL of a file holding SECRET."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    return secret.as_uri()


@pytest.mark.parametrize(
    "template",
    [
        '<!DOCTYPE r [<!ENTITY x SYSTEM "{url}">]><r>&x;</r>',
        '<!DOCTYPE r [<!ENTITY x SYSTEM "{url}">]><r a="&x;"/>',
    ],
    ids=["element-entity", "attribute-entity"],
)
def test_an_external_entity_is_refused_not_expanded(secret_url: str, template: str) -> None:
    # Given a document using an external entity that names a secret file
    body = ('<?xml version="1.0"?>' + template.format(url=secret_url)).encode()

    # When it is disassembled
    error = refusal(XmlDisassembler(), PipelineMessage(body))

    # Then it is refused as malformed, and the secret is not in the error
    assert error.code == "malformed"
    assert SECRET not in str(error)


@pytest.mark.parametrize(
    "template",
    [
        '<!DOCTYPE r [<!ENTITY % p SYSTEM "{url}"> %p;]><r>text</r>',
        '<!DOCTYPE r SYSTEM "{url}"><r>text</r>',
    ],
    ids=["parameter-entity", "external-dtd"],
)
def test_an_external_dtd_is_not_loaded(secret_url: str, template: str) -> None:
    # Given a document whose DTD names a secret file
    body = ('<?xml version="1.0"?>' + template.format(url=secret_url)).encode()

    # When it is disassembled
    [message] = run(XmlDisassembler(), body)

    # Then the DTD was not read: nothing of the secret is in the parsed document
    assert etree.tostring(message.document) == b"<r>text</r>"
    assert message.body == body


def test_an_entity_reference_in_the_body_is_refused() -> None:
    # Given an external entity used in element content
    body = b'<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><r>&x;</r>'

    error = refusal(XmlDisassembler(), PipelineMessage(body))

    assert error.code == "malformed"
    assert "root:" not in str(error)


def test_an_internal_entity_bomb_is_refused_not_expanded() -> None:
    # Given a "billion laughs" document
    lol = "".join(f'<!ENTITY l{i} "{("&l" + str(i - 1) + ";") * 10}">' for i in range(1, 10))
    body = f'<!DOCTYPE r [<!ENTITY l0 "lol">{lol}]><r>&l9;</r>'.encode()

    error = refusal(XmlDisassembler(), PipelineMessage(body))

    assert error.code == "malformed"


# --- XmlValidator -----------------------------------------------------------------------


def test_a_valid_xml_message_passes_its_xsd() -> None:
    message = xml(b'<Order xmlns="urn:orders"><Total>5.50</Total></Order>')

    [out] = list(XmlValidator({"urn:orders#Order": ORDER_XSD}).process(message, CTX))

    assert out is message


def test_an_invalid_xml_message_is_refused_with_the_line() -> None:
    # Given an order whose total, on line 3, is not a decimal
    message = xml(b'<Order xmlns="urn:orders">\n\n<Total>abc</Total></Order>')

    error = refusal(XmlValidator({"urn:orders#Order": ORDER_XSD}), message)

    assert error.code == "invalid"
    assert "line 3" in str(error)
    assert "Total" in str(error)


def test_an_xsd_can_be_read_from_a_file(tmp_path: Path) -> None:
    xsd = tmp_path / "order.xsd"
    xsd.write_bytes(ORDER_XSD)
    message = xml(b'<Order xmlns="urn:orders"><Total>x</Total></Order>')

    error = refusal(XmlValidator({"urn:orders#Order": xsd}), message)

    assert error.code == "invalid"


def test_a_bad_xsd_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="urn:orders#Order"):
        XmlValidator({"urn:orders#Order": b"<xs:schema"})


def test_an_unknown_type_passes_a_lenient_validator() -> None:
    message = xml(b"<Other/>")

    [out] = list(XmlValidator({"urn:orders#Order": ORDER_XSD}).process(message, CTX))

    assert out is message


def test_a_strict_validator_refuses_an_unknown_type() -> None:
    message = xml(b"<Other/>")

    error = refusal(XmlValidator({"urn:orders#Order": ORDER_XSD}, strict=True), message)

    assert error.code == "unknown-type"
    assert "'Other'" in str(error)


def test_the_xml_validator_parses_a_message_that_was_not_disassembled() -> None:
    message = PipelineMessage(b'<Order xmlns="urn:orders"><Total>x</Total></Order>')

    error = refusal(XmlValidator({"urn:orders#Order": ORDER_XSD}), message)

    assert error.code == "invalid"


# --- XmlAssembler -----------------------------------------------------------------------


def test_the_xml_assembler_without_an_envelope_sends_the_body_as_stored() -> None:
    body = b"<?xml version='1.0'?>\n<Order  id='1'/>"

    [out] = run(XmlAssembler(), body)

    assert out.body == body


@pytest.mark.parametrize(
    ("envelope", "tag"),
    [("urn:out#Orders", "{urn:out}Orders"), ("{urn:out}Orders", "{urn:out}Orders")],
    ids=["ns-hash-root", "clark"],
)
def test_the_xml_assembler_wraps_the_message_in_its_envelope(envelope: str, tag: str) -> None:
    # Given an order and an envelope element
    body = b'<o:Order xmlns:o="urn:orders" id="1"/>'

    # When it is assembled
    [out] = run(XmlAssembler(envelope), body)

    # Then the body is the envelope holding the order
    [again] = run(XmlDisassembler(), out.body)
    assert again.document.tag == tag
    [child] = list(again.document)
    assert child.tag == "{urn:orders}Order"
    assert child.get("id") == "1"


def test_the_xml_assembler_wraps_in_an_envelope_without_a_namespace() -> None:
    [out] = run(XmlAssembler("Orders"), b"<Order/>")

    assert out.body.endswith(b"<Orders><Order/></Orders>")


def test_the_xml_assembler_refuses_malformed_xml_inside_an_envelope() -> None:
    error = refusal(XmlAssembler("Orders"), PipelineMessage(b"<Order>"))

    assert error.code == "malformed"


# --- JsonDisassembler -------------------------------------------------------------------


def test_a_single_json_message_keeps_its_original_bytes() -> None:
    body = b'{ "b": 1,\n  "a": [1, 2] }  '

    [message] = run(JsonDisassembler("urn:t"), body)

    assert message.body == body
    assert message.message_type == "urn:t"
    assert message.promoted[MESSAGE_TYPE] == "urn:t"
    assert message.document == {"b": 1, "a": [1, 2]}


def test_a_top_level_json_array_is_split_into_messages() -> None:
    # Given a batch of three
    body = b'[{"id": 1}, {"id": 2}, {"id": 3}]'

    # When it is disassembled
    messages = run(JsonDisassembler("t"), body)

    # Then each element is a message, re-serialised compactly
    assert [m.body for m in messages] == [b'{"id":1}', b'{"id":2}', b'{"id":3}']
    assert [m.document for m in messages] == [{"id": 1}, {"id": 2}, {"id": 3}]


def test_a_json_envelope_is_split_at_the_split_path() -> None:
    body = b'{"batch": "b1", "orders": [{"id": 1}, {"id": 2}]}'

    messages = run(JsonDisassembler("t", split="$.orders"), body)

    assert [json.loads(m.body) for m in messages] == [{"id": 1}, {"id": 2}]


def test_a_json_envelope_whose_split_path_is_not_an_array_is_malformed() -> None:
    error = refusal(JsonDisassembler("t", split="$.orders"), PipelineMessage(b'{"orders": {}}'))

    assert error.code == "malformed"
    assert "$.orders" in str(error)


def test_an_empty_json_batch_makes_no_message() -> None:
    assert run(JsonDisassembler("t"), b"[]") == []


def test_the_message_type_is_read_at_the_type_path_of_each_record() -> None:
    body = b'[{"kind": "order", "id": 1}, {"kind": "refund", "id": 2}]'

    messages = run(JsonDisassembler(type_path="$.kind"), body)

    assert [m.message_type for m in messages] == ["order", "refund"]
    assert [m.promoted[MESSAGE_TYPE] for m in messages] == ["order", "refund"]


@pytest.mark.parametrize(
    "body",
    [b'{"id": 1}', b'{"kind": 5}', b'{"kind": ""}', b'{"kind": null}'],
    ids=["absent", "number", "empty", "null"],
)
def test_a_record_without_a_message_type_is_refused(body: bytes) -> None:
    error = refusal(JsonDisassembler(type_path="$.kind"), PipelineMessage(body))

    assert error.code == "unknown-type"
    assert "$.kind" in str(error)


@pytest.mark.parametrize(
    "body",
    [b'{"a": 1', b"", b"{'a': 1}", b'{"a": 1} x', b'"\xff"'],
    ids=["unclosed", "empty", "single-quotes", "trailing", "bad-utf8"],
)
def test_malformed_json_is_refused_as_malformed(body: bytes) -> None:
    error = refusal(JsonDisassembler("t"), PipelineMessage(body))

    assert error.code == "malformed"


@pytest.mark.parametrize(
    ("message_type", "type_path"), [(None, None), ("t", "$.kind")], ids=["neither", "both"]
)
def test_the_json_disassembler_needs_exactly_one_way_to_type_messages(
    message_type: str | None, type_path: str | None
) -> None:
    with pytest.raises(ValidationError, match="one of message_type= or type_path="):
        JsonDisassembler(message_type, type_path=type_path)


# --- JsonValidator ----------------------------------------------------------------------


def test_a_valid_json_message_passes_its_schema() -> None:
    message = json_message(b'{"total": 5, "lines": [{"sku": "a"}]}')

    [out] = list(JsonValidator({"t": ORDER_SCHEMA}).process(message, CTX))

    assert out is message


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"total": "five"}', "$.total"),
        (b'{"total": 5, "lines": [{"sku": "a"}, {"qty": 1}]}', "$.lines[1]"),
        (b"[]", "$:"),
    ],
    ids=["field", "array-item", "root"],
)
def test_an_invalid_json_message_is_refused_naming_the_json_path(body: bytes, where: str) -> None:
    message = PipelineMessage(body, message_type="t")

    error = refusal(JsonValidator({"t": ORDER_SCHEMA}), message)

    assert error.code == "invalid"
    assert f"at {where}" in str(error)


def test_a_strict_json_validator_refuses_an_unknown_type() -> None:
    message = json_message(b"{}", message_type="other")

    error = refusal(JsonValidator({"t": ORDER_SCHEMA}, strict=True), message)

    assert error.code == "unknown-type"


def test_a_lenient_json_validator_passes_an_unknown_type() -> None:
    message = json_message(b"{}", message_type="other")

    [out] = list(JsonValidator({"t": ORDER_SCHEMA}).process(message, CTX))

    assert out is message


def test_a_bad_json_schema_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="JSON Schema for 't'"):
        JsonValidator({"t": {"type": "no-such-type"}})


def test_a_json_message_given_a_new_body_is_validated_against_that_body() -> None:
    # Given a disassembled message that a later component gave a new, invalid body
    original = json_message(b'{"total": 5}')
    changed = original.derive(b'{"lines": []}')

    # When it is validated against a schema that requires "total"
    error = refusal(JsonValidator({"t": {"required": ["total"]}}), changed)

    # Then the new body is refused
    assert error.code == "invalid"


# --- JsonAssembler ----------------------------------------------------------------------


def test_the_json_assembler_without_options_sends_the_body_as_stored() -> None:
    body = b'{ "a" : 1 }'

    [out] = run(JsonAssembler(), body)

    assert out.body == body


def test_the_json_assembler_wraps_the_message_in_its_envelope() -> None:
    [out] = run(JsonAssembler("order"), b'{"id": 1, "name": "\xc3\xa9"}')

    assert json.loads(out.body) == {"order": {"id": 1, "name": "é"}}
    assert out.document == {"order": {"id": 1, "name": "é"}}
    assert "é".encode() in out.body


def test_the_json_assembler_indents() -> None:
    [out] = run(JsonAssembler(indent=2), b'{"a":{"b":1}}')

    assert out.body == b'{\n  "a": {\n    "b": 1\n  }\n}'


def test_the_json_assembler_wraps_and_indents() -> None:
    [out] = run(JsonAssembler("orders", indent=1), b"[1]")

    assert out.body == b'{\n "orders": [\n  1\n ]\n}'


# --- PropertySchema + Promote: XML ---------------------------------------------------------

ORDER = (
    b'<o:Order xmlns:o="urn:orders" rush="true" id="A-1">'
    b"<o:Region>EU</o:Region><o:Total>12.50</o:Total>"
    b"<o:Note>gift <b>wrap</b></o:Note>"
    b"<o:Line>1</o:Line><o:Line>2</o:Line><o:Line>3</o:Line>"
    b"</o:Order>"
)
NS = {"o": "urn:orders"}


def order_schema(properties: dict[str, Any]) -> PropertySchema:
    return PropertySchema("urn:orders#Order", properties, namespaces=NS)


def test_an_xpath_to_an_element_promotes_its_text() -> None:
    schema = order_schema({"orders.Region": "/o:Order/o:Region"})

    out = promote(schema, xml(ORDER))

    assert out.promoted["orders.Region"] == "EU"


def test_an_element_with_children_promotes_all_of_its_text() -> None:
    schema = order_schema({"orders.Note": "/o:Order/o:Note"})

    assert promote(schema, xml(ORDER)).promoted["orders.Note"] == "gift wrap"


def test_an_xpath_to_an_attribute_promotes_its_value() -> None:
    schema = order_schema({"orders.Id": "/o:Order/@id", "orders.Rush": ("/o:Order/@rush", bool)})

    out = promote(schema, xml(ORDER))

    assert out.promoted["orders.Id"] == "A-1"
    assert out.promoted["orders.Rush"] is True


@pytest.mark.parametrize(
    ("path", "kind", "value"),
    [
        ("count(/o:Order/o:Line)", int, 3),
        ("sum(/o:Order/o:Line)", float, 6.0),
        ("boolean(/o:Order/o:Line)", bool, True),
        ("number(/o:Order/o:Total)", Decimal, 12.5),
    ],
    ids=["count", "sum", "boolean", "number"],
)
def test_an_xpath_function_promotes_its_result(path: str, kind: type, value: object) -> None:
    schema = order_schema({"orders.X": Field(path, kind)})

    out = promote(schema, xml(ORDER))

    assert out.promoted["orders.X"] == value
    assert type(out.promoted["orders.X"]) is type(value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("string(/o:Order/@id)", "A-1"),
        ("concat(/o:Order/o:Region, '-', /o:Order/@id)", "EU-A-1"),
    ],
    ids=["string", "concat"],
)
def test_a_string_xpath_function_promotes_a_plain_str(path: str, value: str) -> None:
    # Given a property read by an XPath string function
    schema = order_schema({"orders.X": path})

    # When it is promoted
    out = promote(schema, xml(ORDER))

    # Then it is a plain str, which survives the stored context encoding
    assert type(out.promoted["orders.X"]) is str
    promoted, _ = decode_context(encode_context(out.promoted, out.written))  # type: ignore[arg-type]
    assert promoted["orders.X"] == value


def test_promotion_keeps_the_message_type_and_passes_other_types_through() -> None:
    schema = order_schema({"orders.Region": "/o:Order/o:Region"})
    other = xml(b"<Other/>")

    out = promote(schema, other)

    assert out.promoted == {MESSAGE_TYPE: "Other"}


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("hello", str, "hello"),
        (" 42 ", int, 42),
        ("-7", int, -7),
        ("2.5", float, 2.5),
        ("1e3", float, 1000.0),
        ("12.50", Decimal, 12.5),
        ("12.00", Decimal, 12),
        ("true", bool, True),
        ("FALSE", bool, False),
        ("1", bool, True),
        ("0", bool, False),
        ("2024-06-01T12:00:00Z", datetime, datetime(2024, 6, 1, 12, tzinfo=UTC)),
        ("2024-06-01T14:00:00+02:00", datetime, datetime(2024, 6, 1, 12, tzinfo=UTC)),
    ],
    ids=[
        "str",
        "int",
        "negative-int",
        "float",
        "float-exponent",
        "decimal-fraction",
        "decimal-integral",
        "bool-true",
        "bool-false-upper",
        "bool-1",
        "bool-0",
        "datetime-z",
        "datetime-offset",
    ],
)
def test_xml_text_is_converted_to_the_declared_type(text: str, kind: type, value: object) -> None:
    schema = PropertySchema("V", {"v.Value": Field("/V", kind)})

    out = promote(schema, xml(f"<V>{text}</V>".encode()))

    assert out.promoted["v.Value"] == value
    assert type(out.promoted["v.Value"]) is type(value)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("abc", int),
        ("12.0", int),
        ("99999999999999999999", int),
        ("abc", float),
        ("nan", float),
        ("inf", float),
        ("abc", Decimal),
        ("NaN", Decimal),
        ("yes", bool),
        ("", bool),
        ("tomorrow", datetime),
        ("2024-06-01T12:00:00", datetime),
        ("x" * 300, str),
    ],
    ids=[
        "int-word",
        "int-fraction",
        "int-over-64-bits",
        "float-word",
        "float-nan",
        "float-inf",
        "decimal-word",
        "decimal-nan",
        "bool-yes",
        "bool-empty",
        "datetime-word",
        "datetime-naive",
        "str-too-long",
    ],
)
def test_a_value_that_does_not_convert_is_a_bad_property_naming_it(text: str, kind: type) -> None:
    schema = PropertySchema("V", {"v.Value": Field("/V", kind)})

    error = promote_error(schema, xml(f"<V>{text}</V>".encode()))

    assert error.code == "bad-property"
    assert "v.Value" in str(error)


def test_a_required_property_that_is_missing_is_refused() -> None:
    schema = order_schema({"orders.Customer": "/o:Order/o:Customer"})

    error = promote_error(schema, xml(ORDER))

    assert error.code == "missing-property"
    assert "orders.Customer" in str(error)
    assert error.component == "Promote"


def test_an_optional_property_that_is_missing_is_left_out() -> None:
    schema = order_schema(
        {
            "orders.Region": "/o:Order/o:Region",
            "orders.Customer": Field("/o:Order/o:Customer", required=False),
        }
    )

    out = promote(schema, xml(ORDER))

    assert "orders.Customer" not in out.promoted
    assert "orders.Customer" not in out.written
    assert out.promoted["orders.Region"] == "EU"


def test_a_property_not_promoted_is_written_only() -> None:
    schema = order_schema({"orders.Note": Field("/o:Order/o:Note", promote=False)})

    out = promote(schema, xml(ORDER))

    assert out.written == {"orders.Note": "gift wrap"}
    assert "orders.Note" not in out.promoted


def test_a_written_property_may_be_longer_than_a_promoted_one() -> None:
    schema = PropertySchema("V", {"v.Long": Field("/V", promote=False)})

    out = promote(schema, xml(f"<V>{'x' * 300}</V>".encode()))

    assert out.written["v.Long"] == "x" * 300


def test_a_path_selecting_several_nodes_is_a_bad_property() -> None:
    schema = order_schema({"orders.Line": "/o:Order/o:Line"})

    error = promote_error(schema, xml(ORDER))

    assert error.code == "bad-property"
    assert "orders.Line" in str(error)
    assert "3 nodes" in str(error)


def test_a_json_path_on_an_xml_message_is_a_bad_property() -> None:
    schema = PropertySchema("V", {"v.Value": "$.value"})

    error = promote_error(schema, xml(b"<V/>"))

    assert error.code == "bad-property"


def test_promoting_an_unparsed_message_asks_for_a_disassembler() -> None:
    schema = PropertySchema("V", {"v.Value": "/V"})

    error = promote_error(schema, PipelineMessage(b"<V>1</V>", message_type="V"))

    assert error.code == "unknown-type"
    assert "disassembler" in str(error)


def test_a_property_name_with_dashes_and_digits_is_promoted_as_written() -> None:
    schema = PropertySchema("V", {"my-ns.Value_1": "/V"})

    assert promote(schema, xml(b"<V>x</V>")).promoted["my-ns.Value_1"] == "x"


# --- PropertySchema + Promote: JSON ----------------------------------------------------------


def test_json_paths_promote_values_of_their_json_types() -> None:
    # Given a JSON order and a schema reading nested fields, an index and a quoted name
    body = json.dumps(
        {
            "region": "EU",
            "total": 12.5,
            "count": 3,
            "rush": True,
            "at": "2024-06-01T12:00:00Z",
            "lines": [{"sku": "a"}, {"sku": "b"}],
            "x-ref": "R1",
        }
    ).encode()
    schema = PropertySchema(
        "t",
        {
            "orders.Region": "$.region",
            "orders.Total": ("$.total", float),
            "orders.Count": ("$.count", int),
            "orders.Rush": ("$.rush", bool),
            "orders.At": ("$.at", datetime),
            "orders.LastSku": "$.lines[-1].sku",
            "orders.Ref": "$['x-ref']",
            "orders.Price": ("$.total", Decimal),
        },
    )

    # When it is promoted
    out = promote(schema, json_message(body))

    # Then each value has its declared type
    assert {k: v for k, v in out.promoted.items() if k != MESSAGE_TYPE} == {
        "orders.Region": "EU",
        "orders.Total": 12.5,
        "orders.Count": 3,
        "orders.Rush": True,
        "orders.At": datetime(2024, 6, 1, 12, tzinfo=UTC),
        "orders.LastSku": "b",
        "orders.Ref": "R1",
        "orders.Price": 12.5,
    }


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        (12, str, "12"),
        (True, str, "true"),
        ("12", int, 12),
        (12.0, int, 12),
        (3, float, 3.0),
        ("2.5", float, 2.5),
        ("true", bool, True),
        (0.1, Decimal, 0.1),
    ],
    ids=["num-as-str", "bool-as-str", "str-as-int", "integral-float", "int-as-float",
         "str-as-float", "str-as-bool", "float-as-decimal"],
)  # fmt: skip
def test_json_values_convert_to_the_declared_type(
    value: object, kind: type, expected: object
) -> None:
    schema = PropertySchema("t", {"t.V": Field("$.v", kind)})

    out = promote(schema, json_message(json.dumps({"v": value}).encode()))

    assert out.promoted["t.V"] == expected
    assert type(out.promoted["t.V"]) is type(expected)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, str),
        ({"a": 1}, str),
        ([1], int),
        (True, int),
        (1.5, int),
        (False, float),
        ("many", int),
        (5, datetime),
        ("maybe", bool),
    ],
    ids=["null", "object", "array", "bool-as-int", "fraction-as-int", "bool-as-float",
         "word-as-int", "number-as-datetime", "word-as-bool"],
)  # fmt: skip
def test_a_json_value_of_the_wrong_kind_is_a_bad_property(value: object, kind: type) -> None:
    schema = PropertySchema("t", {"t.V": Field("$.v", kind)})

    error = promote_error(schema, json_message(json.dumps({"v": value}).encode()))

    assert error.code == "bad-property"
    assert "t.V" in str(error)


def test_a_missing_json_value_is_a_missing_property() -> None:
    schema = PropertySchema("t", {"t.V": "$.a.b[2]"})

    error = promote_error(schema, json_message(b'{"a": {"b": [1, 2]}}'))

    assert error.code == "missing-property"
    assert "t.V" in str(error)


def test_an_optional_missing_json_value_is_left_out() -> None:
    schema = PropertySchema("t", {"t.V": Field("$.v", required=False)})

    out = promote(schema, json_message(b"{}"))

    assert out.promoted == {MESSAGE_TYPE: "t"}


def test_a_json_property_not_promoted_is_written_only() -> None:
    schema = PropertySchema("t", {"t.V": Field("$.v", int, promote=False)})

    out = promote(schema, json_message(b'{"v": 4}'))

    assert out.written == {"t.V": 4}
    assert "t.V" not in out.promoted


def test_an_xpath_on_a_json_message_is_a_bad_property() -> None:
    schema = PropertySchema("t", {"t.V": "/v"})

    error = promote_error(schema, json_message(b'{"v": 1}'))

    assert error.code == "bad-property"


# --- PropertySchema construction -------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["messagebox.MessageType", "BTS.MessageType", "bts.Custom", "MessageBox.X"]
)
def test_a_reserved_property_name_is_refused_at_construction(name: str) -> None:
    with pytest.raises(ValidationError, match="namespace is the engine's"):
        PropertySchema("V", {name: "/V"})


@pytest.mark.parametrize("name", ["nodot", "a..b", "a.b c", ""])
def test_a_malformed_property_name_is_refused_at_construction(name: str) -> None:
    with pytest.raises(ValidationError, match="property"):
        PropertySchema("V", {name: "/V"})


@pytest.mark.parametrize("path", ["/V[", "///", "/V/@", "count(/V"], ids=str)
def test_a_bad_xpath_is_refused_at_construction(path: str) -> None:
    with pytest.raises(ValidationError, match="bad XPath"):
        PropertySchema("V", {"v.Value": path})


@pytest.mark.parametrize(
    "path", ["/x:Order", "foo(/o:Order)", "count()"], ids=["prefix", "function", "arity"]
)
def test_an_xpath_that_cannot_be_evaluated_is_refused_at_construction(path: str) -> None:
    with pytest.raises(ValidationError, match="bad XPath"):
        PropertySchema("urn:orders#Order", {"orders.V": path}, namespaces=NS)


def test_a_bad_json_path_is_refused_at_construction() -> None:
    with pytest.raises(ValidationError, match="wildcards"):
        PropertySchema("t", {"t.V": "$.lines[*].sku"})


@pytest.mark.parametrize("kind", [list, bytes, dict], ids=lambda k: k.__name__)
def test_an_unsupported_type_is_refused_at_construction(kind: type) -> None:
    with pytest.raises(ValidationError, match="is not one of"):
        PropertySchema("t", {"t.V": Field("$.v", kind)})


def test_a_schema_needs_a_message_type() -> None:
    with pytest.raises(ValidationError, match="message type"):
        PropertySchema("", {"t.V": "$.v"})


def test_promote_takes_property_schemas_only() -> None:
    with pytest.raises(ValidationError, match="PropertySchema"):
        Promote([{"t.V": "$.v"}])  # type: ignore[list-item]


def test_a_promote_that_requires_a_schema_refuses_an_unknown_type() -> None:
    schema = PropertySchema("t", {"t.V": "$.v"})

    error = refusal(Promote([schema], require=True), json_message(b"{}", message_type="other"))

    assert error.code == "unknown-type"
    assert "'other'" in str(error)
    assert "known: t" in str(error)


def test_a_promote_that_requires_a_schema_promotes_a_known_type() -> None:
    schema = PropertySchema("t", {"t.V": ("$.v", int)})

    [out] = list(Promote([schema], require=True).process(json_message(b'{"v": 1}'), CTX))

    assert out.promoted["t.V"] == 1


def test_several_schemas_for_one_type_all_apply() -> None:
    first = PropertySchema("t", {"t.A": "$.a"})
    second = PropertySchema("t", {"t.B": "$.b"})

    [out] = list(Promote([first, second]).process(json_message(b'{"a": "1", "b": "2"}'), CTX))

    assert out.promoted["t.A"] == "1"
    assert out.promoted["t.B"] == "2"


# --- JsonPath ---------------------------------------------------------------------------------

DOC = {"a": {"b": [10, 20, 30]}, "x-y": {"q'uote": 1, 'dq"': 2}, "": "empty"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("$", DOC),
        ("$.a.b", [10, 20, 30]),
        ("$.a.b[0]", 10),
        ("$.a.b[-1]", 30),
        ("$.a.b[ -3 ]", 10),
        ("$['x-y']", DOC["x-y"]),
        ("$.x-y", DOC["x-y"]),
        ('$["x-y"]', DOC["x-y"]),
        ("$['x-y']['q\\'uote']", 1),
        ('$["x-y"]["dq\\""]', 2),
        ("$['a'].b[1]", 20),
        ("$['']", "empty"),
    ],
)
def test_a_supported_json_path_finds_its_value(path: str, value: object) -> None:
    assert JsonPath(path).find(DOC) == value


@pytest.mark.parametrize(
    "path",
    ["$.nope", "$.a.b[3]", "$.a.b[-4]", "$.a.b.c", "$.a[0]", "$.a.b[0].c"],
)
def test_a_json_path_that_selects_nothing_finds_missing(path: str) -> None:
    assert JsonPath(path).find(DOC) is JsonPath.MISSING


@pytest.mark.parametrize(
    "path",
    [
        "$..a",
        "$.a[*]",
        "$.*",
        "$.a[?(@.x)]",
        "$.a[0:2]",
        "$.a[0,1]",
        "a.b",
        "",
        "$.",
        "$.1a",
        "$[a]",
        "$['unclosed]",
    ],
)
def test_an_unsupported_json_path_is_refused(path: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(repr(path))):
        JsonPath(path)


def test_a_json_path_must_be_a_string() -> None:
    with pytest.raises(ValidationError, match="must start with"):
        JsonPath(5)  # type: ignore[arg-type]


JSON_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)
)
JSON_DOCS = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def quoted(key: str, quote: str) -> str:
    escaped = key.replace("\\", "\\\\").replace(quote, "\\" + quote)
    return f"[{quote}{escaped}{quote}]"


@settings(database=None, max_examples=200)
@given(doc=JSON_DOCS, data=st.data())
def test_a_json_path_to_any_node_finds_that_node(doc: Any, data: st.DataObject) -> None:
    # Given a generated document and a walk from its root to a random node
    node, path = doc, "$"
    while isinstance(node, dict | list) and node and data.draw(st.booleans()):
        if isinstance(node, list):
            index = data.draw(st.integers(0, len(node) - 1))
            path += f"[{data.draw(st.sampled_from([index, index - len(node)]))}]"
            node = node[index]
        else:
            key = data.draw(st.sampled_from(sorted(node)))
            forms = [quoted(key, "'"), quoted(key, '"')]
            if NAME.fullmatch(key):
                forms.append(f".{key}")
            path += data.draw(st.sampled_from(forms))
            node = node[key]

    # When the path is compiled and applied
    found = JsonPath(path).find(doc)

    # Then it is that very node
    assert found is node


# --- convert (property-based) ------------------------------------------------------------------


@settings(database=None)
@given(value=st.integers(), pad=st.sampled_from(["", " ", "\t", "\n "]))
def test_any_integer_as_text_converts_to_that_int(value: int, pad: str) -> None:
    assert convert(f"{pad}{value}{pad}", int) == value


@settings(database=None)
@given(
    value=st.floats(allow_nan=False, allow_infinity=False), spelling=st.sampled_from([repr, str])
)
def test_any_finite_float_as_text_converts_to_that_float(value: float, spelling: Any) -> None:
    assert convert(spelling(value), float) == value


@settings(database=None)
@given(
    value=st.booleans(),
    word=st.sampled_from(["word", "digit"]),
    case=st.sampled_from([str.lower, str.upper, str.title]),
    pad=st.sampled_from(["", " ", "\n"]),
)
def test_any_bool_word_converts_to_that_bool(value: bool, word: str, case: Any, pad: str) -> None:
    text = (str(value) if word == "word" else str(int(value))).lower()

    assert convert(pad + case(text) + pad, bool) is value


@settings(database=None)
@given(text=st.text().filter(lambda t: t.strip().lower() not in {"true", "false", "1", "0"}))
def test_any_other_text_is_not_a_bool(text: str) -> None:
    with pytest.raises(ConversionError, match="is not a bool"):
        convert(text, bool)


@settings(database=None)
@given(value=st.integers())
def test_an_integer_as_text_is_refused_as_a_bool_unless_0_or_1(value: int) -> None:
    text = str(value)
    if value in (0, 1):
        assert convert(text, bool) is bool(value)
    else:
        with pytest.raises(ConversionError):
            convert(text, bool)


# --- Pipeline ---------------------------------------------------------------------------------


class Explode(Component):
    """Raises a plain exception, as a buggy component would."""

    def process(
        self, message: PipelineMessage, context: PipelineContext
    ) -> Iterable[PipelineMessage]:
        raise KeyError("boom")


def test_a_plain_exception_in_a_component_becomes_a_component_error() -> None:
    # Given a pipeline whose second component raises a KeyError
    pipeline = ReceivePipeline([XmlDisassembler(), Explode()])

    # When a message runs through it
    with pytest.raises(PipelineError) as info:
        pipeline.run(PipelineMessage(b"<V/>"), CTX)

    # Then it is a pipeline error naming the component and the original error
    assert info.value.code == "component-error"
    assert info.value.component == "Explode"
    assert "KeyError" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_pipeline_runs_each_output_through_the_next_component() -> None:
    schema = PropertySchema("urn:orders#Order", {"orders.Id": "/o:Order/@id"}, namespaces=NS)
    pipeline = ReceivePipeline([XmlDisassembler({"urn:batch#Batch": None}), Promote([schema])])

    messages = pipeline.run(PipelineMessage(BATCH), CTX)

    assert [m.promoted.get("orders.Id") for m in messages] == ["1", "2", None]


def test_run_each_gives_a_bad_record_its_error_and_good_ones_their_messages() -> None:
    # Given a batch of three orders, the second without its required total
    batch = (
        b"<Batch>"
        b'<Order id="1"><Total>5</Total></Order>'
        b'<Order id="2"/>'
        b'<Order id="3"><Total>7</Total></Order>'
        b"</Batch>"
    )
    schema = PropertySchema("Order", {"orders.Total": ("/Order/Total", int)})
    pipeline = ReceivePipeline([XmlDisassembler({"Batch": None}), Promote([schema])])

    # When it runs recoverably
    results = pipeline.run_each(PipelineMessage(batch), CTX)

    # Then each record has its own outcome
    assert len(results) == 3
    (_, first), (bad, second), (_, third) = results
    assert isinstance(first, list)
    assert [m.promoted["orders.Total"] for m in first] == [5]
    assert isinstance(second, PipelineError)
    assert second.code == "missing-property"
    assert bad.document.get("id") == "2"
    assert isinstance(third, list)
    assert [m.promoted["orders.Total"] for m in third] == [7]


def test_run_each_raises_when_the_first_component_refuses_the_interchange() -> None:
    pipeline = ReceivePipeline([XmlDisassembler({"Batch": None}), Promote([])])

    with pytest.raises(PipelineError) as info:
        pipeline.run_each(PipelineMessage(b"<Batch>"), CTX)

    assert info.value.code == "malformed"


def test_run_each_of_an_empty_pipeline_passes_the_message_through() -> None:
    message = PipelineMessage(b"raw")

    assert ReceivePipeline().run_each(message, CTX) == [(message, [message])]


def test_a_pipeline_takes_components_only() -> None:
    with pytest.raises(ValidationError, match="Component instances"):
        ReceivePipeline([lambda m: m])  # type: ignore[list-item]
