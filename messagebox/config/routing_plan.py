"""A plan's effect on traffic: the stored messages of a recent window routed under the
live subscriptions and under a proposed configuration, compared per subscription.

Routing here is live routing's (:class:`~messagebox.predicates.index.FilterIndex`, the
evaluator the routing index publishes with), in this process; a :data:`Router` given by
the caller may route elsewhere (``messagebox.pipelines.whatif.spark_router``: Spark).
A destination is a subscription name; subscriptions that are unenlisted route nothing;
instance subscriptions made at run time (with an ``instance_id``) are the same on both
sides. An instance subscription with a correlation routes only while its instance runs:
here it counts as matching whenever its filter does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from messagebox.config.routing_file import RoutingConfig
from messagebox.models import State, Subscription
from messagebox.predicates import Filter
from messagebox.predicates.index import FilterIndex
from messagebox.properties import Value, decode_context
from messagebox.storage import schema, tracking

SAMPLES = 3
"""Message ids shown per gain, loss and failure change."""

Page = list[tuple[uuid.UUID, dict[str, Value]]]
Targets = Sequence[tuple[str, Filter]]
Changed = tuple[uuid.UUID, frozenset[str], frozenset[str]]
Router = Callable[[Iterable[Page], Targets, Targets], Iterable[Changed]]
"""Routes pages of messages under two sets of (name, filter) and yields each message
whose destinations differ: (id, names before, names after)."""


@dataclass
class SubscriptionEffect:
    """What one subscription would gain and lose over the window."""

    name: str
    gained: int = 0
    lost: int = 0
    gained_samples: list[uuid.UUID] = field(default_factory=list)
    lost_samples: list[uuid.UUID] = field(default_factory=list)


@dataclass
class TrafficEffect:
    """The window's messages routed before and after a change."""

    window_seconds: float
    messages: int = 0
    """Messages of the window evaluated (those still in the spool)."""
    changed: int = 0
    """Of them, those whose destinations would differ."""
    not_stored: int = 0
    """Messages tracked as published in the window but gone from the spool (cleaned up):
    not evaluated. Zero when tracking is off."""
    subscriptions: dict[str, SubscriptionEffect] = field(default_factory=dict)
    new_failures: int = 0
    """Messages that route now and would match nothing (routing failures)."""
    fixed_failures: int = 0
    """Messages that match nothing now and would route."""
    new_failure_samples: list[uuid.UUID] = field(default_factory=list)
    fixed_failure_samples: list[uuid.UUID] = field(default_factory=list)
    router: str = "python"

    def add(self, message: uuid.UUID, before: frozenset[str], after: frozenset[str]) -> None:
        self.changed += 1
        for name in after - before:
            effect = self.subscriptions.setdefault(name, SubscriptionEffect(name))
            effect.gained += 1
            if len(effect.gained_samples) < SAMPLES:
                effect.gained_samples.append(message)
        for name in before - after:
            effect = self.subscriptions.setdefault(name, SubscriptionEffect(name))
            effect.lost += 1
            if len(effect.lost_samples) < SAMPLES:
                effect.lost_samples.append(message)
        if before and not after:
            self.new_failures += 1
            if len(self.new_failure_samples) < SAMPLES:
                self.new_failure_samples.append(message)
        elif after and not before:
            self.fixed_failures += 1
            if len(self.fixed_failure_samples) < SAMPLES:
                self.fixed_failure_samples.append(message)

    def describe(self) -> list[str]:
        hours = self.window_seconds / 3600
        lines = [
            f"traffic: {self.messages:,} message(s) stored in the last {hours:g} h routed "
            f"again ({self.router}); {self.changed:,} would route differently"
        ]
        if self.not_stored:
            lines.append(
                f"  {self.not_stored:,} tracked message(s) of the window are no longer "
                "stored: not evaluated"
            )
        for e in sorted(self.subscriptions.values(), key=lambda e: e.name):
            lines.append(
                f"  {e.name}: gains {e.gained:,}{_samples(e.gained_samples)}, "
                f"loses {e.lost:,}{_samples(e.lost_samples)}"
            )
        if self.new_failures or self.fixed_failures:
            lines.append(
                f"  routing failures: {self.new_failures:,} new"
                f"{_samples(self.new_failure_samples)}, "
                f"{self.fixed_failures:,} no longer{_samples(self.fixed_failure_samples)}"
            )
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "window_seconds": self.window_seconds,
            "router": self.router,
            "messages": self.messages,
            "changed": self.changed,
            "not_stored": self.not_stored,
            "subscriptions": {
                e.name: {
                    "gained": e.gained,
                    "lost": e.lost,
                    "gained_samples": [str(m) for m in e.gained_samples],
                    "lost_samples": [str(m) for m in e.lost_samples],
                }
                for e in sorted(self.subscriptions.values(), key=lambda e: e.name)
            },
            "new_failures": self.new_failures,
            "fixed_failures": self.fixed_failures,
            "new_failure_samples": [str(m) for m in self.new_failure_samples],
            "fixed_failure_samples": [str(m) for m in self.fixed_failure_samples],
        }


def _samples(ids: list[uuid.UUID]) -> str:
    return f" (e.g. {', '.join(str(i) for i in ids)})" if ids else ""


def targets(live: Sequence[Subscription], wanted: RoutingConfig | None) -> Targets:
    """The (name, filter) of what routes: the live subscriptions, or the wanted ones
    with the live instance subscriptions made at run time."""
    if wanted is None:
        return [(s.name, s.filter) for s in live if s.state is not State.UNENLISTED]
    kept = [
        (s.name, s.filter)
        for s in live
        if s.instance_id is not None and s.state is not State.UNENLISTED
    ]
    declared = [
        (d.name, d.filter) for d in wanted.subscriptions.values() if d.state is not State.UNENLISTED
    ]
    return kept + declared


def route_in_process(pages: Iterable[Page], before: Targets, after: Targets) -> Iterator[Changed]:
    """The default :data:`Router`: both sets matched in this process."""
    old: FilterIndex[str] = FilterIndex()
    old.update(before)
    new: FilterIndex[str] = FilterIndex()
    new.update(after)
    for page in pages:
        for message_id, props in page:
            a, b = frozenset(old.match(props)), frozenset(new.match(props))
            if a != b:
                yield message_id, a, b


def window_page(conn: sa.Connection, since: datetime, after: uuid.UUID | None, limit: int) -> Page:
    """Up to ``limit`` messages published since ``since``, after ``after`` in id order."""
    s = schema.spool
    query = (
        sa.select(s.c.id, s.c.context)
        .where(s.c.published_at >= since)
        .order_by(s.c.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(s.c.id > after)
    return [(row.id, decode_context(row.context)[0]) for row in conn.execute(query)]


def window_count(conn: sa.Connection, since: datetime) -> int:
    s = schema.spool
    return int(
        conn.execute(sa.select(sa.func.count()).where(s.c.published_at >= since)).scalar_one()
    )


def not_stored(conn: sa.Connection, since: datetime) -> int:
    """Messages tracked as published since ``since`` that the spool no longer holds."""
    t, s = schema.tracking, schema.spool
    gone = (
        sa.select(sa.func.count(sa.distinct(t.c.msg)))
        .where(t.c.event == tracking.PUBLISHED, t.c.tracked_at >= since)
        .where(~sa.exists().where(s.c.id == t.c.msg))
    )
    return int(conn.execute(gone).scalar_one())
