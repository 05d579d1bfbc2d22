"""Orchestrations in real ``messagebox host run`` processes (docs/concepts.md: Orchestrations).

A host killed mid-step and restarted resumes every instance from its saved state
without publishing anything twice; first messages for one correlation value published
at the same moment by several processes make one instance, which receives all of them.
The app is ``tests.apps.orchestrator``.

Two bugs found on the way have regression tests at the end: opening a MessageBox on a
busy PostgreSQL database deadlocked with (or stalled) the running hosts, and a message
committed late with an older entry id let two steps of one instance run at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.claims import Claim
from messagebox.delivery import leases
from messagebox.errors import MessageBoxError
from messagebox.models import HostSettings, Outcome, RoutingPolicy
from messagebox.properties import decode_value
from messagebox.routing import router
from messagebox.storage import schema
from messagebox.storage.ids import uuid7
from tests.conftest import claim

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.orchestrator:app"
HOST = "orchestrator"
DECLARED = {"Fulfilment.order", "Fulfilment.payment", "sink"}
N_CONVERSATIONS = 200
N_PUBLISHERS = 4
N_CONTENDED = 50
PUBLISHER = (
    "import json, sys\n"
    "from tests.apps.orchestrator import publish_orders\n"
    "publish_orders(sys.argv[1], json.loads(sys.argv[2]))\n"
)


def start(url: str, out: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "messagebox.cli",
                "--url",
                url,
                "host",
                "run",
                APP,
                "--log-level",
                "WARNING",
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT), "MB_TEST_OUT": str(out), **env},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def wait_for(condition, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def sink_lines(out: Path) -> list[list[str]]:
    """[kind, order id, message id, body] per delivery the sink recorded."""
    text = out.read_text()
    # a line still being appended is read next time
    return [line.split(" ", 3) for line in text[: text.rfind("\n") + 1].splitlines()]


def distinct(out: Path) -> dict[tuple[str, str], set[str]]:
    """Distinct message ids per (kind, order id): redeliveries of a message collapse."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for kind, order_id, message_id, _ in sink_lines(out):
        seen[(kind, order_id)].add(message_id)
    return seen


def service_instances(box: MessageBox) -> list[dict[str, Any]]:
    si = schema.service_instance
    with box.store.transaction() as conn:
        rows = conn.execute(sa.select(si).order_by(si.c.id)).all()
    return [
        {
            "id": r.id,
            "order": decode_value(json.loads(r.correlation)["t.OrderId"]),
            "state": r.state,
            "version": r.version,
            **json.loads(r.data)["state"],
        }
        for r in rows
    ]


def convoys(box: MessageBox) -> list[str]:
    """The instance id of each convoy row."""
    with box.store.transaction() as conn:
        return list(conn.execute(sa.select(schema.convoy.c.instance_id)).scalars())


def timers(box: MessageBox) -> int:
    with box.store.transaction() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(schema.timer)).scalar_one())


def conversation_messages(n: int, rng: random.Random) -> list[Message]:
    """An order then a payment per conversation, the conversations interleaved."""
    pending = {f"O{c:03d}": ["order", "payment"] for c in range(n)}
    messages = []
    while pending:
        order_id = rng.choice(sorted(pending))
        kind = pending[order_id].pop(0)
        if not pending[order_id]:
            del pending[order_id]
        messages.append(Message(kind.encode(), promoted={"t.Kind": kind, "t.OrderId": order_id}))
    return messages


