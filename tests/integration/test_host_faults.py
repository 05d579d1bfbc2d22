"""Host instances keep working through faults (issue 18): a handler that raises
``SystemExit`` or hangs, a store that cannot record outcomes or read a body, a message
that ends its process. Both backends; real processes where the fault is one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox import errors as mb_errors
from messagebox.delivery import leases as mb_leases
from messagebox.delivery import registry as mb_registry
from messagebox.errors import BackendUnavailable, Conflict, ValidationError
from messagebox.hosts import Delivery, HostInstance
from messagebox.models import CRASHED_HOST, DELIVERY_FAILURE, InstanceInfo
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import claim, wait_for
from tests.integration.test_delivery import FAST, msgs

ROOT = Path(__file__).resolve().parents[2]


def start(
    instances: list[HostInstance], box: MessageBox, services: dict[str, object], **settings: object
) -> HostInstance:
    inst = HostInstance(box, "h", services, settings={**FAST, **settings}).start()
    instances.append(inst)
    return inst


def setup_host(box: MessageBox, **settings: object) -> None:
    box.create_host("h", **{**FAST, **settings})
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="all")


def completed(box: MessageBox) -> Callable[[], bool]:
    return lambda: not box.queue_depth()


class Seen:
    """A thread-safe record of deliveries, by ``t.N``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: Counter[int] = Counter()

    def add(self, d: Delivery) -> int:
        n = int(d.properties["t.N"])  # type: ignore[arg-type]
        with self.lock:
            self.attempts[n] += 1
        return n


# --- D2: SystemExit and KeyboardInterrupt ---


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_handler_raising_a_base_exception_fails_its_entry_and_its_thread_goes_on(
    box: MessageBox, instances: list[HostInstance], raised: type[BaseException]
) -> None:
    setup_host(box, max_attempts=2)
    seen = Seen()

    def service(d: Delivery) -> None:
        if seen.add(d) == 3:
            raise raised()

    inst = start(instances, box, {"svc": service}, dequeue_threads=1, claim_batch=5)
    box.publish(msgs(20))
    wait_for(completed(box), what="every entry completed or suspended", timeout=30)
    [entry] = box.suspended()
    assert entry.reason == DELIVERY_FAILURE
    assert raised.__name__ in (entry.error or "")
    assert seen.attempts[3] == 2
    assert all(seen.attempts[n] == 1 for n in range(20) if n != 3)
    # counted once the recording commits, just after the queue empties
    wait_for(lambda: inst.stats.snapshot()["completed"] == 19, what="19 completions counted")


