"""Hosts and a publisher ride out a PostgreSQL failover (docs/howto-postgresql.md, High
availability): a primary and a streaming standby on this machine
(:mod:`tests.integration.pg_pair`), two ``messagebox host run`` processes and a
publisher process (:mod:`tests.apps.failover`), all given one URL that names both
servers (``target_session_attrs=read-write``). The primary is stopped as if its machine
died (``pg_ctl stop -m immediate``) and, a lease later, the standby promoted. The same
processes, with the same instance ids, carry on against the new primary, and the store
is consistent (:mod:`messagebox.storage.consistency`).

With synchronous replication every acknowledged message is delivered. With
asynchronous replication the commits the standby had not received are lost: the test
holds the primary's WAL sender for the last moments before the death, so that there
are some (publishes acknowledged, deliveries completed), and checks that every
acknowledged message the new primary holds is delivered, and that nothing is left half
done.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from messagebox import BackendUnavailable, MessageBox
from messagebox.predicates import P
from tests.conftest import IN_CI, free_port
from tests.integration import pg_pair

pytestmark = pytest.mark.deployment  # .ci/run runs them after the suite (make test-deployment)

ROOT = Path(__file__).resolve().parents[2]

SETTINGS = {
    "dequeue_threads": 2,
    "claim_batch": 20,
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.5,
    "heartbeat_seconds": 0.5,
    "dead_after_seconds": 3.0,
    "lease_seconds": 5.0,
    "retry_backoff_seconds": 0.1,
    "cleanup_interval_seconds": 0.0,
}
"""Short leases and heartbeats, so that what a lapsed lease gives back comes back within
seconds. No cleanup while it runs: the messages stay in the spool, to say which
acknowledged ones the new primary has (the test runs a cleanup at the end)."""

DOWN_SECONDS = SETTINGS["lease_seconds"] + 1.0
"""How long after the primary's death the standby is promoted (a failover manager's
delay): longer than a lease and than ``dead_after_seconds``, so that the leases held at
the death have lapsed and each host finds the other's heartbeat stale when the store is
back, releases its leases and unregisters it (the other registers again, the same
instance)."""

UNREPLICATED = 100
"""Asynchronous: messages acknowledged after the WAL sender is held, before the death."""

DEADLINE = 60.0
"""The longest any one wait of the test takes before it fails."""


def wait(cond: Callable[[], object], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``cond`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def lines(path: Path) -> list[list[str]]:
    """A file's complete lines, split (a line still being written is read next time)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [line.split() for line in text[: text.rfind("\n") + 1].splitlines()]


def delivered(out: Path) -> dict[int, list[tuple[str, int, float]]]:
    """Per host process, its deliveries: (message, attempt, time)."""
    return {
        int(log.stem): [(m, int(a), float(t)) for m, a, t in lines(log)]
        for log in out.glob("*.log")
    }


def acked(path: Path) -> dict[str, float]:
    """The publisher's acknowledged messages, with the time of their acknowledgement."""
    return {msg: float(at) for msg, at in lines(path)}


def events(err: Path, name: str) -> list[dict[str, object]]:
    """The JSON log lines of a host process with this ``event``."""
    found = []
    for line in err.read_text().splitlines() if err.exists() else []:
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == name:
                found.append(record)
    return found


