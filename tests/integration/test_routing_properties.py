"""Property test: the SQL router on every backend agrees with the reference evaluator.

Random filters and random messages (tests/strategies.py); for each example the filters
are subscribed, the messages published, and every (message, subscription) pair the
router produced must be exactly the pairs ``Filter.matches`` says.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from predicates import Filter
from tests.strategies import filters, messages


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
