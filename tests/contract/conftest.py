"""The contract suite's store: one fixture, ``store``, parametrised over the in-memory
store (its time a :class:`~messagebox.memory.ManualClock`), DuckDB and PostgreSQL (real
time: short leases and condition waits). Each is a :class:`Harness`: the set-up a test
needs (hosts, subscriptions, publishing), host instances' ports
(:class:`~messagebox.port.HostStore`), and what the queues hold. PostgreSQL fails rather
than skips when ``CI=true`` and no server answers (``tests.conftest.scratch_url``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.clock import local_now
from messagebox.memory import ManualClock, MemoryConsumer, MemoryStore
from messagebox.message import Message
from messagebox.models import InstanceInfo, Routed, State, Subscription
from messagebox.port import HostStore
from messagebox.storage import schema
from tests.conftest import scratch_url

T = TypeVar("T")

WAIT_SECONDS = 15.0
"""The longest a condition wait lasts on a real backend (a loaded machine is slow)."""
STEP_SECONDS = 0.05
"""How far the memory store's clock moves between two looks of a condition wait."""


@dataclass(frozen=True)
class Row:
    """A queue entry as a test inspects it."""

    id: int
    sub: int
    state: str
    attempts: int
    order_key: str | None
    lease_owner: str | None


@dataclass(frozen=True)
class Parked:
    """A suspended entry as a test inspects it."""

    id: int
    sub: int | None
    reason: str
    resumable: bool
    holds_key: bool
    order_key: str | None


class Harness(Protocol):
    """A store under contract, as the scenarios drive it."""

    name: str

    def create_host(self, name: str, **settings: Any) -> None: ...

    def subscribe(
        self, service: str, *, host: str, filter: object, **options: Any
    ) -> Subscription: ...

    def publish(self, messages: list[Message], *, delay: float | None = None) -> list[Routed]: ...

    def port(self, host: str, owner: str, *, register: bool = True) -> HostStore: ...

    def queue(self, host: str) -> list[Row]: ...

    def suspended(self) -> list[Parked]: ...

    def sub_state(self, sub_id: int) -> State: ...

    def eventually(self, look: Callable[[], T], within: float = WAIT_SECONDS) -> T: ...


def info(host: str, owner: str) -> InstanceInfo:
    """A host instance's registration."""
    now = local_now()
    return InstanceInfo(owner, host, "contract", os.getpid(), now, now, "running")


class MemoryHarness:
    """The in-memory store; condition waits move its clock."""

    name = "memory"

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.box = MemoryStore(self.clock, publisher="tests")

    def create_host(self, name: str, **settings: Any) -> None:
        self.box.create_host(name, **settings)

    def subscribe(self, service: str, *, host: str, filter: object, **options: Any) -> Subscription:
        return self.box.subscribe(service, host=host, filter=filter, **options)

    def publish(self, messages: list[Message], *, delay: float | None = None) -> list[Routed]:
        return self.box.publish(messages, delay=delay)

    def port(self, host: str, owner: str, *, register: bool = True) -> HostStore:
        port = MemoryConsumer(self.box, host, owner)
        if register:
            port.register(info(host, owner))
        return port

    def queue(self, host: str) -> list[Row]:
        return [
            Row(e.id, e.sub, e.state, e.attempts, e.order_key, e.lease_owner)
            for e in self.box.entries(host)
        ]

    def suspended(self) -> list[Parked]:
        return [
            Parked(s.id, s.sub, s.reason, s.resumable, s.holds_key, s.order_key)
            for s in self.box.suspended()
        ]

    def sub_state(self, sub_id: int) -> State:
        return self.box.subscription(sub_id).state

    def eventually(self, look: Callable[[], T], within: float = WAIT_SECONDS) -> T:
        moved = 0.0
        while True:
            got = look()
            if got or moved >= within:
                return got
            self.clock.advance(STEP_SECONDS)
            moved += STEP_SECONDS


class SqlHarness:
    """A real store (DuckDB or PostgreSQL) through ``MessageBox``; condition waits poll."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.box = MessageBox(url, publisher="tests")

    def create_host(self, name: str, **settings: Any) -> None:
        self.box.create_host(name, **settings)

    def subscribe(self, service: str, *, host: str, filter: object, **options: Any) -> Subscription:
        return self.box.subscribe(service, host=host, filter=filter, **options)

    def publish(self, messages: list[Message], *, delay: float | None = None) -> list[Routed]:
        return self.box.publish(messages, delay=delay)

    def port(self, host: str, owner: str, *, register: bool = True) -> HostStore:
        port = self.box.consumer(host, owner)
        if register:
            port.register(info(host, owner))
        return port

    def queue(self, host: str) -> list[Row]:
        q = schema.queue
        with self.box.store.transaction() as conn:
            rows = conn.execute(
                sa.select(q.c.id, q.c.sub, q.c.state, q.c.attempts, q.c.order_key, q.c.lease_owner)
                .where(q.c.host == host)
                .order_by(q.c.id)
            ).all()
        return [Row(int(r[0]), int(r[1]), r[2], int(r[3]), r[4], r[5]) for r in rows]

    def suspended(self) -> list[Parked]:
        s = schema.suspended
        with self.box.store.transaction() as conn:
            rows = conn.execute(
                sa.select(
                    s.c.id, s.c.sub, s.c.reason, s.c.resumable, s.c.holds_key, s.c.order_key
                ).order_by(s.c.id)
            ).all()
        return [
            Parked(
                int(r[0]), None if r[1] is None else int(r[1]), r[2], bool(r[3]), bool(r[4]), r[5]
            )
            for r in rows
        ]

    def sub_state(self, sub_id: int) -> State:
        return self.box.subscription(sub_id).state

    def eventually(self, look: Callable[[], T], within: float = WAIT_SECONDS) -> T:
        deadline = time.monotonic() + within
        while True:
            got = look()
            if got or time.monotonic() >= deadline:
                return got
            time.sleep(0.02)


@pytest.fixture(params=["memory", "duckdb", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A fresh store of each kind, with a host ``h``."""
    if request.param == "memory":
        harness: Harness = MemoryHarness()
        harness.create_host("h")
        yield harness
        return
    with scratch_url(request.param, tmp_path) as url:
        sql = SqlHarness(request.param, url)
        try:
            sql.create_host("h")
            yield sql
        finally:
            sql.box.close()
