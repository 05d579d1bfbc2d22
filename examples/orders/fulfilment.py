"""Order fulfilment: an orchestration for the web shop's orders (the JSON drop).

order → wait for payment (or time out) → ship → confirm

- An order from the web shop starts an instance, correlated on ``orders.OrderId``.
- Payments arrive in their own folder, possibly in several parts; the instance adds
  them up. Once the order is paid in full it publishes a ship request (the
  ``warehouse`` send port) and then a confirmation (``confirmations``), and completes.
- No full payment within ``PAYMENT_TIMEOUT`` seconds: it publishes a cancellation
  (``cancellations``) and completes. A payment that comes later finds no instance: it
  is a routing failure, suspended for an operator.
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel

from hosts import Delivery, Orchestration, activate, receive, timeout
from messagebox import Message
from predicates import P

PAYMENT_TIMEOUT = float(os.environ.get("ORDERS_PAYMENT_TIMEOUT", "3"))
"""Seconds an order waits for its payment (short, so the demo shows timeouts)."""


class OrderState(BaseModel):
    """What the instance remembers between messages."""

    region: str = ""
    customer: str = ""
    total: float = 0.0
    paid: float = 0.0
    payments: int = 0


class Fulfilment(Orchestration[OrderState]):
    """order → wait for payment (or time out) → ship → confirm."""

    name = "fulfilment"
    correlation = ("orders.OrderId",)

    @activate(
        (P("messagebox.MessageType") == "urn:orders#Order")
        & (P("messagebox.ReceiveLocationName") == "json-drop")
    )
    def order(self, msg: Delivery) -> None:
        order = json.loads(msg.body)
        self.state.region = order["region"]
        self.state.customer = order.get("customer", "")
        self.state.total = float(order["total"])
        self.wait_for("payment", timeout=PAYMENT_TIMEOUT)

    @receive(P("messagebox.MessageType") == "urn:orders#Payment")
    def payment(self, msg: Delivery) -> None:
        amount = float(msg.properties["orders.Amount"])  # type: ignore[arg-type]
        self.state.paid = round(self.state.paid + amount, 2)
        self.state.payments += 1
        if self.state.paid + 0.005 < self.state.total:
            self.wait_for("payment", timeout=PAYMENT_TIMEOUT)  # a part: wait for the rest
            return
        self.publish(self._document("ship", {"region": self.state.region}))
        self.publish(
            self._document("confirm", {"customer": self.state.customer, "paid": self.state.paid})
        )
        self.complete()

    @timeout("payment")
    def unpaid(self) -> None:
        self.publish(self._document("cancel", {"paid": self.state.paid, "reason": "unpaid"}))
        self.complete()

    def _document(self, step: str, fields: dict[str, object]) -> Message:
        body = {"orderId": self.correlation_values["orders.OrderId"], "step": step, **fields}
        return Message(json.dumps(body), promoted={"orders.Step": step})
