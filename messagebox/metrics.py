"""Prometheus metrics: counters of what this process did, and gauges read from the store.

Counters count what *this process* committed (Prometheus's model: each process is a
target, and ``sum()`` over targets gives the whole): a publisher counts what it
published and routed, a host instance what it delivered. They are fed by the one
event funnel, :func:`messagebox.storage.tracking.record`, when a store transaction commits, so
a rolled-back transaction counts nothing; tracking need not be enabled.

Gauges (queue depth, oldest entry, suspended entries, host instances and heartbeat
age) are read from the database at scrape time by :class:`StoreCollector`: any
process that can reach the database can serve them (``messagebox console`` does, at
``/metrics``; ``messagebox host run --metrics-port`` serves a host instance's).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter as Counts
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client import Metric

    from messagebox.ops.operations import Snapshot


class _Snapshots(Protocol):
    def snapshot(self) -> Snapshot: ...


class MessageBox(Protocol):
    """What the gauges read: a :class:`messagebox.MessageBox` (its operations). Typed
    so, because the store counts into this module: it cannot import the engine back."""

    @property
    def operations(self) -> _Snapshots: ...


PUBLISHED = Counter("messagebox_published", "Messages published (stored) by this process")
ROUTED = Counter(
    "messagebox_routed", "Queue entries made by routing (a message times a subscription)", ["host"]
)
ROUTING_FAILURES = Counter(
    "messagebox_routing_failures",
    "Published messages that matched no subscription (suspended or dropped by the policy)",
    ["outcome"],
)
DELIVERED = Counter("messagebox_delivered", "Deliveries completed", ["host"])
FAILED = Counter("messagebox_delivery_failures", "Failed delivery attempts", ["host"])
SUSPENDED = Counter("messagebox_suspended", "Entries moved to the suspended queue", ["reason"])
EXPIRED = Counter(
    "messagebox_expired",
    "Queue entries that expired before delivery (suspended as expired, or dropped)",
    ["subscription"],
)
RESUMED = Counter("messagebox_resumed", "Suspended entries resumed", ["host"])
TERMINATED = Counter("messagebox_terminated", "Suspended entries terminated", ["host"])
CLAIM_SECONDS = Histogram(
    "messagebox_claim_seconds",
    "Time one claim transaction takes (lease up to claim_batch entries)",
    ["host"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
CLAIM_LATENCY = Histogram(
    "messagebox_claim_latency_seconds",
    "From enqueue to first claim: how long an entry waited on its queue",
    ["host"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)

_BY_EVENT = {
    "published": PUBLISHED,
    "routed": ROUTED,
    "routing_failures": ROUTING_FAILURES,
    "delivered": DELIVERED,
    "failed": FAILED,
    "suspended": SUSPENDED,
    "expired": EXPIRED,
    "resumed": RESUMED,
    "terminated": TERMINATED,
}


def apply(counts: Counts[tuple[str, str]]) -> None:
    """Add a committed transaction's event counts to the counters."""
    for (event, label), n in counts.items():
        metric = _BY_EVENT.get(event)
        if metric is PUBLISHED:
            PUBLISHED.inc(n)
        elif metric is not None:
            metric.labels(label).inc(n)


def observe_claim(host: str, seconds: float, waits: list[float]) -> None:
    """Record one claim's duration and how long each first-attempt entry waited."""
    CLAIM_SECONDS.labels(host).observe(seconds)
    observe_many(CLAIM_LATENCY.labels(host), [max(wait, 0.0) for wait in waits])


def observe_handed(host: str, n: int) -> None:
    """Record entries a publish handed over to an idle host instance of its process: a
    claim of no time, on which they waited none."""
    observe_many(CLAIM_LATENCY.labels(host), [0.0] * n)


def observe_many(histogram: Histogram, values: list[float]) -> None:
    """``histogram.observe(v)`` for each value, with one update per bucket (a claim of
    100 entries made 100 locked updates: a tenth of a host instance's CPU at batch 100).
    Falls back to one observe each if the client's internals are not as expected."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if not values:
        return
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    for i, n in Counts(bisect_left(bounds, v) for v in values).items():
        buckets[i].inc(n)  # bounds end with +Inf: every value has a bucket
    total.inc(sum(values))


class StoreCollector(Collector):
    """Gauges read from the store at each scrape."""

    def __init__(self, box: MessageBox) -> None:
        self.box = box

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        queues, hosts, counts, ages = self.box.operations.snapshot()
        depth = GaugeMetricFamily(
            "messagebox_queue_depth",
            "Entries on a host's queue, by state (ready, held, blocked, leased, scheduled)",
            labels=["host", "state"],
        )
        oldest = GaugeMetricFamily(
            "messagebox_queue_oldest_seconds",
            "Age of the oldest entry on a host's queue (0 when empty)",
            labels=["host"],
        )
        per_host: dict[str, Counts[str]] = {h.name: Counts() for h in hosts}
        age: dict[str, float] = {}
        for row in queues:
            c = per_host.setdefault(row.host, Counts())
            c.update(
                ready=row.ready,
                held=row.held,
                blocked=row.blocked,
                leased=row.leased,
                scheduled=row.scheduled,
            )
            age[row.host] = max(age.get(row.host, 0.0), row.oldest_age_seconds)
        for host, c in sorted(per_host.items()):
            for state in ("ready", "held", "blocked", "leased", "scheduled"):
                depth.add_metric([host, state], c[state])
            oldest.add_metric([host], age.get(host, 0.0))
        suspended = GaugeMetricFamily(
            "messagebox_suspended_entries",
            "Entries on the suspended queue, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(counts.suspended.items()):
            suspended.add_metric([reason], n)
        instances = GaugeMetricFamily(
            "messagebox_host_instances", "Registered host instances", labels=["host"]
        )
        for h in hosts:
            instances.add_metric([h.name], h.instances)
        heartbeat = GaugeMetricFamily(
            "messagebox_heartbeat_age_seconds",
            "Seconds since a host instance's last heartbeat (database clock)",
            labels=["host", "instance"],
        )
        for host, instance, seconds in ages:
            heartbeat.add_metric([host, instance], seconds)
        yield depth
        yield oldest
        yield suspended
        yield GaugeMetricFamily(
            "messagebox_messages", "Messages in the spool", value=counts.messages
        )
        yield instances
        yield heartbeat
        yield GaugeMetricFamily(
            "messagebox_scrape_seconds",
            "Time reading the store's gauges took",
            value=time.monotonic() - started,
        )


class _ProcessCollector(Collector):
    """This process's counters: whatever the default registry holds."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def registry(box: MessageBox) -> CollectorRegistry:
    """A registry of this process's counters and ``box``'s gauges, to serve (for
    example with ``prometheus_client.start_http_server(port, registry=...)``)."""
    both = CollectorRegistry(auto_describe=False)
    both.register(_ProcessCollector())
    both.register(StoreCollector(box))
    return both


def exposition(box: MessageBox | None = None) -> tuple[bytes, str]:
    """The text exposition: this process's counters, and ``box``'s gauges when given.
    Returns the body and its content type."""
    return generate_latest(REGISTRY if box is None else registry(box)), CONTENT_TYPE_LATEST
