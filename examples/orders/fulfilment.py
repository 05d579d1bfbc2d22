"""Order fulfilment: an orchestration for the web shop's orders (the JSON drop).

payments and order, in any order → ship → confirm; or cancel when not paid in time

- The payment gateway reports each capture as it happens (its own folder, possibly
  several parts for one order); the web shop exports its orders in batches later. So
  either may come first: both receives activate, correlated on ``orders.OrderId`` (a
  parallel convoy), and whichever comes first starts the instance.
- Once the order is known and paid in full, the instance publishes a ship request (the
  ``warehouse`` send port) and a confirmation (``confirmations``), and completes.
- An order not paid in full waits ``PAYMENT_TIMEOUT`` seconds for the rest; then it
  publishes a cancellation (``cancellations``, with what was paid, to refund) and
  completes. Payments with no order for ``ORDER_TIMEOUT`` seconds are cancelled the
  same way.

Nothing here races a timer against the machine's speed when the payments are received
before their orders (as ``demo.py`` drops them): an order's step sees every payment made
for it, so only the orders that are never paid in full wait, and those time out.
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel

from messagebox import Message
from messagebox.hosts import Delivery, Orchestration, activate, timeout
from messagebox.predicates import P

PAYMENT_TIMEOUT = float(os.environ.get("ORDERS_PAYMENT_TIMEOUT", "3"))
"""Seconds an order waits for the rest of its payment (short, so the demo shows it)."""
ORDER_TIMEOUT = 24 * 3600.0
"""Seconds a payment waits for its order before it is refunded."""


class OrderState(BaseModel):
    """What the instance remembers between messages."""

    ordered: bool = False
    region: str = ""
    customer: str = ""
    total: float = 0.0
    paid: float = 0.0
    payments: int = 0


class Fulfilment(Orchestration[OrderState]):
    """payments and order, in any order → ship → confirm (or cancel)."""

    name = "fulfilment"
    correlation = ("orders.OrderId",)

    @activate(
        (P("messagebox.MessageType") == "urn:orders#Order")
        & (P("messagebox.ReceiveLocationName") == "json-drop")
    )
    def order(self, msg: Delivery) -> None:
        order = json.loads(msg.body)
        self.state.ordered = True
        self.state.region = order["region"]
        self.state.customer = order.get("customer", "")
        self.state.total = float(order["total"])
        self._settle()

    @activate(P("messagebox.MessageType") == "urn:orders#Payment")
    def payment(self, msg: Delivery) -> None:
        amount = float(msg.properties["orders.Amount"])  # type: ignore[arg-type]
        self.state.paid = round(self.state.paid + amount, 2)
        self.state.payments += 1
        if self.state.ordered:
            self._settle()
        else:
            self.wait_for("order", timeout=ORDER_TIMEOUT)

    def _settle(self) -> None:
        """Ship a paid order; wait (again) for the rest of an unpaid one."""
        if self.state.paid + 0.005 < self.state.total:
            self.wait_for("payment", timeout=PAYMENT_TIMEOUT)
            return
        self.publish(self._document("ship", {"region": self.state.region}))
        self.publish(
            self._document("confirm", {"customer": self.state.customer, "paid": self.state.paid})
        )
        self.complete()

    @timeout("payment")
    def unpaid(self) -> None:
        reason = "paid in part" if self.state.paid else "unpaid"
        self.publish(self._document("cancel", {"paid": self.state.paid, "reason": reason}))
        self.complete()

    @timeout("order")
    def no_order(self) -> None:
        self.publish(self._document("cancel", {"paid": self.state.paid, "reason": "no order"}))
        self.complete()

    def _document(self, step: str, fields: dict[str, object]) -> Message:
        body = {"orderId": self.correlation_values["orders.OrderId"], "step": step, **fields}
        return Message(json.dumps(body), promoted={"orders.Step": step})
