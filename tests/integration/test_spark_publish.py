"""Bulk publish from Spark: every row routed as the SQL router routes it, exact values,
deterministic ids, idempotent re-runs, resuming a failed job, bad input refused.

On PostgreSQL the executors publish (in parallel); on DuckDB the driver does.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import MessageBox
from messagebox.errors import (
    AlreadyReceived,
    MessageValidationError,
    RoutingFailure,
    ValidationError,
)
from messagebox.message import StoredMessage
from messagebox.models import ROUTING_FAILURE
from messagebox.pipelines.spark_publish import NAMESPACE, location, message_id, publish_dataframe
from messagebox.predicates import Filter, P, normalize_properties
from messagebox.storage import schema
from tests.conftest import table_counts

SCHEMA = (
    "key BIGINT, body BINARY, `o.Total` BIGINT, `o.Price` DOUBLE, `o.Rush` BOOLEAN, "
    "`o.At` TIMESTAMP, `o.Region` STRING, `o.Amount` DECIMAL(12,2)"
)
NAMES = ("o.Total", "o.Price", "o.Rush", "o.At", "o.Region", "o.Amount")
SUBS: dict[str, Any] = {
    "big": P("o.Total") >= 2**62,
    "eu": P("o.Region") == "EU",
    "late-rush": (P("o.At") > datetime(2026, 6, 1, tzinfo=UTC)) & (P("o.Rush") == True),  # noqa: E712
    "cheap": P("o.Price") < 0.5,
    "amount": P("o.Amount") == 12.5,
}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(i: int) -> tuple[Any, ...]:
    """A varied row; every 5th matches no subscription (all its properties are null)."""
    if i % 5 == 4:
        return (i, None, None, None, None, None, None, None)
    totals = [2**63 - 1, -(2**63), i, 2**62 + i]
    regions = ["EU", "US", "é😀", "x" * 256, ""]
    return (
        i,
        f"<order id='{i}'/>".encode() if i % 3 else None,
        totals[i % 4],
        (i % 10) / 10 + 1e-9 * (i % 7),
        [True, False, None][i % 3],
        T0 + timedelta(days=i % 365, microseconds=i),
        regions[i % 5],
        Decimal("12.50") if i % 2 else Decimal(i) / 100,
    )


def frame(
    spark: Any, rows: Sequence[tuple[Any, ...]], partitions: int, schema: str = SCHEMA
) -> Any:
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions), schema)


def subscribe(box: MessageBox) -> dict[int, Filter]:
    box.create_host("h")
    return {box.subscribe(name, host="h", filter=f).id: Filter.of(f) for name, f in SUBS.items()}


def promoted(r: Sequence[Any]) -> dict[str, Any]:
    return normalize_properties({n: v for n, v in zip(NAMES, r[2:], strict=True) if v is not None})


def queued(box: MessageBox) -> set[tuple[uuid.UUID, int]]:
    q = schema.queue
    with box.store.transaction() as conn:
        return {(m, s) for m, s in conn.execute(sa.select(q.c.msg, q.c.sub))}


def recorded(box: MessageBox, job: str, keys: Sequence[int]) -> set[int]:
    return {int(k) for k in box.receipts(location(job), [str(k) for k in keys])}


def test_every_row_is_published_once_routed_as_the_sql_router_routes_it(
    spark: Any, box: MessageBox
) -> None:
    # Given subscriptions and 2,500 rows of every property type, in 4 partitions
    filters = subscribe(box)
    rows = [row(i) for i in range(2500)]
    df = frame(spark, rows, 4)
    # When the frame is published in batches of 500
    report = publish_dataframe(df, box, job="orders-1", body="body", batch_size=500)
    # Then every row is published once, with the id derived from its key
    ids = {r[0]: message_id("orders-1", r[0]) for r in rows}
    assert ids[7] == uuid.uuid5(NAMESPACE, "spark:orders-1\x007")
    expected = {
        (ids[r[0]], sub) for r in rows for sub, f in filters.items() if f.matches(promoted(r))
    }
    unrouted = {ids[r[0]] for r in rows} - {m for m, _ in expected}
    assert report.rows == report.published == 2500
    assert report.skipped == report.dropped == 0
    assert report.routed == 2500 - len(unrouted)
    assert report.suspended == len(unrouted) >= 500
    assert report.batches == 8  # 625 rows a partition: 500 + 125
    assert report.parallel is (box.store.dialect.name == "postgresql")
    assert [p.rows for p in report.partitions] == [625] * 4
    # routed exactly as the reference evaluator (and the SQL router) route each message
    assert queued(box) == expected
    for r in rows[:20]:
        assert {s.id for s in box.would_route(promoted(r))} == {
            s for m, s in expected if m == ids[r[0]]
        }
    failures = box.suspended(reason=ROUTING_FAILURE, limit=5000)
    assert {e.message_id for e in failures} == unrouted
    # and properties and bodies round-trip exactly
    stored = box.read_messages(ids.values())
    assert len(stored) == 2500
    for r in rows:
        msg = stored[ids[r[0]]]
        assert isinstance(msg, StoredMessage)
        assert msg.promoted == promoted(r)
        assert msg.body == (r[1] or b"")
    assert stored[ids[0]].promoted["o.Total"] == 2**63 - 1
    assert stored[ids[1]].promoted["o.Total"] == -(2**63)
    assert stored[ids[1]].promoted["o.At"] == T0 + timedelta(days=1, microseconds=1)
    assert stored[ids[1]].promoted["o.Amount"] == 12.5
    assert stored[ids[2]].promoted["o.Region"] == "é😀"


def test_running_a_job_again_publishes_nothing_more(spark: Any, box: MessageBox) -> None:
    # Given a job that published 300 rows
    subscribe(box)
    df = frame(spark, [row(i) for i in range(300)], 3)
    first = publish_dataframe(df, box, job="again", body="body", batch_size=100)
    before = table_counts(box)
    # When it runs again
    second = publish_dataframe(df, box, job="again", body="body", batch_size=100)
    # Then every row is skipped and nothing is stored
    assert first.published == 300
    assert (second.published, second.skipped, second.batches) == (0, 300, 0)
    assert table_counts(box) == before
    assert before["mb_spool"] == before["mb_receipt"] == 300


def long_string(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (*r[:6], "y" * 257, r[7])


def matching_nothing(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (r[0], r[1], None, None, None, None, None, None)


@pytest.mark.parametrize(
    ("spoil", "policy", "error", "words"),
    [
        (long_string, "suspend", MessageValidationError, "256 can be promoted"),
        (matching_nothing, "raise", RoutingFailure, "matched no subscription"),
    ],
)
def test_a_failed_job_keeps_its_earlier_batches_and_a_rerun_publishes_the_rest(
    spark: Any, box: MessageBox, spoil: Any, policy: str, error: type[Exception], words: str
) -> None:
    # Given 400 routable rows in 4 partitions, of which key 260 the engine refuses
    subscribe(box)
    good = [(i, None, i, 0.25, True, T0, "EU", Decimal(1)) for i in range(400)]
    bad = list(good)
    bad[260] = spoil(good[260])
    # When it is published in batches of 50
    with pytest.raises(
        error, match=rf"spark job 'resume': partition 2, message key 260: .*{words}"
    ):
        publish_dataframe(
            frame(spark, bad, 4), box, job="resume", body="body", batch_size=50, policy=policy
        )
    # Then the batches before the bad one stay published, and nothing of its batch
    done = recorded(box, "resume", range(400))
    assert set(range(250)) <= done
    assert not done & set(range(250, 300))
    assert table_counts(box)["mb_spool"] == len(done)
    # (the other partitions went on: on PostgreSQL they publish in parallel)
    assert (set(range(300, 400)) <= done) is (box.store.dialect.name == "postgresql")
    # And when the data is fixed and the job runs again, it publishes exactly the rest
    report = publish_dataframe(frame(spark, good, 4), box, job="resume", body="body", batch_size=50)
    assert (report.published, report.skipped) == (400 - len(done), len(done))
    counts = table_counts(box)
    assert counts["mb_spool"] == counts["mb_receipt"] == 400
    assert counts["mb_queue"] == 2 * 400  # "eu" and "cheap", once each
    assert recorded(box, "resume", range(400)) == set(range(400))


@pytest.mark.parametrize(
    ("rows", "schema", "options", "culprit"),
    [
        ([(1, "a"), (None, "b")], "key INT, `o.A` STRING", {}, "key column 'key' is null"),
        ([(1, "a"), (2, "b"), (1, "c")], "key INT, `o.A` STRING", {}, "message key 1 appears 2"),
        ([(1, "a")], "id INT, `o.A` STRING", {}, "no key column 'key'"),
        ([(1.0, "a")], "key DOUBLE, `o.A` STRING", {}, "key column 'key' has type double"),
        ([(1, None)], "key INT, `o.D` DATE", {}, "column 'o.D' has type date"),
        ([(1, "a")], "key INT, `bad name` STRING", {}, "column 'bad name'"),
        ([(1, "a")], "key INT, `BTS.ReceivePortName` STRING", {}, "BTS.ReceivePortName.*trusted"),
        ([(1, 5)], "key INT, b INT", {"body": "b", "properties": []}, "body column 'b' has type"),
        ([(1, b"x")], "key INT, body BINARY", {}, "column 'body'.*name it with body="),
        ([(1, "a")], "key INT, `o.A` STRING", {"policy": "bounce"}, "policy must be"),
        ([(1, "a")], "key INT, `o.A` STRING", {"job": ""}, "job name '' must be"),
        ([(1, "a")], "key INT, `o.A` STRING", {"batch_size": 0}, "batch_size must be"),
    ],
)
def test_bad_input_is_refused_naming_the_culprit_and_nothing_is_stored(
    spark: Any,
    box: MessageBox,
    rows: list[tuple[Any, ...]],
    schema: str,
    options: Mapping[str, Any],
    culprit: str,
) -> None:
    subscribe(box)
    before = table_counts(box)
    df = spark.createDataFrame(rows, schema)
    with pytest.raises(ValidationError, match=culprit):
        publish_dataframe(df, box, **{"job": "bad", **options})
    assert table_counts(box) == before


@pytest.mark.parametrize("policy", ["suspend", "drop"])
def test_routing_failures_follow_the_policy(spark: Any, box: MessageBox, policy: str) -> None:
    # Given 100 rows, some matching no subscription
    filters = subscribe(box).values()
    rows = [row(i) for i in range(100)]
    ids = {message_id("p", r[0]) for r in rows}
    unrouted = {
        message_id("p", r[0]) for r in rows if not any(f.matches(promoted(r)) for f in filters)
    }
    # When they are published under the policy
    report = publish_dataframe(frame(spark, rows, 2), box, job="p", body="body", policy=policy)
    # Then the routing failures are suspended, or dropped, and recorded either way
    failures = {e.message_id for e in box.suspended(reason=ROUTING_FAILURE)}
    stored = set(box.read_messages(ids))
    assert report.published == 100
    assert report.routed == 100 - len(unrouted) < 80
    if policy == "suspend":
        assert (report.suspended, report.dropped) == (len(unrouted), 0)
        assert (failures, stored) == (unrouted, ids)
    else:
        assert (report.suspended, report.dropped) == (0, len(unrouted))
        assert (failures, stored) == (set(), ids - unrouted)
        # a dropped message is not published again either
        again = publish_dataframe(frame(spark, rows, 2), box, job="p", body="body", policy=policy)
        assert (again.published, again.skipped) == (0, 100)


def test_a_trusted_job_may_set_reserved_properties(spark: Any, box: MessageBox) -> None:
    subscribe(box)
    df = spark.createDataFrame([("k1", "in-port")], "id STRING, `BTS.ReceivePortName` STRING")
    report = publish_dataframe(df, box, job="t", key="id", trusted=True)
    stored = box.read_message(message_id("t", "k1"))
    assert report.published == report.suspended == 1
    assert stored.promoted == {"messagebox.ReceivePortName": "in-port"}


def test_keys_recorded_after_the_check_are_skipped_not_published_twice(
    spark: Any, box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given keys 0..4 published by a concurrent run of the job, after this run checked
    subscribe(box)
    rows = [row(i) for i in range(10)]
    publish_dataframe(frame(spark, rows[:5], 1), box, job="race", body="body")
    real = box.receipts
    calls: list[int] = []

    def stale(loc: str, keys: Sequence[str]) -> dict[str, list[uuid.UUID]]:
        calls.append(len(keys))
        return {} if len(calls) == 1 else real(loc, keys)

    monkeypatch.setattr(box, "receipts", stale)
    raised: list[Exception] = []
    publish = box.publish

    def watched(*args: Any, **kwargs: Any) -> Any:
        try:
            return publish(*args, **kwargs)
        except AlreadyReceived as exc:
            raised.append(exc)
            raise

    monkeypatch.setattr(box, "publish", watched)
    # When this run publishes all ten (from the driver)
    report = publish_dataframe(frame(spark, rows, 1), box, job="race", body="body", parallel=False)
    # Then its first attempt stores nothing, and it publishes only the other five
    assert len(raised) == 1
    assert (report.published, report.skipped) == (5, 5)
    counts = table_counts(box)
    assert counts["mb_spool"] == counts["mb_receipt"] == 10


def test_rows_give_their_messages_due_times_and_expiries(spark: Any, box: MessageBox) -> None:
    # Given rows with a due time (one null: due at once) and an expiry column
    box.create_host("h")
    box.subscribe("eu", host="h", filter=P("o.Region") == "EU")
    now = box.now()
    later, end = now + timedelta(hours=1), now + timedelta(hours=3)
    df = spark.createDataFrame(
        [(1, "EU", later, end), (2, "EU", None, None)],
        "key BIGINT, `o.Region` STRING, due TIMESTAMP, ends TIMESTAMP",
    )
    report = publish_dataframe(df, box, job="t", deliver_at="due", expires_at="ends")
    # Then the first is scheduled, with its expiry; the second is due now, expiring never;
    # and neither time column became a property
    assert report.published == 2
    [e] = box.scheduled()
    assert (e.message_id, e.due_at, e.expires_at) == (message_id("t", 1), later, end)
    assert box.read_message(message_id("t", 2)).promoted == {"o.Region": "EU"}
    with pytest.raises(ValidationError, match=r"deliver_at column 'o\.Region' must be a timestamp"):
        publish_dataframe(df, box, job="u", deliver_at="o.Region")
