"""Property test: the SQL router on every backend agrees with the reference evaluator.

Random filters and random messages (tests/strategies.py); for each example the filters
are subscribed, the messages published, and every (message, subscription) pair the
router produced must be exactly the pairs ``Filter.matches`` says.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from predicates import Filter
from tests.strategies import filters, messages


@pytest.fixture(scope="module", params=["duckdb", "postgresql"])
def shared_box(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MessageBox]:
    """One store per backend for the whole module; each example cleans up after itself."""
    import uuid

    import sqlalchemy as sa

    from tests.conftest import PG_DSN, require_pg

    if request.param == "duckdb":
        box = MessageBox(f"duckdb:///{tmp_path_factory.mktemp('prop') / 'box.duckdb'}")
        box.create_host("h")
        yield box
        box.close()
        return
    require_pg()
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(PG_DSN)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {name}")
    box = MessageBox(f"{PG_DSN}?options=-csearch_path%3D{name}")
    box.create_host("h")
    try:
        yield box
    finally:
        box.close()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {name} CASCADE")
        engine.dispose()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    subs=st.lists(filters, min_size=1, max_size=6),
    batch=st.lists(messages, min_size=1, max_size=8),
)
def test_sql_router_agrees_with_the_reference_evaluator(
    shared_box: MessageBox, subs: list[Filter], batch: list[dict[str, object]]
):
    made = shared_box.subscribe_many(
        [{"service": f"s{i}", "host": "h", "filter": f} for i, f in enumerate(subs)]
    )
    try:
        results = shared_box.publish(
            [Message(b"", promoted=props) for props in batch], policy="drop", trusted=True
        )
        got = {(i, s) for i, r in enumerate(results) for s in r.subscriptions}
        want = {
            (i, sub.id)
            for i, props in enumerate(batch)
            for sub in made
            if sub.filter.matches(props)
        }
        assert got == want
    finally:
        shared_box.unsubscribe(*[s.id for s in made])
