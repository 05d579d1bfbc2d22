"""The order-routing integration: ports, pipelines and property schemas, in Python.

Orders arrive as XML (single orders, or batches in an ``urn:orders#Batch`` envelope)
and as JSON arrays in one inbound folder. They are routed by content (region, amount,
priority) to send ports, each writing to its own outbound folder. Inputs the pipelines
refuse are suspended with their original bytes, and routed as error reports to the
``errors`` port.

The web shop's orders (the JSON ones) also go to the fulfilment orchestration
(:mod:`fulfilment`), with their payments, which arrive as JSON in a payments folder
(before or after the order): a paid order is shipped (``warehouse``) and confirmed
(``confirmations``); one not paid in full in time is cancelled (``cancellations``).

Run it as a service with ``messagebox --url … host run routing:app`` (with this folder
on ``PYTHONPATH`` and ``ORDERS_ROOT`` naming the working folder), or through
``demo.py``.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from fulfilment import Fulfilment

from messagebox.hosts import HostApp, Transport
from messagebox.pipelines import Field, JsonReceive, PropertySchema, XmlReceive
from messagebox.predicates import P

NS = {"o": "urn:orders"}

ORDER_XML = PropertySchema(
    "urn:orders#Order",
    {
        "orders.OrderId": "/o:Order/o:Id",
        "orders.Region": "/o:Order/o:Region",
        "orders.Total": Field("/o:Order/o:Total", float),
        "orders.Priority": Field("/o:Order/o:Priority", int),
        "orders.OrderedAt": Field("/o:Order/o:OrderedAt", datetime),
        "orders.Rush": Field("/o:Order/@rush", bool, required=False),
        "orders.Customer": Field("/o:Order/o:Customer", promote=False),
    },
    namespaces=NS,
)

ORDER_JSON = PropertySchema(
    "urn:orders#Order",
    {
        "orders.OrderId": "$.id",
        "orders.Region": "$.region",
        "orders.Total": Field("$.total", float),
        "orders.Priority": Field("$.priority", int),
        "orders.OrderedAt": Field("$.orderedAt", datetime),
        "orders.Rush": Field("$.rush", bool, required=False),
        "orders.Customer": Field("$.customer", promote=False),
    },
)

ORDER_JSON_SCHEMA = {
    "type": "object",
    "required": ["id", "region", "total", "priority", "orderedAt"],
    "properties": {
        "id": {"type": "string"},
        "region": {"enum": ["EU", "US", "APAC", "LATAM"]},
        "total": {"type": "number", "minimum": 0},
        "priority": {"type": "integer", "minimum": 1, "maximum": 9},
    },
}

PAYMENT_JSON = PropertySchema(
    "urn:orders#Payment",
    {"orders.OrderId": "$.orderId", "orders.Amount": Field("$.amount", float)},
)

PORTS = {
    "ship-eu": P("orders.Region") == "EU",
    "ship-americas": P("orders.Region").in_(["US", "LATAM"]),
    "ship-apac": P("orders.Region") == "APAC",
    "expedite": (P("orders.Priority") >= 8) | P("orders.Rush").exists(),
    "audit": (P("orders.Region") == "APAC") & (P("orders.Total") > 5_000),
    "finance": None,  # only through the large-orders group
    "errors": P("ErrorReport.ErrorType") == "FailedMessage",
    "warehouse": P("orders.Step") == "ship",
    "confirmations": P("orders.Step") == "confirm",
    "cancellations": P("orders.Step") == "cancel",
}
"""Each send port's own filter (the last three get what the fulfilment publishes)."""

LARGE_ORDERS = P("orders.Total") >= 10_000
"""The large-orders send port group's filter: finance and audit both get them."""


def build(root: Path, *, fsync: bool = True) -> HostApp:
    """The host app, with its folders under ``root`` (created if missing)."""
    inbound = root / "in"
    inbound.mkdir(parents=True, exist_ok=True)
    payments = root / "payments"
    payments.mkdir(parents=True, exist_ok=True)
    # a high-volume host: large claims, since each claim, completion and step commit
    # costs a few milliseconds whatever its size (and on DuckDB they take turns)
    app = HostApp(
        "orders",
        dequeue_threads=4,
        claim_batch=200,
        max_in_flight=800,
        poll_min_seconds=0.01,
        poll_max_seconds=0.25,
        retry_backoff_seconds=0.5,
    )
    port = app.receive_port("orders-in", route_failed=True)
    port.location(
        "xml-drop",
        f"file://{inbound}?mask=*.xml&interval=0.1",
        pipeline=XmlReceive([ORDER_XML], envelopes={"urn:orders#Batch": None}),
    )
    port.location(
        "json-drop",
        f"file://{inbound}?mask=*.json&interval=0.1",
        pipeline=JsonReceive(
            [ORDER_JSON],
            message_type="urn:orders#Order",
            json_schema={"urn:orders#Order": ORDER_JSON_SCHEMA},
        ),
    )
    port.location(
        "payments-drop",
        f"file://{payments}?mask=*.json&interval=0.1",
        pipeline=JsonReceive([PAYMENT_JSON], message_type="urn:orders#Payment"),
    )
    app.orchestration(Fulfilment)
    options = (("fsync", fsync),)
    for name, filt in PORTS.items():
        app.send_port(
            name,
            filter=filt,
            transport=Transport(
                f"file://{root / 'out' / name}/%SourceFileName%.%MessageID%",
                retry_count=3,
                retry_interval=1.0,
                options=options,
            ),
            backup=Transport(f"file://{root / 'out' / 'backup'}/%MessageID%", options=options),
        )
    app.send_port_group("large-orders", filter=LARGE_ORDERS, ports=["finance", "audit"])
    return app


def __getattr__(name: str) -> HostApp:
    """``routing:app`` for ``messagebox host run``: built on first use."""
    if name == "app":
        return build(Path(os.environ.get("ORDERS_ROOT", "orders-data")).resolve())
    raise AttributeError(name)
