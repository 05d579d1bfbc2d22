"""The timer loop and the steps of the same process: a step that sets a timer due
before the loop's next look wakes it (the timer fires on time, long before
``poll_max_seconds``); one due after that look does not (the loop would read the
store for nothing: orchestrations that wait with long time-outs cost it no read)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from messagebox import MessageBox
from messagebox.hosts import HostInstance
from messagebox.hosts.timers import TIMERS_LOOK_SECONDS
from tests.integration.orchestration_support import make_app, msg, wait_until
from tests.integration.test_orchestration import PaymentTimeout

LONG_POLL = 60.0
"""The loop's own looks are this far apart: a timeout that fires sooner was woken."""


class CountedEvent(threading.Event):
    """An event that counts how often it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


@pytest.fixture
def instance(backend_url: str) -> Iterator[list[HostInstance]]:
    made: list[HostInstance] = []
    yield made
    for inst in made:
        inst.stop(5.0)


def test_a_step_wakes_the_timer_loop_only_for_a_timer_due_before_its_next_look(
    box: MessageBox, backend_url: str, instance: list[HostInstance]
) -> None:
    # Given a host whose timer loop looks every minute, its wake-ups counted
    app, sink = make_app(PaymentTimeout, sink_kinds=("cancel",), poll_max_seconds=LONG_POLL)
    inst = app.instance(backend_url)
    wakes = inst._parts.timers.wake_event = CountedEvent()
    instance.append(inst.start())
    wait_until(lambda: inst._parts.timers.look_at < float("inf"), 30, "the loop to wait")
    # When an order waits an hour for its payment
    box.publish([msg("order", 1, **{"t.Wait": 3600.0})])
    wait_until(lambda: inst.stats.snapshot()["completed"] == 1, 30, "order 1's step")
    # Then its step set the timer without waking the loop (it looks well before)
    assert inst.queue.timer_set_before(float("inf"))
    assert wakes.sets == 0
    # When another order waits a fraction of a second
    box.publish([msg("order", 2, **{"t.Wait": 0.3})])
    # Then that step wakes the loop, and the order is cancelled long before its next look
    wait_until(lambda: sink.orders("cancel") == [2], LONG_POLL / 2, "order 2's timeout")
    assert wakes.sets >= 1
    assert inst.stats.snapshot()["timers_fired"] == 1


def test_on_duckdb_the_timer_loop_reads_the_timers_only_when_woken_or_due(
    box: MessageBox, backend_url: str, instance: list[HostInstance]
) -> None:
    """On DuckDB every timer is set by a step of this one process, which wakes the loop:
    its own looks are a minute apart whatever ``poll_max_seconds`` is (each cost a
    statement). Elsewhere another process may set one: it looks every
    ``poll_max_seconds``."""
    # Given a host instance whose poll_max_seconds is short
    app, sink = make_app(PaymentTimeout, sink_kinds=("cancel",), poll_max_seconds=0.2)
    inst = app.instance(backend_url)
    instance.append(inst.start())
    wait_until(lambda: inst._parts.timers.look_at < float("inf"), 30, "the loop to wait")
    # Then its next look is a minute away on DuckDB, poll_max_seconds away elsewhere
    ahead = inst._parts.timers.look_at - time.time()
    if box.one_process:
        assert ahead > TIMERS_LOOK_SECONDS - 10, ahead
    else:
        assert ahead <= 0.2 + 0.01, ahead
    # And a timer a step sets still fires on time
    box.publish([msg("order", 1, **{"t.Wait": 0.3})])
    wait_until(lambda: sink.orders("cancel") == [1], 20, "order 1's timeout")
