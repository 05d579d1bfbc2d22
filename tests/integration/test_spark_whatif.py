"""What-if routing over stored messages, on both backends: the changes are exactly what
the reference evaluator says the proposal would change, and nothing is stored."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.pipelines.whatif import export_messages, what_if
from messagebox.predicates import Filter, P
from tests.conftest import table_counts

REGIONS = ["EU", "US", "APAC", "UK"]
START = datetime(2026, 1, 1, tzinfo=UTC)


def orders(n: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n):
        props: dict[str, object] = {
            "orders.Region": REGIONS[i % 4],
            "orders.Total": float(i * 37 % 1000),
            "orders.Qty": i % 7,
            "orders.Rush": i % 3 == 0,
            "orders.At": START + timedelta(hours=i),
        }
        if i % 5 == 0:
            del props["orders.Region"]
        out.append(props)
    return out


CURRENT = {
    "ship-eu": P("orders.Region") == "EU",
    "ship-us": P("orders.Region").in_(["US", "UK"]),
    "big": P("orders.Total") >= 500,
    "rush": P("orders.Rush") == True,  # noqa: E712
}


@pytest.fixture
def stocked(box: MessageBox) -> tuple[MessageBox, list[dict[str, object]]]:
    box.create_host("h")
    for service, filt in CURRENT.items():
        box.subscribe(service, host="h", filter=filt)
    batch = orders(120)
    box.publish([Message(b"o", promoted=p) for p in batch])
    return box, batch


def destinations(props: dict[str, object], subs: dict[str, Any]) -> set[str]:
    return {s for s, f in subs.items() if Filter.of(f).matches(props)}


def expected(batch: list[dict[str, object]], after: dict[str, Any]) -> dict[frozenset[str], int]:
    """How many messages change from one destination set to another."""
    counts: dict[frozenset[str], int] = {}
    for props in batch:
        before, later = destinations(props, CURRENT), destinations(props, after)
        if before != later:
            key = frozenset(f"-{s}" for s in before - later) | {f"+{s}" for s in later - before}
            counts[key] = counts.get(key, 0) + 1
    return counts


def observed(changes: Any) -> dict[frozenset[str], int]:
    counts: dict[frozenset[str], int] = {}
    for row in changes.collect():
        assert row["before"] != row["after"]
        key = frozenset(f"-{s}" for s in row["removed"]) | {f"+{s}" for s in row["added"]}
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_what_if_reports_exactly_the_messages_a_proposal_moves(
    spark: Any, stocked: tuple[MessageBox, list[dict[str, object]]]
) -> None:
    # Given stored orders routed by four services
    box, batch = stocked
    before = table_counts(box)
    # When ship-eu would also take the UK, and a new service takes small rush orders
    proposed = {
        "ship-eu": P("orders.Region").in_(["EU", "UK"]),
        "small-rush": (P("orders.Rush") == True) & (P("orders.Total") < 100),  # noqa: E712
    }
    report = what_if(box, proposed, spark=spark)
    # Then the changes are what the reference evaluator predicts, service by service
    after = {**CURRENT, **proposed}
    assert observed(report.changes) == expected(batch, after)
    changed = sum(1 for p in batch if destinations(p, CURRENT) != destinations(p, after))
    assert report.summary.messages == len(batch)
    assert report.summary.changed == changed > 0
    assert report.summary.gained["ship-eu"] == sum(
        1 for p in batch if p.get("orders.Region") == "UK"
    )
    assert report.summary.lost == {}
    assert f"{changed:,} of {len(batch):,} stored messages" in str(report.summary)
    # and nothing was stored or changed
    assert table_counts(box) == before


def test_replace_all_drops_the_services_the_proposal_leaves_out(
    spark: Any, stocked: tuple[MessageBox, list[dict[str, object]]], tmp_path: Path
) -> None:
    box, batch = stocked
    proposed = {"ship-eu": P("orders.Region") == "EU", "big": P("orders.Total") > 900}
    path = tmp_path / "proposed.json"
    path.write_text(
        json.dumps(
            [
                {"service": s, "filter": json.loads(Filter.of(f).to_json())}
                for s, f in proposed.items()
            ]
        )
    )
    report = what_if(box, str(path), spark=spark, replace_all=True)
    assert observed(report.changes) == expected(batch, proposed)
    assert set(report.summary.lost) == {"ship-us", "rush", "big"}
    assert "ship-eu" not in report.summary.gained


def test_export_keeps_every_promoted_value_exactly(
    spark: Any, box: MessageBox, tmp_path: Path
) -> None:
    box.create_host("h")
    box.subscribe("all", host="h", filter=P("x.s").exists() | P("x.s").not_exists())
    props = {
        "x.s": "é😀",
        "x.i": 2**63 - 1,
        "x.f": -0.5,
        "x.b": False,
        "x.t": datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC),
    }
    [routed] = box.publish([Message(b"", promoted=props)])
    frame = export_messages(box, spark, tmp_path / "export")
    rows = {r["property"]: r for r in frame.collect()}
    assert {r["message_id"] for r in rows.values()} == {str(routed.message_id)}
    assert rows["x.s"]["value_str"] == "é😀"
    assert rows["x.i"]["value_int"] == 2**63 - 1
    assert rows["x.f"]["value_float"] == -0.5
    assert rows["x.b"]["value_bool"] is False
    stamp = frame.selectExpr("unix_micros(value_ts) AS m").where("m IS NOT NULL").first()
    assert stamp is not None
    when = props["x.t"]
    assert isinstance(when, datetime)
    assert stamp["m"] == int((when - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


def test_a_plan_routed_on_spark_agrees_with_one_routed_in_process(
    spark: Any, stocked: tuple[MessageBox, list[dict[str, object]]]
) -> None:
    from messagebox.pipelines.whatif import spark_router

    box, _ = stocked
    config = box.export_config().text()
    proposal = config.replace('orders.Region == "EU"', 'orders.Region in ["EU", "UK"]').replace(
        "orders.Total >= 500", "orders.Total >= 800"
    )
    here = box.plan(proposal).traffic
    there = box.plan(proposal, router=spark_router(spark)).traffic
    assert here is not None
    assert there is not None
    assert there.router == "spark"
    assert here.router == "python"
    assert here.changed > 0
    assert here.subscriptions["big"].lost > 0
    assert here.subscriptions["ship-eu"].gained > 0
    counts = {n: (e.gained, e.lost) for n, e in here.subscriptions.items()}
    assert {n: (e.gained, e.lost) for n, e in there.subscriptions.items()} == counts
    assert (there.messages, there.changed, there.new_failures, there.fixed_failures) == (
        here.messages,
        here.changed,
        here.new_failures,
        here.fixed_failures,
    )
