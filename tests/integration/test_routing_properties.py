"""Property test: both routers (the in-memory index, with its compiled matcher and in
pure Python, and the SQL statement) on every backend agree with the reference evaluator.

Random filters and random messages (tests/strategies.py); for each example the filters
are subscribed, the messages published, and every (message, subscription) pair the
router produced must be exactly the pairs ``Filter.matches`` says. Subscriptions come and
go between examples, so the index also follows routing versions as it goes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from messagebox.predicates import Filter
from messagebox.predicates import index as index_module
from tests.conftest import scratch_url
from tests.strategies import filters, messages


@pytest.fixture(
    scope="module",
    params=[
        ("duckdb", "index"),
        ("duckdb", "index-python"),
        ("duckdb", "sql"),
        ("postgresql", "index"),
        ("postgresql", "index-python"),
        ("postgresql", "sql"),
    ],
    ids=lambda p: "-".join(p),
)
def routed_box(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MessageBox]:
    """One store per backend and router for the module, with a host ``h``."""
    backend, router = request.param
    with (
        pytest.MonkeyPatch.context() as patch,
        scratch_url(backend, tmp_path_factory.mktemp("routed")) as url,
    ):
        if router == "index-python":  # the index's pure-Python matcher
            patch.setattr(index_module, "NATIVE", False)
        box = MessageBox(url, router=router.removesuffix("-python"))
        box.create_host("h")
        try:
            yield box
        finally:
            box.close()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    subs=st.lists(filters, min_size=1, max_size=6),
    batch=st.lists(messages, min_size=1, max_size=8),
)
def test_routers_agree_with_the_reference_evaluator(
    routed_box: MessageBox, subs: list[Filter], batch: list[dict[str, object]]
):
    shared_box = routed_box
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