def test_a_dequeue_thread_that_fails_is_replaced(
    box: MessageBox, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something escaping the dequeue loop itself (an engine bug) ends the thread: it is
    logged, the supervisor starts another, and the batch is delivered again."""
    setup_host(box, lease_seconds=1.0)
    seen = Seen()
    inst = start(instances, box, {"svc": seen.add}, dequeue_threads=1, claim_batch=5)
    real = inst._parts.batches._deliver_run
    broken = {"left": 1}

    def fails_once(run: object) -> None:
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("an engine bug")
        real(run)  # type: ignore[arg-type]

    monkeypatch.setattr(inst._parts.batches, "_deliver_run", fails_once)
    box.publish(msgs(10))
    wait_for(completed(box), what="every entry completed", timeout=30)
    assert set(seen.attempts) == set(range(10))
    assert inst.stats.snapshot()["threads_replaced"] == 1


# --- D4: handler time-out ---


def test_a_hung_handler_is_abandoned_its_entry_fails_and_its_batch_goes_on(
    box: MessageBox, instances: list[HostInstance], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="messagebox.hosts")
    setup_host(box, max_attempts=2)
    seen = Seen()
    release = threading.Event()

    def service(d: Delivery) -> None:
        if seen.add(d) == 2:
            release.wait(60)

    try:
        inst = start(
            instances,
            box,
            {"svc": service},
            dequeue_threads=2,
            claim_batch=10,
            handler_timeout_seconds=0.5,
        )
        box.publish(msgs(10))
        wait_for(completed(box), what="every entry completed or suspended", timeout=30)
        [entry] = box.suspended()
        assert entry.reason == DELIVERY_FAILURE
        assert "did not return within 0.5 s" in (entry.error or "")
        assert seen.attempts[2] == 2
        assert all(seen.attempts[n] == 1 for n in range(10) if n != 2)
        # a worker counts its entries just after their commit, which the wait above saw
        wait_for(lambda: inst.stats.snapshot()["completed"] == 9, what="9 completions counted")

        # the supervisor replaces a thread after the suspension it committed (then logs it)
        def started() -> list[object]:
            return [r for r in caplog.records if getattr(r, "event", None) == "thread-started"]

        wait_for(lambda: len(started()) == 2, what="both replacements logged")
        stats = inst.stats.snapshot()
        assert stats["timed_out"] == 2
        assert stats["threads_replaced"] == 2
        assert stats["completed"] == 9
        # each replacement is logged as its event, and the supervisor never failed (a
        # field named "thread" clashed with the log record's own: KeyError, logged as a
        # supervisor failure at each replacement)
        events = [getattr(r, "event", None) for r in caplog.records]
        assert "supervisor-failed" not in events
        names = [str(getattr(r, "dequeue_thread", "")) for r in started()]
        assert all(n.startswith("h-dequeue-") for n in names), names
    finally:
        release.set()


def test_a_time_out_keeps_what_a_batching_service_did_in_its_batch(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """A service taking a batch at once (``handle_many``, as orchestrations do) has done
    its part when another handler of the same claimed batch times out: that is kept,
    not done again."""
    setup_host(box, max_attempts=1)
    box.subscribe("many", host="h", filter=P("t.N") >= 0, name="many")
    handled: Counter[int] = Counter()
    release = threading.Event()

    class Many:
        def handle(self, d: Delivery) -> None:
            self.handle_many([d])

        def handle_many(self, ds: list[Delivery]) -> list[Exception | None]:
            for d in ds:
                handled[int(d.properties["t.N"])] += 1  # type: ignore[arg-type]
            return [None] * len(ds)

    def hang(d: Delivery) -> None:
        if d.properties["t.N"] == 0:
            release.wait(60)

    try:
        start(
            instances,
            box,
            {"svc": hang, "many": Many()},
            dequeue_threads=1,
            claim_batch=10,
            handler_timeout_seconds=0.5,
        )
        box.publish(msgs(3))
        wait_for(completed(box), what="every entry completed or suspended", timeout=30)
        assert handled == Counter({0: 1, 1: 1, 2: 1})
        [entry] = box.suspended()
        assert "did not return within 0.5 s" in (entry.error or "")
    finally:
        release.set()


def test_hung_handlers_that_take_every_thread_stop_the_instance_not_stall_it(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    """A dependency that hangs every call: at most ``dequeue_threads`` abandoned
    handlers run beside the dequeue threads. One more, and the instance has no thread
    to give: it says so, stops (entries given back, unregistered) and ``run`` raises,
    rather than live on, heartbeating, delivering nothing (issue 55)."""
    setup_host(box, max_attempts=10)
    release = threading.Event()
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def service(d: Delivery) -> None:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        try:
            release.wait(60)
        finally:
            with lock:
                running["now"] -= 1

    inst = HostInstance(
        box,
        "h",
        {"svc": service},
        settings={**FAST, "dequeue_threads": 1, "claim_batch": 1, "handler_timeout_seconds": 0.3},
    )
    failure: list[BaseException] = []

    def run() -> None:
        try:
            inst.run(stop_timeout=2.0)
        except BaseException as exc:
            failure.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    try:
        box.publish(msgs(5))
        runner.start()
        wait_for(lambda: not runner.is_alive(), what="the exhausted instance to stop", timeout=30)
        [exc] = failure
        assert isinstance(exc, mb_errors.HostExhausted)
        assert "abandoned past handler_timeout_seconds" in str(exc)
        assert inst.exhausted == str(exc)
        assert inst.stats.snapshot()["timed_out"] == 2  # the 1 thread + 1 abandoned beyond it
        assert running["most"] == 2  # no third thread ever started
        assert box.instances() == []  # unregistered
        with box.store.transaction() as conn:  # nothing left leased: all back on the queue
            leased = conn.execute(
                sa.select(sa.func.count())
                .select_from(mb_schema.queue)
                .where(mb_schema.queue.c.lease_owner.is_not(None))
            ).scalar_one()
        assert leased == 0
        assert sum(q.depth for q in box.queue_depth()) == 5  # timed out: waiting to retry
    finally:
        release.set()


# --- D1: outcomes that could not be written ---


def test_outcomes_the_store_could_not_record_are_not_kept_leased(
    box: MessageBox, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses every completion for a while (longer than the instance's own
    retries): the entries must not stay leased for as long as the instance lives."""
    setup_host(box, lease_seconds=2.0)
    seen = Seen()
    real = mb_leases.finish
    outage = {"until": 0.0}

    def finish(*args: object, **kwargs: object) -> object:
        if time.monotonic() < outage["until"]:
            raise BackendUnavailable("the store is unreachable (test)")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mb_leases, "finish", finish)
    outage["until"] = time.monotonic() + 1.5
    inst = start(instances, box, {"svc": seen.add}, dequeue_threads=2, claim_batch=5)
    box.publish(msgs(20))
    wait_for(completed(box), what="the queue to drain while the instance runs", timeout=8)
    assert set(seen.attempts) == set(range(20))
    # the instance counts a batch after its commit: the queue can be empty a moment before
    wait_for(
        lambda: inst.stats.snapshot()["completed"] >= 20, what="20 completions counted", timeout=8
    )


