"""A publish's times (docs/concepts.md: Scheduled delivery, Expiry), without a
database: each message's due time and expiry from its own times, the batch's delay and
the publish's time (hypothesis), and an entry's expiry under its host's ttl."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messagebox import Message
from messagebox.errors import MessageValidationError
from messagebox.timing import YEAR_SECONDS, batch_times, entry_expiry

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
offsets = st.one_of(st.none(), st.integers(-86_400, 86_400))
ttls = st.one_of(st.none(), st.integers(1, 86_400))


@st.composite
def messages(draw: st.DrawFn) -> Message:
    at, end, ttl = draw(offsets), draw(offsets), draw(ttls)
    if end is not None and ttl is not None:
        ttl = None  # one or the other
    deliver_at = None if at is None else NOW + timedelta(seconds=at)
    expires_at = None if end is None else NOW + timedelta(seconds=end)
    if deliver_at is not None and expires_at is not None and deliver_at >= expires_at:
        expires_at = None
    return Message(b"", deliver_at=deliver_at, expires_at=expires_at, ttl=ttl)


@given(
    batch=st.lists(messages(), min_size=1, max_size=6),
    delay=st.one_of(st.none(), st.integers(0, 7200)),
)
def test_each_message_is_due_at_its_own_time_else_after_the_delay(
    batch: list[Message], delay: int | None
) -> None:
    try:
        times = batch_times(batch, NOW, delay)
    except MessageValidationError as exc:
        # refused only for a message due at or after its expiry, named
        bad = int(str(exc).split()[1].rstrip(":"))
        m = batch[bad]
        end = m.expires_at if m.ttl is None else NOW + timedelta(seconds=m.ttl)
        later = NOW + timedelta(seconds=delay or 0)
        due = later if m.deliver_at is None else max(m.deliver_at, NOW)
        assert end is not None
        assert due >= end
        return
    if times is None:
        assert not delay
        assert all(m.timing is None for m in batch)
        return
    for m, due, end in zip(batch, times.due, times.expires, strict=True):
        later = NOW + timedelta(seconds=delay or 0)
        assert due == (later if m.deliver_at is None else max(m.deliver_at, NOW))
        assert end == (NOW + timedelta(seconds=m.ttl) if m.ttl is not None else m.expires_at)
        assert end is None or due < end


def test_a_service_publication_due_after_its_expiry_is_kept_not_refused() -> None:
    late = Message(b"", deliver_at=NOW + timedelta(hours=2), ttl=60)
    times = batch_times([late], NOW, None, strict=False)
    assert times is not None
    assert times.expires[0] == NOW + timedelta(seconds=60)


@given(due=st.integers(0, 10**6), own=st.one_of(st.none(), st.integers(1, 10**6)), host=ttls)
def test_an_entry_expires_at_the_earlier_of_its_message_and_its_host(
    due: int, own: int | None, host: int | None
) -> None:
    at = NOW + timedelta(seconds=due)
    end = None if own is None else at + timedelta(seconds=own)
    got = entry_expiry(at, end, host)
    candidates = [e for e in (end, None if host is None else at + timedelta(seconds=host)) if e]
    assert got == (min(candidates) if candidates else None)


def test_times_are_kept_in_utc() -> None:
    paris = timezone(timedelta(hours=2))
    m = Message(b"", deliver_at=datetime(2030, 6, 1, 14, 0, tzinfo=paris))
    assert m.deliver_at == NOW
    assert m.deliver_at.tzinfo is UTC


@pytest.mark.parametrize("ttl", [YEAR_SECONDS, 0.5])
def test_a_ttl_up_to_a_year_is_taken(ttl: float) -> None:
    assert Message(b"", ttl=ttl).ttl == ttl
