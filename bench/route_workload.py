"""The workloads of ``bench.route``: generated messages and subscriptions, with the
customer space sized so that a message matches a set number of subscriptions (its
fan-out) whatever N is.

- ``orders``: customer equality with a range, an exists, a second equality or nothing,
  some as two OR-ed groups, and a dozen broad ones; fan-out 10;
- ``mixed``: the operators ``orders`` barely uses: ``in`` lists of customers as the
  anchor, prefixes, bit masks, datetime upper bounds, ``not_exists``, ``!=``, ``<=`` and
  OR-ed groups mixing ranges with ``in``; fan-out 13;
- ``fanout1`` and ``fanout30``: ``orders`` with a fan-out of 1 and of 30.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from messagebox.message import Message
from messagebox.predicates import Filter, P, Predicate, to_filter

BATCH = 1_000
SEED = 20_240_601
TARGET_MATCHES = 10.0
HOSTS = ("orders-eu", "orders-us", "orders-apac", "audit")

# --- the message distribution (the pass probabilities below are exact for it) ---

REGIONS = (
    "EU-WEST", "EU-NORTH", "EU-SOUTH", "EU-EAST", "UK", "US-EAST", "US-WEST", "US-CENTRAL",
    "CA", "MX", "BR", "AR", "APAC-JP", "APAC-KR", "APAC-CN", "APAC-IN", "APAC-SG", "AU",
    "ZA", "ME",
)  # fmt: skip
CHANNELS = ("web", "mobile", "edi", "phone", "store")
TOTAL_MAX = 10_000.0  # orders.Total ~ uniform(0, TOTAL_MAX), two decimals
QTY_MAX = 100  # orders.Qty ~ uniform int 1..QTY_MAX
PRIORITIES = 10  # orders.Priority ~ uniform int 0..9
RUSH_PRESENT = 0.5  # orders.Rush is promoted on half the messages ...
RUSH_TRUE = 0.2  # ... and is True on a fifth of those
PLACED_START = datetime(2024, 1, 1, tzinfo=UTC)
PLACED_SPAN_S = 366 * 86_400  # orders.Placed ~ uniform second within 2024
SKUS = 100_000  # orders.Sku = "SKU-00000" .. "SKU-99999"


def rush_is_true() -> Predicate:
    """``orders.Rush == True`` (an equality on a bool, not a truth test)."""
    return P("orders.Rush") == True  # noqa: E712


def customer_id(i: int) -> str:
    return f"C{i:07d}"


def make_properties(rng: random.Random, customers: int) -> dict[str, object]:
    """One message's promoted properties."""
    props: dict[str, object] = {
        "orders.Region": rng.choice(REGIONS),
        "orders.Customer": customer_id(rng.randrange(customers)),
        "orders.Total": round(rng.uniform(0.0, TOTAL_MAX), 2),
        "orders.Qty": rng.randint(1, QTY_MAX),
        "orders.Priority": rng.randrange(PRIORITIES),
        "orders.Placed": PLACED_START + timedelta(seconds=rng.randrange(PLACED_SPAN_S)),
        "orders.Channel": rng.choice(CHANNELS),
        "orders.Flags": rng.getrandbits(8),
        "orders.Sku": f"SKU-{rng.randrange(SKUS):05d}",
    }
    if rng.random() < RUSH_PRESENT:
        props["orders.Rush"] = rng.random() < RUSH_TRUE
    return props


# --- subscriptions ---

Expr = Any  # a DSL expression: Predicate | And | Or
Template = Callable[[str], Expr]  # customer id -> filter expression


def _p_total_gt(t: float) -> float:
    return 1.0 - t / TOTAL_MAX


def _p_placed_ge(when: datetime) -> float:
    return 1.0 - (when - PLACED_START).total_seconds() / PLACED_SPAN_S


P_RUSH_TRUE = RUSH_PRESENT * RUSH_TRUE


