"""Regression tests for bugs a review of orchestrations found (all fixed).

Each runs on both backends (``backend_url``) unless it says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from messagebox import Message, MessageBox
from messagebox.delivery import leases, service_instances
from messagebox.errors import BackendUnavailable
from messagebox.hosts import Delivery, Orchestration, activate, receive, timeout
from messagebox.models import INSTANCE_COMPLETED, ROUTING_FAILURE
from messagebox.predicates import P
from tests.integration.orchestration_support import eventually as wait_until
from tests.integration.orchestration_support import instance_rows, make_app, msg


class Conversation(BaseModel):
    seen: list[str] = []


# --- 1. a worker thread dies on an error outside the handler; its leases are kept ---


class Plain(Orchestration[Conversation]):
    name = "plain"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.seen.append("order")
        self.publish(Message(b"ok", promoted={"t.Kind": "handled"}))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_transient_store_error_while_loading_instances_does_not_strand_the_batch(
    backend_url: str, running, monkeypatch: pytest.MonkeyPatch
):
    # Given a host instance with one dequeue thread, and a store that fails once while
    # a step loads its instance (a dropped connection, a failover)
    app, sink = make_app(Plain, sink_kinds=("handled",), dequeue_threads=1)
    real_load = service_instances.load
    calls = {"n": 0}

    def flaky_load(conn, dialect, ids):
        calls["n"] += 1
        if calls["n"] == 1:
            raise BackendUnavailable("cannot reach the database (simulated)")
        return real_load(conn, dialect, ids)

    monkeypatch.setattr(service_instances, "load", flaky_load)
    host = running(app)
    box = MessageBox(backend_url, publisher="tests")
    try:
        # When an order is published (and a second one later)
        box.publish([msg("order", 1)])
        assert wait_until(lambda: calls["n"] >= 1, 30.0)
        box.publish([msg("order", 2)])
        # Then both are handled: the failed attempt is retried like any failure
        handled = wait_until(lambda: len(sink.orders("handled")) == 2, 30.0)
        alive = [t.is_alive() for t in host._parts.threads.running()]
        assert handled, f"handled {sink.orders('handled')}; dequeue threads alive: {alive}"
    finally:
        box.close()


# --- 2. timeouts are ignored when the database session's time zone is not UTC ---


class Waiting(BaseModel):
    paid: bool = False


class PaymentTimeout(Orchestration[Waiting]):
    name = "timeouts"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.wait_for("payment", timeout=0.2)

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.complete()

    @timeout("payment")
    def unpaid(self) -> None:
        self.publish(Message(b"cancel", promoted={"t.Kind": "cancel"}))
        self.complete()


@pytest.fixture
def paris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run as a machine in Paris: DuckDB takes TZ, libpq takes PGTZ (as a PostgreSQL
    server set up by initdb on such a machine would by default)."""
    monkeypatch.setenv("TZ", "Europe/Paris")
    monkeypatch.setenv("PGTZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_timeouts_fire_when_the_database_session_is_not_in_utc(paris: None, backend_url: str):
    # Given an orchestration waiting 0.2 s for a payment, on a database session whose
    # time zone is Europe/Paris
    app, sink = make_app(PaymentTimeout, sink_kinds=("cancel",), dequeue_threads=2)
    host = app.instance(backend_url)
    host.start()
    box = MessageBox(backend_url, publisher="tests")
    try:
        # When an order is never paid
        box.publish([msg("order", 1)])
        # Then its timeout runs and cancels it
        assert wait_until(lambda: host.stats.snapshot()["timers_fired"] == 1, 30.0)
        assert wait_until(lambda: sink.orders("cancel") == [1], 30.0), (
            f"the timer fired but the @timeout method never ran; instance states: "
            f"{[r.state for r in instance_rows(box)]}"
        )
    finally:
        host.stop(5.0)
        box.close()


# --- 3. a @receive message before an activating one in a batch loses its instance ---


class Fulfilment(Orchestration[Conversation]):
    name = "fulfilment"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        self.state.seen.append("order")

    @receive(P("t.Kind") == "payment")
    def payment(self, d: Delivery) -> None:
        self.state.seen.append("payment")


def test_a_receive_before_an_activation_in_one_batch_reaches_the_running_instance(
    backend_url: str,
):
    # Given a running instance for order 1 (routing made it with the first order)
    app, _ = make_app(Fulfilment, dequeue_threads=2)
    box = MessageBox(backend_url, publisher="tests")
    try:
        app.setup(box)
        [first] = box.publish([msg("order", 1)])
        assert len(first.subscriptions) == 1
        # When a batch carries a payment for order 1, then another order for it
        payment, _ = box.publish([msg("payment", 1), msg("order", 1, **{"t.N": 2})])
        # Then the payment goes to the running instance, like a payment published alone
        failures = box.suspended(reason=ROUTING_FAILURE)
        assert payment.subscriptions != (), f"routing failures: {failures}"
        assert failures == []
    finally:
        box.close()


# --- 4. a completing step's own activating publication is discarded as a zombie ---


class Round(BaseModel):
    pass


class Cycle(Orchestration[Round]):
    """Continue-as-new: each instance handles one round, then completes and publishes
    the next round for the same correlation value (a new instance)."""

    name = "cycle"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "round")
    def round(self, d: Delivery) -> None:
        n = int(d.properties["t.Round"])  # type: ignore[arg-type]
        self.publish(Message(b"", promoted={"t.Kind": "done", "t.Round": n}))
        if n < 3:
            self.publish(Message(b"", promoted={"t.Kind": "round", "t.Round": n + 1}))
        self.complete()


