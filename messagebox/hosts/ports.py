"""Receive ports and send ports (BizTalk's shape).

A **receive location** (an adapter URL and a receive pipeline) belongs to a **receive
port**. What its adapter takes in goes through the pipeline and is published in one
transaction with a receipt, so an input is published once, whole, or not at all. When
the pipeline refuses an input, the input is stored suspended (``receive-failure``, not
resumable) with its original bytes and the error; with ``route_failed=True`` it is also
routed as an error report, with ``ErrorReport.*`` properties promoted.

A **send port** is a service with a filter subscription, a send pipeline and a
transport. A failed transmission is retried ``retry_count`` times, ``retry_interval``
seconds apart; then the backup transport (if any) gets its own retries; then the
message is suspended (resumable). A **send port group** sends what its filter matches
through each of its ports: each port's subscription is its own filter OR'ed with its
groups' filters, so a message reaches a port once however many of them match.
"""

from __future__ import annotations

from messagebox.hosts.receive_locations import (
    LocationStats,
    ReceiveLocation,
    ReceivePort,
    running_location,
)
from messagebox.hosts.send_ports import (
    PortStats,
    SendPort,
    SendPortGroup,
    Transport,
    port_filter,
)

__all__ = [
    "LocationStats",
    "PortStats",
    "ReceiveLocation",
    "ReceivePort",
    "SendPort",
    "SendPortGroup",
    "Transport",
    "port_filter",
    "running_location",
]
