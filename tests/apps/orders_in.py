"""A host app whose HTTP receive location (port web, location orders, on a free port)
takes XML orders and promotes their region, which it requires: an order without one, or
a body that is not XML, is refused and suspended (``receive-failure``, with an error
report routed to the ``errors`` service). EU orders go to ``ship-eu``."""

from __future__ import annotations

from messagebox.hosts import Delivery, HostApp
from messagebox.pipelines import PropertySchema, XmlReceive
from messagebox.predicates import P

ORDER = PropertySchema("Order", {"orders.Region": "/Order/Region"})


def build() -> HostApp:
    """The app (a new one each call: a test runs its own)."""
    made = HostApp("orders-in", poll_max_seconds=0.1)
    made.receive_port("web", route_failed=True).location(
        "orders", "http://127.0.0.1:0/orders", pipeline=XmlReceive([ORDER])
    )
    made.subscribe("ship", filter=P("orders.Region") == "EU", name="ship-eu")
    made.subscribe("errors", filter=P("ErrorReport.ErrorType") == "FailedMessage", name="errors")

    @made.service("ship")
    def ship(d: Delivery) -> None:
        pass

    @made.service("errors")
    def errors(d: Delivery) -> None:
        pass

    return made


app = build()