def test_a_completing_step_can_start_the_next_instance_of_its_correlation(
    backend_url: str, running
):
    # Given an orchestration that completes each round and publishes the next one
    app, sink = make_app(Cycle, sink_kinds=("done",), dequeue_threads=2)
    running(app)
    box = MessageBox(backend_url, publisher="tests")
    try:
        # When round 1 of order 9 is published
        box.publish([msg("round", 9, **{"t.Round": 1})])
        # Then rounds 1, 2 and 3 run, each in its own instance, and nothing is discarded
        wait_until(lambda: len(sink.orders("done")) >= 3, 30.0)
        zombies = box.suspended(reason=INSTANCE_COMPLETED)
        assert zombies == [], f"{len(zombies)} zombie(s): {zombies[0].error}"
        assert len(sink.orders("done")) == 3
        assert len(instance_rows(box)) == 3
    finally:
        box.close()


# --- 5. with a claim of one entry, instance heads always win ---


class Ticks(Orchestration[Conversation]):
    name = "ticks"
    correlation = ("t.OrderId",)

    @activate(P("t.Kind") == "tick")
    def tick(self, d: Delivery) -> None: ...


def test_a_single_entry_claim_does_not_starve_plain_entries(backend_url: str):
    # Given a host with an orchestration and a plain service, an older plain entry and
    # five instance heads
    app, _ = make_app(Ticks, sink_kinds=("plain",), dequeue_threads=2)
    box = MessageBox(backend_url, publisher="tests")
    try:
        app.setup(box)
        box.publish([Message(b"p", promoted={"t.Kind": "plain"})])
        box.publish([msg("tick", n) for n in range(5)])
        settings = box.host("orch").settings
        dialect = box.store.dialect
        # When the host claims one entry at a time, finishing each
        order: list[str] = []
        for _ in range(6):
            with box.store.transaction(serial=True) as conn:
                [c] = leases.claim(
                    conn,
                    dialect,
                    host="orch",
                    owner="me",
                    n=1,
                    lease_seconds=30,
                    ordered=False,
                    instances=True,
                )
                leases.finish(conn, dialect, "me", [c], [], settings, set())
            order.append("instance" if c.instance_id else "plain")
        # Then the plain entry (the oldest) is not served last
        assert order.index("plain") <= 1, order
    finally:
        box.close()