def broad_subscriptions() -> list[tuple[Expr, float]]:
    """A dozen subscriptions not anchored on a customer, with their pass probabilities."""
    december = datetime(2024, 12, 24, tzinfo=UTC)
    return [
        (P("orders.Total") > 9_900.0, _p_total_gt(9_900.0)),
        (P("orders.Total") < 25.0, 25.0 / TOTAL_MAX),
        ((P("orders.Qty") >= QTY_MAX) & (P("orders.Priority") == 9), 1 / QTY_MAX / PRIORITIES),
        (P("orders.Placed") >= december, _p_placed_ge(december)),
        (P("orders.Sku").prefix("SKU-000"), 0.01),
        (P("orders.Sku").prefix("SKU-1234"), 0.001),
        (P("orders.Flags").bitwise_and(0x80) & (P("orders.Total") > 9_000.0), 0.5 * 0.1),
        (
            (P("orders.Region") == "EU-WEST")
            & (P("orders.Channel") == "edi")
            & (P("orders.Total") >= 5_000.0),
            1 / len(REGIONS) / len(CHANNELS) * 0.5,
        ),
        (
            P("orders.Rush").exists() & (P("orders.Priority") >= 9) & (P("orders.Total") > 9_500.0),
            RUSH_PRESENT * 0.1 * 0.05,
        ),
        ((P("orders.Channel") == "phone") & (P("orders.Qty") > 90), 1 / len(CHANNELS) * 0.1),
        (rush_is_true() & P("orders.Sku").prefix("SKU-9"), P_RUSH_TRUE * 0.1),
        (
            P("orders.Region").in_(["APAC-JP", "APAC-KR"]) & (P("orders.Total") > 9_990.0),
            2 / len(REGIONS) * 0.001,
        ),
    ]


def customer_template(rng: random.Random) -> tuple[Template, float]:
    """A customer-anchored filter (as a function of the customer) and its pass
    probability given that the customer matches."""
    c = P("orders.Customer")
    kind = rng.random()
    if kind < 0.35:  # equality + range on a round threshold
        t = float(rng.choice((0, 1_000, 2_500, 5_000, 7_500, 9_000)))
        return (lambda cid: (c == cid) & (P("orders.Total") > t)), _p_total_gt(t)
    if kind < 0.50:  # equality + exists
        return (lambda cid: (c == cid) & P("orders.Rush").exists()), RUSH_PRESENT
    if kind < 0.65:  # equality + int range
        k = rng.choice((0, 3, 5, 8))
        return (
            (lambda cid: (c == cid) & (P("orders.Priority") >= k)),
            (PRIORITIES - k) / PRIORITIES,
        )
    if kind < 0.75:  # equality + datetime range (from a month's start)
        when = datetime(2024, rng.randint(1, 12), 1, tzinfo=UTC)
        return (lambda cid: (c == cid) & (P("orders.Placed") >= when)), _p_placed_ge(when)
    if kind < 0.85:  # two equalities
        ch = rng.choice(CHANNELS)
        return (lambda cid: (c == cid) & (P("orders.Channel") == ch)), 1 / len(CHANNELS)
    if kind < 0.95:  # equality only
        return (lambda cid: c == cid), 1.0
    t = float(rng.choice((5_000, 9_000)))  # two groups
    p_either = 1.0 - (1.0 - _p_total_gt(t)) * (1.0 - P_RUSH_TRUE)
    return (
        lambda cid: ((c == cid) & (P("orders.Total") > t)) | ((c == cid) & rush_is_true())
    ), p_either


