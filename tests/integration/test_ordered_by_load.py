"""Per-key order under load (docs/concepts.md: Per-key order): 200 keys x 50 messages
published by two racing publishers while the hosts deliver. On PostgreSQL two host
processes of four threads each (``messagebox host run tests.apps.keyed:app``); on DuckDB
two host instances of four threads in this process. Every key's messages are handled
in each publisher's order, one at a time, keys in parallel (measured); a host killed
mid-run (SIGKILL; on DuckDB an instance whose threads and heartbeats stop dead) keeps
every key's order: its entries are handled again, at a later attempt, from where its
key stood."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from messagebox import MessageBox
from messagebox.errors import BackendUnavailable
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P
from tests.conftest import wait_for
from tests.integration.keyed_support import (
    Handled,
    check_order,
    in_parallel,
    publish_racing,
    read_logs,
)
from tests.integration.test_processes import errors, start_workers, stop

KEYS, PER_KEY = 200, 50
TOTAL = KEYS * PER_KEY
SLOW = 0.001
"""Seconds a delivery takes: long enough that deliveries overlap, so that how many keys
are in flight at once is measured, not a matter of the claim statements' pace."""

SETTINGS: dict[str, Any] = {
    "dequeue_threads": 4,
    "claim_batch": 10,
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.2,
    "heartbeat_seconds": 0.2,
    "lease_seconds": 30.0,
    "cleanup_interval_seconds": 0.0,
}
"""The hosts' settings; an instance silent for ``dead_after_seconds`` is dead: 2 s
where one is killed, else 20 (on a loaded machine a heartbeat can come late, and an
instance taken for dead has its entries delivered again, at-least-once)."""


def _subscribe(box: MessageBox, kill: bool) -> None:
    box.create_host("keyed", **SETTINGS, dead_after_seconds=2.0 if kill else 20.0)
    box.subscribe("record", host="keyed", filter=P("t.Seq") >= 0, name="by-key", ordered_by="t.K")


def _wait_for(out: Path, box: MessageBox, n: int, timeout: float = 60) -> None:
    wait_for(
        lambda: len(read_logs(out)) >= n and not box.queue_depth(),
        what=f"{n} deliveries and an empty queue",
        timeout=timeout,
    )


@pytest.mark.postgres
@pytest.mark.parametrize("kill", [False, True], ids=["racing", "sigkill"])
def test_two_host_processes_keep_every_keys_order(pg_url: str, tmp_path: Path, kill: bool) -> None:
    if kill:  # the first host to deliver kills itself mid-delivery after this many
        (tmp_path / "kill-after").write_text(str(TOTAL // 8))
    with MessageBox(pg_url) as box:
        _subscribe(box, kill)
        procs = start_workers(pg_url, tmp_path, 2, slow=SLOW, app="tests.apps.keyed:app")
        try:
            wait_for(lambda: len(box.instances()) == 2, what="both hosts", timeout=30)
            racers = threading.Thread(target=publish_racing, args=(pg_url, KEYS, PER_KEY))
            racers.start()
            if kill:
                wait_for(lambda: any(p.poll() is not None for p in procs), what="the kill")
            racers.join(120)
            _wait_for(tmp_path, box, TOTAL)
        finally:
            codes = stop(procs)
    assert sorted(codes) == ([-signal.SIGKILL, 0] if kill else [0, 0]), errors(tmp_path)
    handled = read_logs(tmp_path)
    repeats = check_order(handled, KEYS, PER_KEY, again=kill)
    assert len(handled) == TOTAL + repeats
    assert len({h.worker for h in handled}) == 2  # both processes took keys
    if kill:
        assert repeats  # the killed host's keys were handled again, in order
    share = in_parallel(handled)
    print(f"two or more keys in flight {share:.0%} of the time")
    if not kill:  # (after a kill, the instance left delivers the killed one's entries alone)
        assert share > 0.5


class _Recorder:
    """The service of the in-process test: records each delivery (see ``Handled``); a
    delivery of an instance marked dead never returns (its thread hangs, as a killed
    process's would have ended). With a ``victim``, that instance is killed once it
    has handled ``kill_after`` deliveries, just after one that is not the last of its
    batch (whose outcomes it holds unrecorded, as an instance does until its next
    claim)."""

    def __init__(self, victim: HostInstance | None = None, kill_after: int = 0) -> None:
        self.lock = threading.Lock()
        self.handled: list[Handled] = []
        self.dead: set[str] = set()
        self.gone = threading.Event()
        self.victim = victim
        self.kill_after = kill_after

    def __call__(self, d: Delivery) -> None:
        start = time.monotonic_ns()
        if d.host_instance in self.dead:
            self.gone.wait()
            raise BackendUnavailable("this host instance is dead")
        time.sleep(SLOW)
        p = d.properties
        handled = Handled(
            int(p["t.K"]),  # type: ignore[arg-type]
            int(p["t.Pub"]),  # type: ignore[arg-type]
            int(p["t.Seq"]),  # type: ignore[arg-type]
            d.attempt,
            d.host_instance,
            start,
            time.monotonic_ns(),
        )
        with self.lock:
            self.handled.append(handled)
            mine = sum(1 for h in self.handled if h.worker == d.host_instance)
        victim = self.victim
        if victim is not None and d.host_instance == victim.id and mine >= self.kill_after:
            batches = victim._parts.in_flight.batches_holding(d.entry_id)
            if batches and batches[0][-1].id != d.entry_id:
                self.victim = None
                _kill(victim, self)


def _kill(inst: HostInstance, recorder: _Recorder) -> None:
    """Stop ``inst`` dead, as a killed process: its deliveries never return, its
    heartbeats stop (the other instance releases its leases once it is dead), it
    records nothing more."""
    recorder.dead.add(inst.id)

    def dead(*_args: object, **_kwargs: object) -> Any:
        raise BackendUnavailable("this host instance is dead")

    inst.queue.heartbeat = dead  # type: ignore[method-assign]
    inst.queue.record = dead  # type: ignore[method-assign]
    inst.queue.claim = dead  # type: ignore[method-assign]


@pytest.mark.parametrize("kill", [False, True], ids=["racing", "killed"])
def test_two_host_instances_of_four_threads_keep_every_keys_order_on_duckdb(
    duckdb_url: str, kill: bool
) -> None:
    recorder = _Recorder()
    with MessageBox(duckdb_url) as box:
        _subscribe(box, kill)
        hosts = [HostInstance(box, "keyed", {"record": recorder}) for _ in range(2)]
        if kill:
            recorder.victim, recorder.kill_after = hosts[0], TOTAL // 8
        for inst in hosts:
            inst.start()
        try:
            racers = threading.Thread(target=publish_racing, args=(duckdb_url, KEYS, PER_KEY))
            racers.start()
            if kill:
                wait_for(lambda: recorder.dead, what="the kill", timeout=60)
            racers.join(120)
            wait_for(
                lambda: (
                    len({(h.key, h.pub, h.seq) for h in recorder.handled}) >= TOTAL
                    and not box.queue_depth()
                ),
                what="every message handled",
                timeout=90,
            )
        finally:
            recorder.gone.set()
            for inst in hosts:
                inst.stop(10)
    handled = list(recorder.handled)
    repeats = check_order(handled, KEYS, PER_KEY, again=kill)
    assert len(handled) == TOTAL + repeats
    assert len({h.worker for h in handled}) == 2
    if kill:
        assert repeats
    share = in_parallel(handled)
    print(f"two or more keys in flight {share:.0%} of the time")
    if not kill:  # (after a kill, the instance left delivers the killed one's entries alone)
        assert share > 0.5