def test_heartbeats_extend_only_the_leases_of_entries_in_flight(box: MessageBox) -> None:
    setup_host(box)
    box.publish(msgs(2))
    first, second = claim(box, "h", n=2, owner="me", lease_seconds=30)
    with box.store.transaction(serial=True) as conn:
        mb_registry.register(conn, _info("me"))
    q = mb_schema.queue

    def expires() -> dict[int, object]:
        with box.store.transaction() as conn:
            return dict(conn.execute(sa.select(q.c.id, q.c.lease_expires)).all())

    before = expires()
    with box.store.transaction(serial=True) as conn:
        assert mb_registry.heartbeat(conn, box.store.dialect, "me", 300, [first.id])
    after = expires()
    assert after[first.id] > before[first.id]  # type: ignore[operator]
    assert after[second.id] == before[second.id]


def _info(owner: str) -> InstanceInfo:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return InstanceInfo(
        id=owner,
        host="h",
        hostname="here",
        pid=os.getpid(),
        started_at=now,
        heartbeat_at=now,
        state="running",
    )


# --- D6: the store failing while a body is read ---


def test_a_store_failure_while_reading_the_body_does_not_use_up_attempts(
    box: MessageBox, instances: list[HostInstance], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_host(box, max_attempts=1)
    seen: list[bytes] = []
    failures = {"left": 3}
    real = box.read_messages

    def read_messages(*args: object, **kwargs: object) -> object:
        if failures["left"]:
            failures["left"] -= 1
            raise BackendUnavailable("the store is unreachable (test)")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(box, "read_messages", read_messages)
    inst = start(instances, box, {"svc": lambda d: seen.append(d.body)}, claim_batch=1)
    box.publish(msgs(1))
    wait_for(completed(box), what="the entry to complete", timeout=20)
    assert seen == [b"body 0"]
    assert box.suspended() == []
    assert inst.stats.snapshot()["engine_failures"] == 3


# --- D5: memory ---


def test_a_service_reading_only_properties_does_not_load_large_bodies(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    setup_host(box)
    body = os.urandom(20 << 20)
    for i in range(10):
        box.publish([Message(body, promoted={"t.N": i})])
    del body
    seen: list[int] = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        inst = start(
            instances,
            box,
            {"svc": lambda d: seen.append(int(d.properties["t.N"]))},
            dequeue_threads=2,
            claim_batch=10,
        )
        wait_for(completed(box), what="the queue to drain", timeout=60)
        inst.stop()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sorted(seen) == list(range(10))
    assert peak < 20 << 20, f"peak {peak / 2**20:.0f} MiB while handling 10 x 20 MiB bodies"


def test_a_batch_reads_small_bodies_together_and_large_ones_alone(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    setup_host(box)
    large = os.urandom(1 << 20)
    box.publish([Message(large, promoted={"t.N": 0}), *msgs(3)[1:]])
    bodies: dict[int, bytes] = {}

    def service(d: Delivery) -> None:
        bodies[int(d.properties["t.N"])] = d.body  # type: ignore[arg-type]

    start(instances, box, {"svc": service}, dequeue_threads=1, claim_batch=10)
    wait_for(completed(box), what="the queue to drain", timeout=20)
    assert bodies == {0: large, 1: b"body 1", 2: b"body 2"}


# --- D3: crash accounting ---


def lapse(box: MessageBox, owner: str) -> None:
    """End ``owner``'s leases as a dead instance's are ended (its process is gone)."""
    q = mb_schema.queue
    with box.store.transaction(serial=True) as conn:
        conn.execute(q.update().where(q.c.lease_owner == owner).values(lease_expires=sa.func.now()))


def test_only_a_delivery_marked_started_is_charged_when_its_host_ends(box: MessageBox) -> None:
    setup_host(box)
    box.publish(msgs(3))
    first, second, third = claim(box, "h", n=3, owner="dead-1")
    with box.store.transaction(serial=True) as conn:
        assert mb_leases.mark_started(conn, "dead-1", [first]) == 1
    lapse(box, "dead-1")
    again = {c.id: c for c in claim(box, "h", n=3, owner="next")}
    assert again[first.id].charges == 1
    assert again[first.id].crashed_by == "dead-1"
    assert again[second.id].charges == 0
    assert again[second.id].crashed_by is None
    assert all(c.interrupted and c.attempts == 2 for c in again.values())
    # an interrupted entry given back stays interrupted (and uncharged)
    with box.store.transaction(serial=True) as conn:
        mb_leases.give_back(conn, "next", [again[third.id]])
    [back] = claim(box, "h", n=1, owner="other")
    assert back.id == third.id
    assert back.interrupted
    assert back.charges == 0
    assert back.attempts == 2
    # a fresh one given back is not an interruption
    box.publish(msgs(1))
    [fresh] = claim(box, "h", n=1, owner="other")
    with box.store.transaction(serial=True) as conn:
        mb_leases.give_back(conn, "other", [fresh])
    [fresh_again] = claim(box, "h", n=1, owner="other")
    assert fresh_again.id == fresh.id
    assert not fresh_again.interrupted


def test_an_entry_whose_host_ended_max_attempts_times_is_suspended_as_crashed_host(
    box: MessageBox, instances: list[HostInstance]
) -> None:
    setup_host(box, max_attempts=2)
    box.publish(msgs(3))
    for n in range(2):
        claimed = claim(box, "h", n=3, owner=f"dead-{n}")
        poison = min(claimed, key=lambda c: c.id)  # t.N 0
        with box.store.transaction(serial=True) as conn:
            mb_leases.mark_started(conn, f"dead-{n}", [poison])
        lapse(box, f"dead-{n}")
    seen = Seen()
    inst = start(instances, box, {"svc": seen.add})
    wait_for(completed(box), what="the queue to drain", timeout=20)
    [entry] = box.suspended()
    assert entry.reason == CRASHED_HOST
    assert "dead-1" in (entry.error or "")
    assert sorted(seen.attempts) == [1, 2]  # the poison (t.N 0) is not delivered again
    assert inst.stats.snapshot()["crashed"] == 1
    assert box.resume(entry.id) == [entry.id]  # resumable once the cause is fixed
    wait_for(lambda: seen.attempts[0] == 1, what="the resumed entry delivered")


def test_a_message_that_ends_its_process_is_suspended_under_a_restart_loop(
    backend_url: str, tmp_path: Path
) -> None:
    """A supervisor restarts ``host run`` each time the poison message kills it: the
    poison is suspended (crashed-host) after max_attempts charged deliveries, the rest
    are all delivered, and nothing else is suspended. (On DuckDB only one process may
    open the store: the test looks at it between runs.)"""
    from tests.apps.poison import app

    with MessageBox(backend_url) as box:
        app.setup(box)
        box.publish(Message(b"x", promoted={"t.N": i, "t.Poison": i == 7}) for i in range(60))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "MB_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    command = [
        *(sys.executable, "-m", "messagebox.cli", "--url", backend_url),
        *("host", "run", "tests.apps.poison:app", "--log-level", "ERROR"),
    ]

    def lines() -> list[list[str]]:
        found: list[list[str]] = []
        for f in out.glob("*.log"):
            text = f.read_text()
            found.extend(line.split() for line in text[: text.rfind("\n") + 1].splitlines())
        return found

    exits = []
    for _ in range(8):
        with (out / "host.err").open("ab") as err:
            proc = subprocess.Popen(
                command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + 60
        seen, quiet_since = -1, time.monotonic()
        try:
            while proc.poll() is None:  # until it dies, or has had nothing to do for 4 s
                now = time.monotonic()
                assert now < deadline, "the host neither ended nor went quiet"
                found = lines()
                if len(found) != seen:
                    seen, quiet_since = len(found), now
                elif len({m for m, _, _ in found}) == 60 and now - quiet_since > 4:
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.terminate()
            exits.append(proc.wait(timeout=30))
        if exits[-1] != 3:
            break
    delivered = Counter(m for m, _, _ in lines())
    with MessageBox(backend_url) as box:
        suspended = box.suspended()
        assert [e.reason for e in suspended] == [CRASHED_HOST], (
            exits,
            (out / "host.err").read_text()[-3000:],
        )
        poison = str(suspended[0].message_id)
        assert exits.count(3) <= 4  # one uncharged (its batch was not marked) + 3 charged
        assert exits[-1] == 0
        assert delivered[poison] == exits.count(3)
        assert len(delivered) == 60  # every message reached its service
        assert box.queue_depth() == []


def test_hung_handlers_under_a_restart_loop_end_suspended_and_the_rest_delivered(
    backend_url: str, tmp_path: Path
) -> None:
    """Issue 55's round: 10 handlers that hang for ever among 400 messages, 4 threads,
    a handler time-out. Each process whose hung handlers take every thread it may add
    exits non-zero (1) at once, its entries given back; a supervisor restarts it. In the
    end the hung messages are suspended after max_attempts and every other message is
    delivered: no run stalls alive with work waiting."""
    from tests.apps.hang import app

    with MessageBox(backend_url) as box:
        app.setup(box)
        box.publish(Message(b"x", promoted={"t.N": i, "t.Hang": i % 40 == 7}) for i in range(400))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "MB_TEST_OUT": str(out), "PYTHONPATH": str(ROOT)}
    command = [
        *(sys.executable, "-m", "messagebox.cli", "--url", backend_url),
        *("host", "run", "tests.apps.hang:app", "--log-level", "CRITICAL"),
        *("--until-idle", "1"),
    ]
    exits = []
    errors = b""
    for _ in range(12):
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=120)
        exits.append(done.returncode)
        errors += done.stderr
        if done.returncode != 1:
            break
    delivered = Counter(
        line.split()[0] for f in out.glob("*.log") for line in f.read_text().splitlines()
    )
    assert exits[-1] == 0, (exits, errors.decode()[-3000:])
    assert set(exits[:-1]) <= {1}
    assert b"abandoned past handler_timeout_seconds" in errors
    with MessageBox(backend_url) as box:
        suspended = box.suspended()
        said = [(e.reason, e.attempts, (e.error or "")[:200]) for e in suspended]
        assert len(suspended) == 10, said
        assert all("did not return within 0.5 s" in (e.error or "") for e in suspended)
        assert [e.attempts for e in suspended] == [2] * 10, exits
        assert box.queue_depth() == []
        assert box.instances() == []
    assert len(delivered) == 390


# --- D7: heartbeat and completion ---


@pytest.mark.postgres
def test_a_heartbeat_skips_entries_a_completion_holds_instead_of_waiting(pg_url: str) -> None:
    """A heartbeat never waits for a row another transaction holds (the same
    instance's completion deleting it): waiting could deadlock with it."""
    with MessageBox(pg_url) as box:
        setup_host(box)
        box.publish(msgs(2))
        first, second = claim(box, "h", n=2, owner="me", lease_seconds=30)
        with box.store.transaction(serial=True) as conn:
            mb_registry.register(conn, _info("me"))
        q = mb_schema.queue
        with box.store.engine.connect() as holder:
            holder.execute(sa.select(q.c.id).where(q.c.id == first.id).with_for_update())
            with box.store.transaction(serial=True) as conn:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
                assert mb_registry.heartbeat(
                    conn, box.store.dialect, "me", 300, [first.id, second.id]
                )
            holder.rollback()
        with box.store.transaction() as conn:
            expires = dict(conn.execute(sa.select(q.c.id, q.c.lease_expires)).all())
        assert expires[second.id] > expires[first.id]


# --- a subscription naming a service the instance does not run (issue 21, item 4) ---


def test_a_mistyped_service_name_is_logged_at_start_and_named_in_the_suspension(
    box: MessageBox, instances: list[HostInstance], caplog: pytest.LogCaptureFixture
) -> None:
    box.create_host("h", **{**FAST, "max_attempts": 2})
    box.subscribe("bill-large", host="h", filter=P("t.N") >= 0, name="large")
    caplog.set_level("WARNING", logger="messagebox.hosts")
    inst = start(instances, box, {"bill_large": lambda d: None})
    [warned] = [r for r in caplog.records if getattr(r, "event", None) == "unserved-subscription"]
    assert warned.getMessage().endswith("Did you mean 'bill_large'? It runs: bill_large.")
    assert warned.service == "bill-large"  # type: ignore[attr-defined]
    assert "subscription 'large'" in warned.getMessage()
    box.publish(msgs(1))
    wait_for(completed(box), what="the entry suspended")
    [entry] = box.suspended()
    assert entry.reason == DELIVERY_FAILURE
    assert "service 'bill-large' is not registered" in (entry.error or "")
    assert "Did you mean 'bill_large'?" in (entry.error or "")
    inst._parts.subscriptions.refresh()  # a refresh does not warn again
    assert (
        len([r for r in caplog.records if getattr(r, "event", None) == "unserved-subscription"])
        == 1
    )


def test_a_host_set_to_refuse_does_not_start_an_instance_missing_a_service(
    box: MessageBox,
) -> None:
    box.create_host("h", **{**FAST, "unserved": "refuse"})
    box.subscribe("bill-large", host="h", filter=P("t.N") >= 0, name="large")
    inst = HostInstance(box, "h", {"bill_large": lambda d: None})
    with pytest.raises(Conflict, match="refuses to start") as refused:
        inst.start()
    assert "Did you mean 'bill_large'?" in str(refused.value)
    assert box.instances() == []  # it never registered
    box.set_service_state("bill-large", "unenlisted")  # nothing routes there any more
    inst.start()  # the same instance starts once nothing is left unserved
    try:
        assert [i.id for i in box.instances()] == [inst.id]
    finally:
        inst.stop(5.0)
    with pytest.raises(ValidationError, match="unserved"):
        box.configure_host("h", unserved="ignore")
