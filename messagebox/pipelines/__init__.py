"""Receive and send pipelines (BizTalk's shape).

A receive pipeline turns the bytes a receive location took in into messages to publish:
disassemble (parse, set ``messagebox.MessageType``, split envelopes and batches),
validate (XSD, JSON Schema) and promote (property schemas). A send pipeline turns a
routed message into the bytes a send port transmits (assemble, optionally in an
envelope). See :mod:`messagebox.pipelines.component` for the contract a component follows.

    receive = XmlReceive(schemas=[orders], envelopes={"urn:orders#Batch": None})
    send = SendPipeline([XmlAssembler(envelope="urn:out#Orders")])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from messagebox.pipelines.component import (
    MESSAGE_TYPE,
    PASS_THRU_RECEIVE,
    PASS_THRU_SEND,
    Component,
    Pipeline,
    PipelineContext,
    PipelineMessage,
    ReceivePipeline,
    SendPipeline,
)
from messagebox.pipelines.json import JsonAssembler, JsonDisassembler, JsonValidator
from messagebox.pipelines.schema import Field, Promote, PropertySchema
from messagebox.pipelines.xml import XmlAssembler, XmlDisassembler, XmlValidator


def XmlReceive(
    schemas: Iterable[PropertySchema] = (),
    *,
    envelopes: Mapping[str, str | None] | None = None,
    namespaces: Mapping[str, str] | None = None,
    xsd: Mapping[str, str | Path | bytes] | None = None,
    require_schema: bool = False,
) -> ReceivePipeline:
    """The XML receive pipeline: disassemble, validate (when ``xsd`` is given), promote."""
    components: list[Component] = [XmlDisassembler(envelopes, namespaces=namespaces)]
    if xsd:
        components.append(XmlValidator(xsd))
    components.append(Promote(schemas, require=require_schema))
    return ReceivePipeline(components)


def JsonReceive(
    schemas: Iterable[PropertySchema] = (),
    *,
    message_type: str | None = None,
    type_path: str | None = None,
    split: str | None = None,
    json_schema: Mapping[str, Mapping[str, Any]] | None = None,
    require_schema: bool = False,
) -> ReceivePipeline:
    """The JSON receive pipeline: disassemble, validate (with ``json_schema``), promote."""
    components: list[Component] = [JsonDisassembler(message_type, type_path=type_path, split=split)]
    if json_schema:
        components.append(JsonValidator(json_schema))
    components.append(Promote(schemas, require=require_schema))
    return ReceivePipeline(components)


__all__ = [
    "MESSAGE_TYPE",
    "PASS_THRU_RECEIVE",
    "PASS_THRU_SEND",
    "Component",
    "Field",
    "JsonAssembler",
    "JsonDisassembler",
    "JsonReceive",
    "JsonValidator",
    "Pipeline",
    "PipelineContext",
    "PipelineMessage",
    "Promote",
    "PropertySchema",
    "ReceivePipeline",
    "SendPipeline",
    "XmlAssembler",
    "XmlDisassembler",
    "XmlReceive",
    "XmlValidator",
]
