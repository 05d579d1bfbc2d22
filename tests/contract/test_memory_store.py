"""What only the in-memory store has: its clocks, its set-up and inspection, its wake-ups."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from messagebox import clock
from messagebox.errors import AlreadyExists, RoutingFailure
from messagebox.memory import ManualClock, MemoryConsumer, MemoryStore
from messagebox.message import Message
from messagebox.models import ROUTING_FAILURE, Outcome, State
from messagebox.predicates import P
from messagebox.steps import Step, TimerSpec
from tests.contract.conftest import info


def test_a_manual_clock_moves_only_when_told() -> None:
    start = datetime(2031, 5, 1, tzinfo=UTC)
    c = ManualClock(start)
    mono = c.monotonic()
    assert c.now() == start
    c.advance(2.5)
    assert c.now() == start + timedelta(seconds=2.5)
    assert c.monotonic() == mono + 2.5
    with pytest.raises(ValueError, match="does not go back"):
        c.advance(-1)
    c.set(start)  # the wall clock may jump back; the monotonic one does not
    assert c.now() == start
    assert c.monotonic() == mono + 2.5


def test_a_manual_clock_is_a_local_clock() -> None:
    c = ManualClock()
    with clock.use_local(c):
        assert clock.local_now() == c.now()


def _store() -> tuple[ManualClock, MemoryStore]:
    c = ManualClock()
    store = MemoryStore(c)
    store.create_host("h", message_ttl_seconds=10.0)
    return c, store


def test_a_message_no_subscription_takes_goes_by_the_routing_policy() -> None:
    _, store = _store()
    [suspended] = store.publish([Message(b"x")])
    assert suspended.outcome is Outcome.SUSPENDED
    assert [s.reason for s in store.suspended()] == [ROUTING_FAILURE]
    [dropped] = store.publish([Message(b"x")], policy="drop")
    assert dropped.outcome is Outcome.DROPPED
    with pytest.raises(RoutingFailure):
        store.publish([Message(b"x")], policy="raise")


def test_entries_expire_by_their_hosts_ttl_and_follow_their_state() -> None:
    c, store = _store()
    sub = store.subscribe("s", host="h", filter=P("a.K").exists())
    store.publish([Message(b"x", promoted={"a.K": 1})])
    [e] = store.entries("h")
    assert e.expires_at == c.now() + timedelta(seconds=10)
    store.set_state([sub.id], State.STOPPED)
    assert [x.state for x in store.entries("h")] == ["held"]
    store.set_state([sub.id], State.STARTED)
    assert [x.state for x in store.entries("h")] == ["ready"]


def test_publishing_wakes_the_hosts_watchers() -> None:
    _, store = _store()
    store.subscribe("s", host="h", filter=P("a.K").exists())
    port = MemoryConsumer(store, "h", "a")
    woken = threading.Event()
    stop = port.watch(woken.set)
    store.publish([Message(b"x", promoted={"a.K": 1})])
    assert woken.is_set()
    stop()
    woken.clear()
    store.publish([Message(b"x", promoted={"a.K": 1})])
    assert not woken.is_set()


def test_a_timer_set_by_a_step_wakes_the_timer_loop_and_is_hinted() -> None:
    c, store = _store()
    sub = store.subscribe("orch", host="h", filter=P("a.K").exists())
    store.publish([Message(b"x", promoted={"a.K": 1})])
    port = MemoryConsumer(store, "h", "a")
    port.register(info("h", "a"))
    [claim], _ = port.claim(1, 30.0, ordered=False, instances=False)
    woken = threading.Event()
    port.watch_timers(woken.set)
    due = c.now() + timedelta(seconds=5)
    step = Step("a", claim.id, "i1", "orch", "h", sub.id, None, {}, timers=[TimerSpec("t", due)])
    port.commit_steps([step], "p")
    assert woken.is_set()
    assert port.timer_set_before(due.timestamp() + 1)
    assert not port.timer_set_before(due.timestamp())
    assert port.next_due() == 5.0
    assert not port.timer_set_before(due.timestamp() + 1)  # looked at: the hint is spent
    assert [t.name for t in store.timers("h")] == ["t"]


def test_an_instance_registers_once_and_listens_until_stopped() -> None:
    _, store = _store()
    port = MemoryConsumer(store, "h", "a")
    assert port.register(info("h", "a")) == []
    with pytest.raises(AlreadyExists):
        port.register(info("h", "a"))
    assert (port.listens, port.claims_serialised, port.timers_set_here, port.outages) == (
        False,
        False,
        True,
        0,
    )
    stop = threading.Event()
    stop.set()
    port.listen(lambda: None, stop)  # returns at once: stop is set
