"""Order routing on the embedded default (DuckDB): hosts, subscriptions, one batch.

Run with ``make demo`` (or ``python examples/orders/demo.py [URL]``).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from messagebox import Message, MessageBox
from predicates import P

REGIONS = ["EU", "US", "APAC", "LATAM"]


def order_xml(n: int, region: str, total: float, priority: int) -> bytes:
    return (
        f'<Order xmlns="urn:orders"><Id>{n}</Id><Region>{region}</Region>'
        f"<Total>{total:.2f}</Total><Priority>{priority}</Priority></Order>"
    ).encode()


def main(url: str | None = None) -> None:
    if url is None:
        url = f"duckdb:///{Path(tempfile.mkdtemp(prefix='messagebox-demo-')) / 'orders.duckdb'}"
    box = MessageBox(url, publisher="demo")
    print(f"MessageBox at {url}\n")

    for host in ("shipping", "billing", "audit"):
        box.create_host(host)
    subs = box.subscribe_many(
        [
            {"service": "ship-eu", "host": "shipping", "filter": P("orders.Region") == "EU"},
            {
                "service": "ship-americas",
                "host": "shipping",
                "filter": P("orders.Region").in_(["US", "LATAM"]),
            },
            {
                "service": "bill-large",
                "host": "billing",
                "filter": (P("orders.Total") >= 10_000)
                & (P("BTS.MessageType") == "urn:orders#Order"),
            },
            {
                "service": "expedite",
                "host": "shipping",
                "filter": (P("orders.Priority") >= 8) | P("orders.Rush").exists(),
            },
            {
                "service": "audit-apac",
                "host": "audit",
                "filter": (P("orders.Region") == "APAC") & (P("orders.Total") > 5_000),
            },
        ]
    )
    names = {s.id: s.service for s in subs}
    for s in subs:
        print(f"  subscription {s.service:<14} on {s.host:<9} {s.filter}")

    rng = random.Random(7)
    batch = []
    for n in range(1, 21):
        region = rng.choice(REGIONS)
        total = round(rng.lognormvariate(8, 1.2), 2)
        priority = rng.randint(1, 9)
        promoted: dict[str, object] = {
            "BTS.MessageType": "urn:orders#Order",  # set by a (trusted) receive location
            "orders.Region": region,
            "orders.Total": total,
            "orders.Priority": priority,
        }
        if rng.random() < 0.1:
            promoted["orders.Rush"] = True
        batch.append(Message(order_xml(n, region, total, priority), promoted=promoted))

    start = time.perf_counter()
    results = box.publish(batch, trusted=True)
    elapsed = time.perf_counter() - start

    print(f"\nPublished {len(batch)} orders in one transaction ({elapsed * 1000:.1f} ms):\n")
    print(f"  {'order':>5}  {'region':<6} {'total':>10} {'prio':>4}  routed to")
    for n, (message, routed) in enumerate(zip(batch, results, strict=True), start=1):
        p = message.promoted
        targets = ", ".join(names[s] for s in routed.subscriptions) or f"({routed.outcome.value})"
        print(
            f"  {n:>5}  {p['orders.Region']:<6} {p['orders.Total']:>10.2f} "
            f"{p['orders.Priority']:>4}  {targets}"
        )

    print("\nQueue depth per host and subscription:")
    for d in box.queue_depth():
        print(f"  {d.host:<9} {names[d.subscription]:<14} {d.depth:>3}")
    suspended = box.suspended()
    print(f"\nSuspended (routing failures): {len(suspended)}")
    for e in suspended:
        print(f"  {e.message_id}  {e.report and e.report['properties']}")
    box.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