@contextmanager
def processes(url: str, work: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two host processes and the publisher; every one killed at the end."""
    env = {**os.environ, "MB_TEST_OUT": str(work), "PYTHONPATH": str(ROOT)}
    host = [sys.executable, "-m", "messagebox.cli", "--url", url, "host", "run"]
    commands = {
        "host-0": [*host, "tests.apps.failover:app", "--log-format", "json"],
        "host-1": [*host, "tests.apps.failover:app", "--log-format", "json"],
        "publisher": [sys.executable, "-m", "tests.apps.failover", url, str(work / "acked")],
    }
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in commands.items():
            with (work / f"{name}.err").open("wb") as err:
                started.append(
                    subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
                )
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def stop(proc: subprocess.Popen[bytes], err: Path) -> None:
    """SIGTERM, and a clean exit within 40 s."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 0, err.read_text()[-3000:]


@dataclass
class Seen:
    """What the run saw (times are ``time.monotonic()``)."""

    acked: dict[str, float]
    held: float | None
    """When the WAL sender was held (asynchronous), or None."""
    promoting: float
    """When ``pg_ctl promote`` was run."""
    spool: set[str]
    """The messages the new primary holds, before the cleanup at the end."""
    deliveries: dict[int, list[tuple[str, int, float]]]
    problems: list[str]
    problems_after_cleanup: list[str]
    first_instances: set[tuple[str, int]]
    last_instances: set[tuple[str, int]]
    alive: set[int]
    logs: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    """Each host's ``store-lost``, ``store-back`` and ``leases-released`` lines."""

    def attempts(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = defaultdict(list)
        for got in self.deliveries.values():
            for msg, attempt, _ in got:
                found[msg].append(attempt)
        return found

    def lost_from_store(self) -> set[str]:
        return set(self.acked) - self.spool

    def never_delivered(self) -> set[str]:
        return set(self.acked) - set(self.attempts())

    def death(self) -> float:
        """The old primary's last answer: its last acknowledged publish (the publisher
        publishes every 20 ms)."""
        return max(at for at in self.acked.values() if at < self.promoting)

    def publisher_outage(self) -> float:
        """From the death to the first publish the new primary acknowledged."""
        return min(at for at in self.acked.values() if at > self.promoting) - self.death()

    def delivery_outage(self) -> float:
        """From the death to the first delivery of a message the new primary took."""
        after = [
            at
            for got in self.deliveries.values()
            for msg, _, at in got
            if self.acked.get(msg, 0) > self.promoting
        ]
        return min(after) - self.death()

    def report(self, name: str) -> str:
        backs = [float(e["outage_seconds"]) for e in self.logs["store-back"]]  # type: ignore[arg-type]
        released = sum(int(e["released"]) for e in self.logs["leases-released"])  # type: ignore[call-overload]
        twice = sum(1 for a in self.attempts().values() if len(a) > 1)
        promote = self.promoting - self.death()
        publisher, hosts = self.publisher_outage(), self.delivery_outage()
        return (
            f"\n{name}: {len(self.acked)} acknowledged, {len(self.lost_from_store())} of them "
            f"lost from the store ({len(self.never_delivered())} never delivered), {twice} "
            f"delivered twice; promotion started {promote:.2f} s after the primary's death "
            f"(its last acknowledged publish); outage seen by the publisher {publisher:.2f} s "
            f"(to the first publish the new primary acknowledged: {publisher - promote:.2f} s "
            f"after the promotion started), by the hosts {hosts:.2f} s (to the first delivery "
            f"of a message the new primary took: {hosts - promote:.2f} s after), logged by "
            f"the hosts as store-back after {', '.join(f'{s:.2f}' for s in backs)} s; "
            f"{released} leases released of instances found dead"
        )


def failover(synchronous: bool) -> Seen:
    """Build the pair and the processes, fail the primary over to the standby, and
    collect what each side saw; everything is stopped and removed at the end."""
    reason = pg_pair.tools_reason()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    root = Path(tempfile.gettempdir()) / f"mbfailover-{uuid.uuid4().hex[:8]}"
    try:
        pair = pg_pair.build(root / "pg", (free_port(), free_port()), synchronous=synchronous)
        try:
            (root / "work").mkdir()
            with MessageBox(pair.url) as box:
                box.create_host("relay", **SETTINGS)  # type: ignore[arg-type]
                box.subscribe("record", host="relay", filter=P("t.N") >= 0, name="relay-all")
                with processes(pair.url, root / "work") as procs:
                    return _fail_over(pair, box, procs, root / "work")
        finally:
            pair.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _fail_over(
    pair: pg_pair.Pair, box: MessageBox, procs: list[subprocess.Popen[bytes]], work: Path
) -> Seen:
    hosts, publisher = procs[:2], procs[2]
    sent = work / "acked"

    def instances() -> set[tuple[str, int]]:
        return {(i.id, i.pid) for i in box.instances("relay")}

    def delivered_since(t: float) -> set[int]:
        """The host processes that delivered a message acknowledged after ``t``."""
        times = acked(sent)
        return {
            pid
            for pid, got in delivered(work).items()
            if any(times.get(m, 0) > t for m, _, _ in got)
        }

    wait(lambda: len(instances()) == 2 and len(acked(sent)) >= 200, "hosts and 200 publishes")
    first = instances()
    with pytest.raises(BackendUnavailable, match=r"127\.0\.0\.1:\d+ is a standby in recovery"):
        MessageBox(pair.standby.url)  # a URL without target_session_attrs may reach it
    held = None
    if not pair.synchronous:  # the last moments' commits never reach the standby
        pair.hold_replication()
        held = time.monotonic()
        wait(
            lambda: (
                sum(at > held for at in acked(sent).values()) >= UNREPLICATED
                and delivered_since(held)
            ),
            f"{UNREPLICATED} acknowledged and some delivered, unreplicated",
        )
    stopping = time.monotonic()
    pair.primary.stop("immediate")  # as if its machine died
    wait(
        lambda: (
            all(events(work / f"host-{i}.err", "store-lost") for i in range(2))
            and time.monotonic() - stopping >= DOWN_SECONDS
        ),
        "both hosts to find the store lost, and a lease to lapse",
    )
    promoting = time.monotonic()
    pair.standby.promote()
    wait(
        lambda: (
            sum(at > promoting for at in acked(sent).values()) >= 300
            and delivered_since(promoting) == {p.pid for p in hosts}
        ),
        "300 acknowledged after the failover, delivered by both hosts",
    )
    stop(publisher, work / "publisher.err")
    wait(lambda: not box.queue_depth(), "the queue drained")
    wait(lambda: instances() == first, "the same instances registered", timeout=10)
    last, alive = instances(), {p.pid for p in hosts if p.poll() is None}
    for i, p in enumerate(hosts):
        stop(p, work / f"host-{i}.err")
    spool = {str(m) for page in box.iter_promoted(10_000) for m, _ in page}
    problems = [str(p) for p in box.check()]
    box.cleanup()
    return Seen(
        acked=acked(sent),
        held=held,
        promoting=promoting,
        spool=spool,
        deliveries=delivered(work),
        problems=problems,
        problems_after_cleanup=[str(p) for p in box.check()],
        first_instances=first,
        last_instances=last,
        alive=alive,
        logs={
            name: [e for i in range(2) for e in events(work / f"host-{i}.err", name)]
            for name in ("store-lost", "store-back", "leases-released")
        },
    )


def assert_carried_on(seen: Seen) -> None:
    """The same processes, the same instance ids, each logging the outage once and its
    end once; a consistent store."""
    assert seen.problems == []
    assert seen.problems_after_cleanup == []
    assert seen.last_instances == seen.first_instances
    assert seen.alive == {pid for _, pid in seen.first_instances}
    ids = sorted(i for i, _ in seen.first_instances)
    for event in ("store-lost", "store-back"):
        assert sorted(str(e["host_instance"]) for e in seen.logs[event]) == ids, event


def test_synchronous_replication_loses_no_acknowledged_message_in_a_failover() -> None:
    seen = failover(synchronous=True)
    print(seen.report("synchronous"))
    assert seen.lost_from_store() == set()
    assert seen.never_delivered() == set()
    assert all(max(a) > 1 for a in seen.attempts().values() if len(a) > 1)
    assert_carried_on(seen)


def test_asynchronous_replication_loses_the_last_commits_never_half_of_one() -> None:
    seen = failover(synchronous=False)
    print(seen.report("asynchronous"))
    assert seen.held is not None
    lost = seen.lost_from_store()
    assert lost, "the commits after the WAL sender was held were not lost"
    # the unreplicated ones only (what was committed a moment before the WAL sender was
    # held may not have been sent yet)
    assert all(seen.acked[m] > seen.held - 1.0 for m in lost)
    assert seen.never_delivered() <= lost  # the rest were delivered
    assert_carried_on(seen)