def mixed_template(rng: random.Random) -> tuple[Callable[[list[str]], Expr], float, int]:
    """A filter over the operators ``orders`` barely uses, as a function of the customer
    ids it names; its pass probability given that a named customer matches; and how
    many customers it names."""
    c = P("orders.Customer")
    kind = rng.random()
    if kind < 0.15:  # an in-list of three customers, with a prefix
        return (lambda ids: c.in_(ids) & P("orders.Region").prefix("EU")), 4 / len(REGIONS), 3
    if kind < 0.28:  # a bit mask
        mask = rng.choice((0x0F, 0x30, 0x81))
        p_mask = 1.0 - 0.5 ** bin(mask).count("1")
        return (lambda ids: (c == ids[0]) & P("orders.Flags").bitwise_and(mask)), p_mask, 1
    if kind < 0.40:  # a datetime upper bound
        when = datetime(2024, rng.randint(2, 12), 1, tzinfo=UTC)
        p_when = 1.0 - _p_placed_ge(when)
        return (lambda ids: (c == ids[0]) & (P("orders.Placed") < when)), p_when, 1
    if kind < 0.52:  # not_exists
        return (lambda ids: (c == ids[0]) & P("orders.Rush").not_exists()), 1 - RUSH_PRESENT, 1
    if kind < 0.66:  # a range OR an in-list
        t = float(rng.choice((2_500, 5_000, 9_000)))
        p_either = 1.0 - (1.0 - _p_total_gt(t)) * (1.0 - 2 / len(CHANNELS))
        return (
            (
                lambda ids: (
                    ((c == ids[0]) & (P("orders.Total") >= t))
                    | ((c == ids[0]) & P("orders.Channel").in_(["edi", "phone"]))
                )
            ),
            p_either,
            1,
        )
    if kind < 0.78:  # not-equal
        return (lambda ids: (c == ids[0]) & (P("orders.Channel") != "web")), 0.8, 1
    if kind < 0.90:  # an int upper bound
        q = rng.choice((10, 50, 90))
        return (lambda ids: (c == ids[0]) & (P("orders.Qty") <= q)), q / QTY_MAX, 1
    digit = str(rng.randrange(10))  # a prefix on a second property
    return (lambda ids: (c == ids[0]) & P("orders.Sku").prefix(f"SKU-{digit}")), 0.1, 1


WORKLOADS = {"orders": 10.0, "mixed": 13.0, "fanout1": 1.0, "fanout30": 30.0}
"""Each workload and the matches a message has on average (its fan-out)."""


@dataclass(frozen=True)
class Workload:
    name: str
    n: int
    customers: int
    expected_matches: float
    specs: list[dict[str, Any]]  # subscribe_many's input
    filters: list[Filter]  # the same filters, normalised, for the naive loop
    warmup: list[Message]
    messages: list[Message]
    properties: list[dict[str, object]]  # the raw properties of ``messages``


def _first(template: Template) -> Callable[[list[str]], Expr]:
    return lambda ids: template(ids[0])


def quiet_lint() -> None:
    """Silence the lint warnings of subscribing: a random workload draws some filters
    twice for one service (each then delivered twice), on purpose, and the warnings
    (one a pair, 60 of them at N=100,000) buried the bench's own output."""
    logging.getLogger("messagebox.lint").setLevel(logging.ERROR)


def make_workload(n: int, n_messages: int, seed: int, name: str = "orders") -> Workload:
    """N subscriptions and the messages to publish, the same for every backend."""
    target = WORKLOADS[name]
    tag = "" if name == "orders" else f":{name}"  # orders draws as it always did
    rng = random.Random(f"{seed}:subscriptions:{n}{tag}")
    broad = broad_subscriptions()[: max(0, n // 8)]  # tiny N stay mostly customer-anchored
    broad_p = sum(p for _, p in broad)
    # each template: a filter of the customer ids it names, its pass probability, how many
    if name == "mixed":
        templates = [mixed_template(rng) for _ in range(n - len(broad))]
    else:
        templates = [
            (_first(t), p, 1) for t, p in (customer_template(rng) for _ in range(n - len(broad)))
        ]
    customer_p = sum(p * k for _, p, k in templates)
    customers = max(1, round(customer_p / max(target - broad_p, 0.1)))
    exprs = [e for e, _ in broad] + [
        t([customer_id(rng.randrange(customers)) for _ in range(k)]) for t, _, k in templates
    ]
    specs = [
        {"service": f"svc-{i % 997:03d}", "host": HOSTS[i % len(HOSTS)], "filter": e}
        for i, e in enumerate(exprs)
    ]
    filters = [to_filter(e) for e in exprs]

    mrng = random.Random(f"{seed}:messages:{n}{tag}")
    props = [make_properties(mrng, customers) for _ in range(BATCH + n_messages)]
    built = [
        Message(f'<order n="{i}" customer="{p["orders.Customer"]}"/>'.encode(), promoted=p)
        for i, p in enumerate(props)
    ]
    return Workload(
        name=name,
        n=n,
        customers=customers,
        expected_matches=broad_p + customer_p / customers,
        specs=specs,
        filters=filters,
        warmup=built[:BATCH],
        messages=built[BATCH:],
        properties=props[BATCH:],
    )
