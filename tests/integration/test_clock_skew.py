"""Machines of one store whose clocks disagree: every stamp that decides delivery
(publish and enqueue times, timeouts, liveness) is the database's, so a publisher or
host instance a day fast or slow delivers as one in sync would."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from messagebox import Message, MessageBox, clock
from messagebox.adapters.file import IN_PROGRESS, FileReceive, location_tag, owner_tag
from messagebox.cli import main as cli_main
from messagebox.delivery import registry
from messagebox.hosts import HostInstance
from messagebox.models import InstanceInfo
from messagebox.predicates import P
from messagebox.storage import schema
from tests.conftest import claim
from tests.integration.orchestration_support import make_app, msg, wait_until
from tests.integration.test_orchestration import PaymentTimeout

DAY = timedelta(days=1)


@pytest.fixture(params=[DAY, -DAY], ids=["a-day-fast", "a-day-slow"])
def skewed(request: pytest.FixtureRequest) -> Iterator[None]:
    """This process's clock, as every package module reads it (``messagebox.clock``;
    ``python -m tests.structure`` checks that none reads another), is off by a day;
    the database's is right."""
    offset: timedelta = request.param
    with clock.use_local(lambda: datetime.now(UTC) + offset):
        yield


def near_now(at: datetime) -> bool:
    return abs(at - datetime.now(UTC)) < timedelta(minutes=5)


def test_a_publisher_with_a_skewed_clock_is_delivered_at_once(
    skewed: None, box: MessageBox
) -> None:
    # Given a publisher whose clock is a day off
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.Kind") == "order")
    # When it publishes
    [routed] = box.publish([Message(b"x", promoted={"t.Kind": "order"})])
    # Then the entry can be claimed at once (a fast clock would hold it back a day),
    # its wait is measured in seconds (a slow clock would make it a day old), and the
    # message's publish time is the database's
    [got] = claim(box, "h")
    assert got.msg == routed.message_id
    assert got.waited is not None
    assert got.waited < 60
    assert got.enqueued_at is not None
    assert near_now(got.enqueued_at)
    assert near_now(box.read_message(routed.message_id).published_at)


def test_a_queue_s_age_is_the_database_s_whatever_the_publisher_s_clock(
    skewed: None, box: MessageBox
) -> None:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.Kind") == "order")
    box.publish([Message(b"x", promoted={"t.Kind": "order"})])
    [stats] = box.queue_stats("h")
    assert 0 <= stats.oldest_age_seconds < 60


def test_timeouts_fall_due_by_the_database_s_clock(
    skewed: None, box: MessageBox, running: Callable[..., HostInstance]
) -> None:
    # Given an orchestration waiting 1.5 s for a payment, on a host whose clock is a
    # day off (fast, the timeout would wait a day; slow, it would fire at once)
    app, sink = make_app(PaymentTimeout, sink_kinds=("cancel",))
    running(app)
    # When an order is never paid
    start = time.monotonic()
    box.publish([msg("order", 1, **{"t.Wait": 1.5})])
    wait_until(lambda: sink.orders("cancel") == [1], 30, "the timeout's cancel")
    # Then its timeout fires after the 1.5 s, not before and not a day later
    assert time.monotonic() - start >= 1.45


def test_a_machine_with_a_skewed_clock_recovers_only_dead_instances_files(
    skewed: None, box: MessageBox, tmp_path: Path
) -> None:
    # Given files taken by two instances of host h: "busy" alive (a fresh heartbeat) and
    # "gone" dead (none for an hour), seen from a machine whose clock is a day off
    box.create_host("h")
    stamp = datetime.now(UTC)
    with box.store.transaction() as conn:
        for owner in ("busy", "gone"):
            registry.register(conn, InstanceInfo(owner, "h", "m1", 1, stamp, stamp, "running"))
        conn.execute(
            schema.instance.update()
            .where(schema.instance.c.id == "gone")
            .values(heartbeat_at=schema.instance.c.heartbeat_at - timedelta(hours=1))
        )
    loc = location_tag(f"{tmp_path.resolve()}|*.xml")
    busy = tmp_path / f"a.xml.{'0' * 16}.{owner_tag('busy')}-{loc}{IN_PROGRESS}"
    gone = tmp_path / f"b.xml.{'1' * 16}.{owner_tag('gone')}-{loc}{IN_PROGRESS}"
    busy.write_bytes(b"<a/>")
    gone.write_bytes(b"<b/>")
    # When a location on that folder looks for orphaned files
    adapter = FileReceive(f"file://{tmp_path}/*.xml", interval=60, recover_interval=60)
    adapter.start(box, "other", lambda *args, **kwargs: None)  # type: ignore[arg-type]
    try:
        wait_until(lambda: not gone.exists(), 30, "the dead instance's file recovered")
        adapter.recover()
        # Then it takes over the dead instance's file and leaves the live one's alone
        assert busy.exists()
        assert adapter.stats["recovered"] == 1
    finally:
        adapter.stop(5.0)


def test_the_cli_s_ages_are_counted_back_from_the_database_s_time(
    skewed: None, box: MessageBox, backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a routing failure suspended just now (tracked), and an operator's machine
    # whose clock is a day off
    box.configure_tracking(True)
    [failed] = box.publish([Message(b"x", promoted={"t.Kind": "stray"})])
    assert len(box.suspended()) == 1

    def listed(*args: str) -> list[object]:
        assert cli_main(["--url", backend_url, *args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    # Then "older than an hour" is none of it and "older than 0 s" all of it, and the
    # last hour's history has its events (a day off either way would swap them)
    assert listed("suspended", "list", "--older-than", "1h") == []
    assert len(listed("suspended", "list", "--older-than", "0s")) == 1
    assert listed("tracking", "events", str(failed.message_id), "--since", "1h") != []
