"""A bulk histogram update counts exactly as one observe per value."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from messagebox.metrics import observe_many

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def _samples(h: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in h.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([0.0, *BUCKETS, 0.005, 0.5, 5.0, 100.0]) | st.floats(0, 1e6), max_size=50
    )
)
def test_observe_many_counts_as_observe_each(values: list[float]) -> None:
    one = Histogram("one", "x", ["host"], buckets=BUCKETS, registry=CollectorRegistry())
    bulk = Histogram("bulk", "x", ["host"], buckets=BUCKETS, registry=CollectorRegistry())
    child = one.labels("h")  # both have the child, observed or not
    for v in values:
        child.observe(v)
    observe_many(bulk.labels("h"), values)
    expected = {(n.replace("one", "bulk"), le): v for (n, le), v in _samples(one).items()}
    got = _samples(bulk)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key