def test_killed_orchestration_resumes_without_duplicate_publish(backend_url: str, tmp_path: Path):
    # What this catches: a step commits its effects with the removal of its message,
    # and its messages get ids derived from (instance, version). Were a step's publish
    # stored on its own (say through box.publish in the handler, or in a transaction
    # before the queue entry is deleted), the host dying in step 37 right after
    # publishing would leave that message stored while its order or payment stays
    # queued; the next host would run the step again and publish it again under another
    # id: two distinct ship-request (or confirm) ids for one conversation. Were a
    # redelivered step able to commit on top of a committed one (no lease or version
    # check), an instance's version would exceed 2. Were an instance's messages not
    # handled in publish order, a payment handled first would find no order in the
    # state and its confirm body would not read "order,payment".
    from tests.apps.orchestrator import app

    out, log = tmp_path / "sink.txt", tmp_path / "hosts.log"
    out.touch()
    seed = random.randrange(2**32)
    print(f"conversation order seed: {seed}")  # shown on failure, to replay the order
    rng = random.Random(seed)
    orders = {f"O{c:03d}" for c in range(N_CONVERSATIONS)}

    # Given the app's subscriptions, and an order then a payment for each of 200
    # conversations, interleaved, published in 4 batches before any host runs
    messages = conversation_messages(N_CONVERSATIONS, rng)
    with MessageBox(backend_url, publisher="tests") as box:
        app.setup(box)
        for first in range(0, len(messages), 100):
            routed = box.publish(messages[first : first + 100])
            assert {r.outcome for r in routed} == {Outcome.ROUTED}

    # When a host dies inside its 37th step, after publishing, before the commit
    began = time.monotonic()
    first_host = start(backend_url, out, log, MB_TEST_CRASH_STEP="37")
    assert first_host.wait(60) == 9, log.read_text()[-3000:]
    after_crash = len(sink_lines(out))
    assert after_crash <= 36
    # and the next host is SIGKILLed at a random moment once it has made progress
    second_host = start(backend_url, out, log)
    target = after_crash + rng.randint(40, 160)
    wait_for(lambda: len(sink_lines(out)) >= target, 60, "the second host's progress", log)
    second_host.send_signal(signal.SIGKILL)
    second_host.wait(10)
    # and a third host finishes the work
    third_host = start(backend_url, out, log)
    try:
        wait_for(
            lambda: len(distinct(out)) == 2 * N_CONVERSATIONS,
            90,
            "every ship-request and confirm",
            log,
        )
    finally:
        third_host.send_signal(signal.SIGTERM)
        assert third_host.wait(30) == 0, log.read_text()[-3000:]
    print(f"hosts ran {time.monotonic() - began:.1f} s; {len(sink_lines(out))} sink lines")

    # Then each conversation got exactly one ship-request and one confirm (by message id)
    seen = distinct(out)
    assert set(seen) == {(k, o) for k in ("ship-request", "confirm") for o in orders}
    assert {key: ids for key, ids in seen.items() if len(ids) != 1} == {}
    # and every instance handled its order, then its payment
    bodies = {(o, body) for kind, o, _, body in sink_lines(out) if kind == "confirm"}
    assert bodies == {(o, "order,payment") for o in orders}
    with MessageBox(backend_url) as box:
        rows = service_instances(box)
        assert sorted(r["order"] for r in rows) == sorted(orders)  # one instance each
        assert {r["state"] for r in rows} == {"completed"}
        assert {r["version"] for r in rows} == {2}  # two steps each, none committed twice
        assert {tuple(r["kinds"]) for r in rows} == {("order", "payment")}
        # and completing left no subscription naming an instance, no convoy, no timer
        subs = box.subscriptions()
        assert {s.name for s in subs} == DECLARED
        assert [s.name for s in subs if s.instance_id is not None] == []
        assert convoys(box) == []
        assert timers(box) == 0
        # and nothing is suspended; all that may be left queued is the redelivery to the
        # sink of messages it recorded (handled by the SIGKILLed host, not yet completed)
        assert box.suspended() == []
        q = schema.queue
        with box.store.transaction() as conn:
            left = conn.execute(sa.select(q.c.sub, q.c.msg)).all()
        recorded = {message_id for _, _, message_id, _ in sink_lines(out)}
        assert {sub for sub, _ in left} <= {box.subscription("sink").id}
        assert {str(msg) for _, msg in left} <= recorded


