"""Times as hot statements fetch them on DuckDB (microseconds since the epoch), read back
by ``clock.fetched``: the very instant, to the microsecond, on either of its paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import example, given
from hypothesis import strategies as st

from messagebox import clock

_MAX_US = (datetime(9999, 12, 31, tzinfo=UTC) - clock._EPOCH) // timedelta(microseconds=1)


@given(at=st.integers(min_value=0, max_value=_MAX_US))
@example(at=0)
@example(at=clock._EXACT_US - 1)
@example(at=clock._EXACT_US)
@example(at=1_764_300_000_999_999)
@example(at=1_764_300_000_500_000)
def test_microseconds_read_back_as_the_instant_they_name(at: int) -> None:
    got = clock.fetched(at)
    assert got == clock._EPOCH + timedelta(microseconds=at)
    assert got.tzinfo is UTC


@given(us=st.integers(min_value=0, max_value=999_999), second=st.integers(0, 4_102_444_799))
def test_every_microsecond_of_a_second_before_2100_is_exact(us: int, second: int) -> None:
    at = second * 1_000_000 + us
    assert clock.fetched(at).microsecond == us
    assert clock.fetched(at) == clock._EPOCH + timedelta(microseconds=at)


def test_a_datetime_is_read_as_it_is() -> None:
    now = datetime.now(UTC)
    assert clock.fetched(now) is now
