"""Expiry (docs/concepts.md: Expiry), on both backends: an entry past its expiry is never
claimed; the sweep (a host instance's heartbeat, the cleanup job for hosts no instance
runs) suspends it as ``expired`` (resumable with a new expiry) or drops it, as its
subscription says; an entry in hand finishes; a host's ``message_ttl_seconds`` gives
entries queued after it is set an expiry; an expired entry holds none of its service
instance's other messages; expiries are counted per subscription."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox, metrics
from messagebox.errors import ValidationError
from messagebox.hosts import HostInstance
from messagebox.models import EXPIRED
from messagebox.predicates import P
from messagebox.storage import expiry
from messagebox.storage import schema as mb_schema
from messagebox.upkeep import Swept
from tests.conftest import FAST_HOST, claim, complete, wait_for

HOUR = timedelta(hours=1)
_hosts = itertools.count()


def _host(box: MessageBox, **subscription: object) -> str:
    """A new host with one subscription (named as the host) to ``t.K == host``."""
    name = f"x{next(_hosts)}"
    box.create_host(name)
    box.subscribe(name, host=name, filter=P("t.K") == name, name=name, **subscription)  # type: ignore[arg-type]
    return name


def _msg(host: str, n: int = 0, **times: object) -> Message:
    return Message(f"{n}".encode(), promoted={"t.K": host, "t.N": n}, **times)  # type: ignore[arg-type]


def _expire_now(box: MessageBox, host: str) -> None:
    """Make the host's entries that expire have expired a second ago, by the store's
    clock (as if their time had passed)."""
    q = mb_schema.queue
    past = box.now() - timedelta(seconds=1)
    with box.store.transaction(serial=True) as conn:
        conn.execute(
            q.update().where(q.c.host == host, q.c.expires_at.is_not(None)).values(expires_at=past)
        )


def _sweep(box: MessageBox, host: str) -> Swept:
    with box.store.transaction(serial=True) as conn:
        return expiry.sweep(conn, box.store.dialect, host)


def _expires(box: MessageBox, host: str) -> list[datetime | None]:
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return [
            None if e is None else e.astimezone(UTC)
            for e in conn.execute(
                sa.select(q.c.expires_at).where(q.c.host == host).order_by(q.c.id)
            ).scalars()
        ]


def _at(value: datetime | None) -> datetime:
    assert value is not None
    return value


def test_an_expired_entry_is_never_claimed_and_is_suspended_as_expired(box: MessageBox):
    # Given two entries that expire in an hour, and one that never does
    h = _host(box)
    routed = box.publish(
        [_msg(h, 0, ttl=3600), _msg(h, 1, expires_at=box.now() + HOUR), _msg(h, 2)]
    )
    end = _expires(box, h)
    assert end[2] is None
    assert all(
        e is not None and HOUR - timedelta(seconds=5) < e - box.now() <= HOUR for e in end[:2]
    )
    # When their time has passed, a claim takes only the one that does not expire
    _expire_now(box, h)
    assert [c.msg for c in claim(box, h, n=10)] == [routed[2].message_id]
    # Then the sweep suspends them, resumable, reason expired, keeping their references
    before = metrics.EXPIRED.labels(h)._value.get()
    assert _sweep(box, h) == Swept(suspended=2, dropped=0)
    entries = box.suspended(host=h)
    assert [(e.reason, e.resumable) for e in entries] == [(EXPIRED, True)] * 2
    assert all(e.error is not None and "expired at" in e.error for e in entries)
    assert [box.references(r.message_id) for r in routed[:2]] == [1, 1]
    assert metrics.EXPIRED.labels(h)._value.get() == before + 2
    assert _sweep(box, h) == Swept()
    # and the per-minute counts (the console's chart) have them, by subscription
    box.store.write_tally()
    assert sum(box.rates(5).counts[("expired", h)]) == 2


def test_a_subscription_that_drops_expired_entries_releases_them(box: MessageBox):
    h = _host(box, on_expiry="drop")
    assert box.subscription(h).on_expiry == "drop"
    [routed] = box.publish([_msg(h, ttl=3600)])
    _expire_now(box, h)
    assert _sweep(box, h) == Swept(suspended=0, dropped=1)
    assert box.suspended(host=h) == []
    assert box.references(routed.message_id) == 0
    assert box.cleanup().messages == 1


def test_an_entry_in_hand_when_it_expires_finishes(box: MessageBox):
    # Given an entry claimed (leased) before its expiry
    h = _host(box)
    box.publish([_msg(h, ttl=3600)])
    [c] = claim(box, h)
    # When it expires while in hand, the sweep leaves it, and its delivery completes
    _expire_now(box, h)
    assert _sweep(box, h) == Swept()
    complete(box, c)
    assert box.queue_stats(h) == []
    assert box.suspended(host=h) == []


def test_resume_gives_an_expired_entry_a_new_expiry_or_none(box: MessageBox):
    h = _host(box)
    box.publish([_msg(h, i, ttl=3600) for i in range(3)])
    _expire_now(box, h)
    _sweep(box, h)
    a, b, c = (e.id for e in box.suspended(host=h))
    at = box.now() + 2 * HOUR
    assert box.resume(a, ttl=60) == [a]
    assert box.resume(b, expires_at=at) == [b]
    assert box.resume(reason=EXPIRED, host=h) == [c]  # in bulk: no expiry
    ends = dict(zip((a, b, c), _expires(box, h), strict=True))
    assert timedelta(seconds=55) < _at(ends[a]) - box.now() <= timedelta(seconds=60)
    assert ends[b] == at
    assert ends[c] is None
    assert len(claim(box, h, n=5)) == 3


def test_resume_refuses_an_expiry_that_has_passed_or_is_malformed(box: MessageBox):
    h = _host(box)
    box.publish([_msg(h, ttl=3600)])
    _expire_now(box, h)
    _sweep(box, h)
    [e] = box.suspended(host=h)
    with pytest.raises(ValidationError, match="has passed"):
        box.resume(e.id, expires_at=box.now() - HOUR)
    with pytest.raises(ValidationError, match="timezone-aware"):
        box.resume(e.id, expires_at=datetime(2040, 1, 1))
    with pytest.raises(ValidationError, match="not both"):
        box.resume(e.id, ttl=5, expires_at=box.now() + HOUR)
    with pytest.raises(ValidationError, match="ttl must be"):
        box.resume(e.id, ttl=-5)
    assert [x.id for x in box.suspended(host=h)] == [e.id]  # nothing resumed


def test_a_host_ttl_expires_entries_queued_after_it_is_set(box: MessageBox):
    # Given a host whose entries live at most 10 minutes after they are due
    h = _host(box)
    box.publish([_msg(h, 0)])
    box.configure_host(h, message_ttl_seconds=600)
    assert box.host(h).settings.message_ttl_seconds == 600
    # When messages are published: one with no expiry, one that expires sooner, one
    # that expires later, one scheduled in an hour
    now = box.now()
    box.publish(
        [
            _msg(h, 1),
            _msg(h, 2, ttl=60),
            _msg(h, 3, ttl=7200),
            _msg(h, 4, deliver_at=now + HOUR),
        ]
    )
    before, plain, sooner, later, scheduled = _expires(box, h)
    # Then each expires at the earlier of its own expiry and 10 minutes after it is due;
    # the entry queued before the setting does not expire
    minutes = timedelta(minutes=10)
    assert before is None
    close = timedelta(seconds=5)
    assert abs(_at(plain) - now - minutes) < close
    assert abs(_at(sooner) - now - timedelta(seconds=60)) < close
    assert abs(_at(later) - now - minutes) < close
    assert abs(_at(scheduled) - now - HOUR - minutes) < close


@pytest.mark.parametrize("ttl", [0, -1, 366 * 86_400, float("nan"), True])
def test_a_bad_host_ttl_is_refused(box: MessageBox, ttl: object):
    h = _host(box)
    with pytest.raises(ValidationError, match="message_ttl_seconds"):
        box.configure_host(h, message_ttl_seconds=ttl)
    assert box.host(h).settings.message_ttl_seconds is None


def test_a_host_instance_sweeps_its_host_at_every_heartbeat(
    box: MessageBox, instances: list[HostInstance]
):
    # Given entries held for a stopped service, expiring in 0.3 s, one of them dropped
    h = _host(box)
    box.subscribe(h, host=h, filter=P("t.K") == h, name=f"{h}-drop", on_expiry="drop")
    box.set_service_state(h, "stopped")
    [routed] = box.publish([_msg(h, ttl=0.3)])
    inst = HostInstance(box, h, {h: lambda d: None}, settings=FAST_HOST).start()
    instances.append(inst)
    # Then its heartbeat (every 0.2 s) suspends the one and drops the other
    wait_for(lambda: not box.queue_stats(h), "the expired entries swept")
    [e] = box.suspended(host=h)
    assert e.reason == EXPIRED
    assert box.references(routed.message_id) == 1
    assert inst.stats.snapshot()["expired"] == 2


def test_the_cleanup_job_sweeps_the_hosts_no_instance_runs(box: MessageBox):
    h = _host(box)
    box.publish([_msg(h, i, ttl=3600) for i in range(3)])
    _expire_now(box, h)
    report = box.cleanup()
    assert report.expired == 3
    assert [e.reason for e in box.suspended(host=h)] == [EXPIRED] * 3


def test_an_expired_entry_holds_none_of_its_service_instances_messages(box: MessageBox):
    # Given a correlated subscription: one instance per t.Id, one message at a time
    h = f"x{next(_hosts)}"
    box.create_host(h)
    box.subscribe("svc", host=h, filter=P("t.K") == h, correlation=["t.Id"])
    first = Message(b"0", promoted={"t.K": h, "t.Id": "a", "t.N": 0}, ttl=3600)
    second = Message(b"1", promoted={"t.K": h, "t.Id": "a", "t.N": 1})
    routed = box.publish([first, second])
    # When the first expires, the second is the instance's head at once
    _expire_now(box, h)
    [c] = claim(box, h, n=5, instances=True)
    assert c.msg == routed[1].message_id
    complete(box, c)
    # and once the expired one is suspended, it holds nothing either
    _sweep(box, h)
    box.publish([Message(b"2", promoted={"t.K": h, "t.Id": "a", "t.N": 2})])
    [c] = claim(box, h, n=5, instances=True)
    assert box.read_message(c.msg).promoted["t.N"] == 2


def test_an_ordered_subscription_passes_over_its_expired_entries(box: MessageBox):
    from messagebox.delivery import leases

    h = _host(box, ordered=True)
    routed = box.publish([_msg(h, 0, ttl=3600), _msg(h, 1), _msg(h, 2)])
    _expire_now(box, h)
    with box.store.transaction(serial=True) as conn:
        run = leases.claim(
            conn, box.store.dialect, host=h, owner="t", n=10, lease_seconds=30, ordered=True
        )
    assert [c.msg for c in run] == [r.message_id for r in routed[1:]]


expiries = st.lists(st.one_of(st.none(), st.integers(-3600, -1), st.integers(60, 3600)), max_size=8)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ends=expiries, drop=st.booleans())
def test_a_sweep_takes_exactly_the_expired_entries(
    box: MessageBox, ends: list[int | None], drop: bool
):
    # Given entries expiring in the future, none, or (set by the store's clock) in the past
    h = _host(box, on_expiry="drop" if drop else "suspend")
    box.publish(
        [_msg(h, i, ttl=None if e is None else 4000) for i, e in enumerate(ends)] or [_msg(h, 99)]
    )
    q = mb_schema.queue
    now = box.now()
    with box.store.transaction(serial=True) as conn:
        ids = list(conn.execute(sa.select(q.c.id).where(q.c.host == h).order_by(q.c.id)).scalars())
        for entry, e in zip(ids, ends, strict=False):
            if e is not None:
                at = now + timedelta(seconds=e)
                conn.execute(q.update().where(q.c.id == entry).values(expires_at=at))
    expired = sum(1 for e in ends if e is not None and e < 0)
    # When swept, exactly the expired ones go, suspended or dropped
    swept = _sweep(box, h)
    assert swept == (Swept(0, expired) if drop else Swept(expired, 0))
    assert len(box.suspended(host=h)) == (0 if drop else expired)
    left = sum(q.depth for q in box.queue_stats(h))
    assert left == (len(ends) or 1) - expired
