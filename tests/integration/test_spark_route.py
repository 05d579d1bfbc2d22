"""The Spark router agrees exactly with the reference evaluator and the SQL router.

Hypothesis draws a fixed (derandomised) sample of filters and messages once; the whole
pool is routed through Spark in one job (every message against every filter, so each
pair is a case), and compared with ``Filter.matches`` and with the SQL router of each
backend on the same subscriptions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from messagebox import MessageBox
from messagebox.pipelines.spark import Target, route_dataframe
from messagebox.predicates import Filter, normalize_properties
from messagebox.properties import canonical_name
from messagebox.routing import router
from tests.conftest import scratch_url
from tests.strategies import bools, dates, filters, ints, messages, strs

# each value column of the long layout holds one type
LONG_SCHEMA = (
    "key INT, property STRING, value_str STRING, value_int BIGINT, value_float DOUBLE, "
    "value_bool BOOLEAN, value_ts TIMESTAMP"
)
PAD = "z.pad"  # a property no filter tests: a long frame knows a message by its rows

WIDE_TYPES = {"t.a": "STRING", "t.b": "BIGINT", "t.c": "TIMESTAMP", "BTS.kind": "BOOLEAN"}
wide_messages = st.fixed_dictionaries(
    {}, optional={"t.a": strs, "t.b": ints, "t.c": dates, "BTS.kind": bools}
)


def draw(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """A fixed sample of ``n`` examples (derandomised: the same on every run)."""
    out: list[Any] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def long_rows(batch: Sequence[Mapping[str, object]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for key, props in enumerate(batch):
        for name, value in {**props, PAD: 0}.items():
            cells: list[Any] = [None] * 5
            slot = (
                3
                if isinstance(value, bool)
                else 1
                if isinstance(value, int)
                else 2
                if isinstance(value, float)
                else 4
                if isinstance(value, datetime)
                else 0
            )
            cells[slot] = value
            rows.append((key, name, *cells))
    return rows


def reference(
    batch: Sequence[Mapping[str, object]], subs: Sequence[Filter]
) -> set[tuple[int, int]]:
    normal = [normalize_properties(p) for p in batch]
    return {
        (i, j + 1) for i, props in enumerate(normal) for j, f in enumerate(subs) if f.matches(props)
    }


def pairs(routes: Any, key: str = "key") -> set[tuple[Any, int]]:
    return {(r[key], r["subscription"]) for r in routes.collect()}


@pytest.fixture(scope="module")
def pool() -> tuple[list[Filter], list[dict[str, object]]]:
    subs = [f for group in draw(st.lists(filters, min_size=1, max_size=4), 80) for f in group]
    batch = [m for group in draw(st.lists(messages, min_size=1, max_size=6), 80) for m in group]
    return subs, batch


@pytest.fixture(scope="module")
def long_routes(spark: Any, pool: tuple[list[Filter], list[dict[str, object]]]) -> set[Any]:
    subs, batch = pool
    df = spark.createDataFrame(long_rows(batch), LONG_SCHEMA)
    targets = [Target(j + 1, f"s{j}", f) for j, f in enumerate(subs)]
    return pairs(route_dataframe(df, targets))


def test_pool_covers_every_operator_and_both_outcomes(
    pool: tuple[list[Filter], list[dict[str, object]]], long_routes: set[Any]
) -> None:
    subs, batch = pool
    ops = {p.op for f in subs for g in f.groups for p in g.predicates}
    assert len(ops) == 11
    assert len(subs) >= 150
    assert len(batch) >= 200
    assert 0 < len(long_routes) < len(subs) * len(batch)


def test_long_frames_route_as_the_reference_evaluator(
    pool: tuple[list[Filter], list[dict[str, object]]], long_routes: set[Any]
) -> None:
    subs, batch = pool
    assert long_routes == reference(batch, subs)


def test_wide_frames_route_as_the_reference_evaluator(
    spark: Any, pool: tuple[list[Filter], list[dict[str, object]]]
) -> None:
    subs, _ = pool
    batch = [m for g in draw(st.lists(wide_messages, min_size=1, max_size=6), 60) for m in g]
    names = list(WIDE_TYPES)
    schema = "key INT, " + ", ".join(f"`{n}` {t}" for n, t in WIDE_TYPES.items())
    df = spark.createDataFrame(
        [(i, *(m.get(n) for n in names)) for i, m in enumerate(batch)], schema
    )
    targets = [Target(j + 1, f"s{j}", f) for j, f in enumerate(subs)]
    got = pairs(route_dataframe(df, targets))
    assert got == reference(batch, subs)
    assert got  # the sample routes something


@pytest.fixture(scope="module", params=["duckdb", "postgresql"])
def pool_box(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pool: tuple[list[Filter], list[dict[str, object]]],
) -> Iterator[MessageBox]:
    """A store per backend holding the pool's filters as subscriptions."""
    with scratch_url(request.param, tmp_path_factory.mktemp("spark")) as url:
        box = MessageBox(url)
        box.create_host("h")
        box.subscribe_many(
            [{"service": f"s{j}", "host": "h", "filter": f} for j, f in enumerate(pool[0])]
        )
        try:
            yield box
        finally:
            box.close()


def test_spark_routes_as_the_sql_router(
    spark: Any, pool: tuple[list[Filter], list[dict[str, object]]], pool_box: MessageBox
) -> None:
    """Subscriptions read from the store by URL; the SQL router routes the same batch."""
    _, batch = pool
    with pool_box.store.transaction() as conn:
        sql = router.route(conn, pool_box.store.dialect, [normalize_properties(p) for p in batch])
    want = {(i, row.sub) for i, rows in enumerate(sql) for row in rows}
    df = spark.createDataFrame(long_rows(batch), LONG_SCHEMA)
    routes = route_dataframe(df, pool_box.url.render_as_string(hide_password=False))
    assert pairs(routes) == want
    services = {r["subscription"]: (r["service"], r["host"]) for r in routes.collect()}
    subs = {s.id: (s.service, s.host) for s in pool_box.subscriptions()}
    assert all(subs[sid] == found for sid, found in services.items())


def test_canonical_names_in_both_layouts(spark: Any) -> None:
    """``BTS.`` is ``messagebox.`` in column names, property values and filters."""
    assert canonical_name("bts.Kind") == "messagebox.Kind"
    wide = spark.createDataFrame([(1, "x")], "key INT, `bts.Kind` STRING")
    long = spark.createDataFrame([(1, "BTS.Kind", "x")], "key INT, property STRING, value STRING")
    subs = {"k": Filter.of(__import__("predicates").P("messagebox.Kind") == "x")}
    assert pairs(route_dataframe(wide, subs)) == {(1, 1)}
    assert pairs(route_dataframe(long, subs)) == {(1, 1)}


def test_datetime_instants_compare_across_zones(spark: Any) -> None:
    from datetime import timedelta, timezone

    from messagebox.predicates import P

    at = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)
    india = at.astimezone(timezone(timedelta(hours=5, minutes=30)))
    df = spark.createDataFrame(
        [(1, india), (2, at + timedelta(microseconds=1))], "key INT, `t.at` TIMESTAMP"
    )
    subs = {"eq": P("t.at") == at, "after": P("t.at") > at}
    assert pairs(route_dataframe(df, subs)) == {(1, 1), (2, 2)}
