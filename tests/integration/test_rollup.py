"""Per-minute rates kept in the store whether or not tracking is on (messagebox.storage.rollup),
on both backends: what each process committed, counted once; sampled queue depths; a
running host instance writes both; cleanup trims them after a day; the console draws them."""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox, clock, upkeep
from messagebox.console import create_app
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P
from messagebox.storage import rollup, schema
from tests.conftest import wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

FAST: dict[str, Any] = {
    "poll_min_seconds": 0.01,
    "poll_max_seconds": 0.05,
    "heartbeat_seconds": 0.1,
    "max_attempts": 1,
    "cleanup_interval_seconds": 0.0,
}


def test_committed_counts_are_written_per_minute_once(box: MessageBox) -> None:
    assert not box.tracking().enabled  # kept without tracking
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 5, name="five-up")
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(10)])  # 5 routed, 5 not
    box.store.write_tally()
    box.store.write_tally()  # nothing more: what was written is not written again
    before = rollup.minute(clock.local_now())
    rates = box.rates(5)
    assert len(rates.minutes) == 5
    assert before <= rates.minutes[-1] <= rollup.minute(clock.local_now())
    assert sum(rates.totals("published")) == 10
    assert sum(rates.counts[("routed", "h")]) == 5
    assert sum(rates.totals("suspended")) == 5  # the routing failures


def test_a_rollup_write_that_fails_is_kept_for_the_next(
    duckdb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MessageBox(duckdb_url) as box:
        box.create_host("h")
        box.subscribe("s", host="h", filter=P("t.N") >= 0)

        def refused(*_: object) -> None:
            raise RuntimeError("the store is full")

        with monkeypatch.context() as m:
            m.setattr(rollup, "write", refused)
            box.publish([Message(b"x", promoted={"t.N": 1})])
            box.store.write_tally()  # fails: kept, and the publish stays published
        assert [q.depth for q in box.queue_depth()] == [1]
        box.store.write_tally()
        assert sum(box.rates(5).totals("published")) == 1
    tally = rollup.Tally()
    tally.add(Counter({("published", ""): 3, ("not-an-event", ""): 7}))
    assert {e for _, e, _ in tally.take()} == {"published"}  # only known events
    old = rollup.minute(clock.local_now() - timedelta(hours=5))
    for k in range(rollup.MAX_PENDING_MINUTES + 10):
        tally.put_back(Counter({(old + timedelta(minutes=k), "published", ""): 1}))
    kept = {m for m, _, _ in tally.take()}
    assert len(kept) == rollup.MAX_PENDING_MINUTES
    assert min(kept) == old + timedelta(minutes=10)  # the newest are kept


def test_depth_samples_and_a_running_host_writes_both(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollup, "FLUSH_SECONDS", 0.0)
    monkeypatch.setattr(upkeep, "DEPTH_SECONDS", 0.0)
    box.create_host("h", **FAST)
    box.subscribe("work", host="h", filter=P("t.N") >= 0)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(3)])
    assert box.operations.sample_depth("h", "test") == 3

    def fails_odd(d: Delivery) -> None:
        if int(str(d.properties["t.N"])) % 2:
            raise RuntimeError("odd")

    def sampled_by(source: str) -> list[int]:
        r = schema.rollup
        with box.store.transaction() as conn:
            return list(
                conn.execute(
                    sa.select(r.c.n).where(r.c.source == source, r.c.event == rollup.DEPTH)
                ).scalars()
            )

    with HostInstance(box, "h", {"work": fails_odd}) as instance:
        wait_for(lambda: box.count_suspended() == 1, "the odd message suspended")
        wait_for(lambda: 0 in sampled_by(instance.id), "an empty queue sampled")
        wait_for(lambda: sum(box.rates(2).totals("delivered")) == 2, "deliveries counted")
    r = schema.rollup
    with box.store.transaction() as conn:  # a minute's depth is its largest sample
        by_minute = conn.execute(
            sa.select(r.c.minute, sa.func.max(r.c.n))
            .where(r.c.event == rollup.DEPTH, r.c.label == "h")
            .group_by(r.c.minute)
        ).all()
    assert 3 in [n for _, n in by_minute]
    rates = box.rates(2)
    assert sum(rates.totals("failed")) == 1
    assert sum(rates.counts[("suspended", "delivery-failure")]) == 1


def test_cleanup_trims_rates_older_than_a_day(box: MessageBox) -> None:
    old = rollup.minute(clock.local_now() - rollup.KEEP - timedelta(minutes=5))
    with box.store.transaction() as conn:
        rollup.write(conn, "old", {(old, "published", ""): 4})
        rollup.write(conn, "new", {(rollup.minute(clock.local_now()), "published", ""): 2})
    report = box.cleanup()
    assert report.rollup_rows == 1
    with box.store.transaction() as conn:
        left = conn.execute(sa.select(schema.rollup.c.source)).scalars().all()
    assert left == ["new"]


def test_the_overview_draws_the_last_hour(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(4)])
    box.store.write_tally()
    box.operations.sample_depth("h", "test")
    html = TestClient(create_app(box), base_url="http://127.0.0.1:8080").get("/").text
    assert '<meta http-equiv="refresh" content="10">' in html
    found = re.search(r"id=\"chart-rates\"[^>]*data-totals='([^']*)'", html)
    assert found, html
    totals = json.loads(found.group(1).replace("&#34;", '"'))
    assert totals == {
        "published": 4,
        "routed": 4,
        "delivered": 0,
        "failed": 0,
        "suspended": 0,
        "expired": 0,
    }
    depth = re.search(r"id=\"chart-depth\"[^>]*data-totals='([^']*)'", html)
    assert depth
    assert json.loads(depth.group(1).replace("&#34;", '"')) == {"h": 4}
    paused = TestClient(create_app(box), base_url="http://127.0.0.1:8080").get("/?refresh=off")
    assert 'http-equiv="refresh"' not in paused.text