def test_concurrent_first_messages_in_several_processes_create_one_instance(
    pg_url: str, tmp_path: Path
):
    # What this catches: routing finds or creates the convoy row of a correlation value
    # in the publish's transaction (INSERT … ON CONFLICT on PostgreSQL). Were the
    # instance looked up and created in separate statements, or outside the publish's
    # transaction, publishers racing on one OrderId would each make an instance: more
    # than 50 instance rows or convoy rows, and fewer than 4 orders in some instance.
    # (Every MessageBox here is opened while nothing else writes; opening one on a busy
    # PostgreSQL database used to deadlock, see the regression test below.)
    from tests.apps.orchestrator import app

    out, log = tmp_path / "sink.txt", tmp_path / "hosts.log"
    out.touch()
    order_ids = [f"C{n:03d}" for n in range(N_CONTENDED)]
    box = MessageBox(pg_url, publisher="tests")
    publishers: list[subprocess.Popen[bytes]] = []
    host = None
    try:
        # Given the orchestration's subscriptions, 4 publisher processes ready to send
        # first orders for the same 50 OrderIds, and a host running the orchestration
        app.setup(box)
        publishers = [
            subprocess.Popen(
                [sys.executable, "-c", PUBLISHER, pg_url, json.dumps(order_ids)],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(N_PUBLISHERS)
        ]
        for p in publishers:
            assert p.stdout is not None
            assert p.stdout.readline() == b"ready\n", p.communicate(timeout=10)[1].decode()
        host = start(pg_url, out, log)
        wait_for(lambda: box.instances(HOST) != [], 30, "the host to start", log)

        # When the 4 processes publish them from the same moment on, in the same order,
        # each order in its own transaction
        start_at = time.time() + 0.3
        for p in publishers:
            assert p.stdin is not None
            p.stdin.write(f"{start_at}\n".encode())
            p.stdin.flush()
        published: dict[str, set[str]] = defaultdict(set)
        for p in publishers:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr.decode()[-3000:]
            for line in stdout.decode().splitlines():
                order_id, message_id = line.split()
                published[order_id].add(message_id)
        assert sum(len(ids) for ids in published.values()) == N_PUBLISHERS * N_CONTENDED
        # and the host handles every order, and the sink every ship-request
        wait_for(
            lambda: (
                sum(len(r["messages"]) for r in service_instances(box))
                >= N_PUBLISHERS * N_CONTENDED
                and sum(len(ids) for ids in distinct(out).values()) >= N_PUBLISHERS * N_CONTENDED
            ),
            60,
            "every order and ship-request to be handled",
            log,
        )
    finally:
        for p in publishers:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        if host is not None:
            host.send_signal(signal.SIGTERM)
            assert host.wait(30) == 0, log.read_text()[-3000:]
        box.close()

    # Then each OrderId has exactly one instance, which received all 4 of its orders
    with MessageBox(pg_url) as box:
        rows = service_instances(box)
        assert sorted(r["order"] for r in rows) == order_ids
        assert {r["order"]: set(r["messages"]) for r in rows} == published
        assert {tuple(r["kinds"]) for r in rows} == {("order",) * N_PUBLISHERS}
        assert {r["state"] for r in rows} == {"running"}
        assert {r["version"] for r in rows} == {N_PUBLISHERS}
        # and one convoy row per OrderId, naming that instance
        assert sorted(convoys(box)) == sorted(r["id"] for r in rows)
        assert box.suspended() == []
        assert box.queue_depth() == []
    # and each instance's four steps each published one ship-request
    seen = distinct(out)
    assert {key: len(ids) for key, ids in seen.items()} == {
        ("ship-request", o): N_PUBLISHERS for o in order_ids
    }


def test_opening_a_messagebox_while_a_host_works_neither_fails_nor_blocks(
    pg_url: str, tmp_path: Path
):
    # Starting a host instance beside running ones, or running the CLI, opens a
    # MessageBox on a database that others are publishing to and consuming from.
    from tests.apps.orchestrator import app

    out, log = tmp_path / "sink.txt", tmp_path / "hosts.log"
    out.touch()
    box = MessageBox(pg_url, publisher="tests")
    app.setup(box)
    host = start(pg_url, out, log)
    stop = threading.Event()

    def traffic() -> None:
        n = 0
        while not stop.is_set():
            batch = [
                Message(kind.encode(), promoted={"t.Kind": kind, "t.OrderId": f"T{n + i}"})
                for i in range(10)
                for kind in ("order", "payment")
            ]
            with contextlib.suppress(MessageBoxError):  # a deadlock victim
                box.publish(batch)
            n += 10
            time.sleep(0.01)

    publisher = threading.Thread(target=traffic, daemon=True)
    try:
        wait_for(lambda: box.instances(HOST) != [], 30, "the host to start", log)
        # Given a host handling a steady flow of orders and payments
        publisher.start()
        wait_for(lambda: len(service_instances(box)) >= 20, 30, "the host to work", log)
        # When MessageBoxes are opened meanwhile, one after another, each failing if it
        # waits half a second for a lock (a lock wait, not a slow machine, is what this
        # is after: on a busy 2-core machine an open once took 1.3 s with no lock wait)
        guarded = pg_url.replace("options=", "options=-clock_timeout%3D500%20", 1)
        assert guarded != pg_url
        problems: list[str] = []
        for _ in range(15):
            began = time.monotonic()
            try:
                MessageBox(guarded).close()
            except MessageBoxError as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
            took = time.monotonic() - began
            if took > 10:  # an open takes ~0.05 s on a quiet machine
                problems.append(f"an open took {took:.1f} s")
            if problems:
                break
        # Then none fails, and none waits on the running host's transactions
        assert problems == []
    finally:
        stop.set()
        publisher.join(10)
        host.send_signal(signal.SIGTERM)
        host.wait(30)
        box.close()


def test_a_message_committed_late_with_an_older_id_waits_for_the_running_step(pg_url: str):
    # The claim lets only the oldest queued entry of an instance be taken, and the
    # entry stays queued until its step commits; that makes one step at a time only if
    # no entry with a lower id can appear later. Here two host instances (h1, h2) both
    # hold a message of one instance: two steps of it would run at once.
    from tests.apps.orchestrator import app

    def message(kind: str) -> Message:
        return Message(kind.encode(), promoted={"t.Kind": kind, "t.OrderId": "X"})

    with MessageBox(pg_url, publisher="tests") as box:
        app.setup(box)

        def take(owner: str) -> list[Claim]:
            return claim(box, HOST, n=10, owner=owner, lease_seconds=60, instances=True)

        # Given a running instance for X whose first order was handled
        box.publish([message("order")])
        [first] = take("h1")
        with box.store.transaction(serial=True) as conn:
            leases.finish(conn, box.store.dialect, "h1", [first], [], HostSettings(), set())
        # When a second order for X is being published (its entry id taken) while a
        # payment for X is published and committed, and h1 takes the payment
        with box.store.transaction() as late:
            router.publish(
                late,
                box.store.dialect,
                [message("order")],
                [uuid7()],
                policy=RoutingPolicy.SUSPEND,
                publisher="tests",
                now=datetime.now(UTC),
            )
            [routed] = box.publish([message("payment")])
            assert routed.outcome is Outcome.ROUTED
            h1 = take("h1")
            assert [c.msg for c in h1] == [routed.message_id]
        # and the second order commits (with the lower entry id) while h1's step runs
        h2 = take("h2")

        # Then h2 gets nothing of instance X until h1's step is done
        assert [c for c in h2 if c.instance_id == first.instance_id] == []
