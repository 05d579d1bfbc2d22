"""Scheduled delivery (docs/concepts.md: Scheduled delivery), on both backends: an entry
published with ``deliver_at`` or a batch ``delay`` is routed and stored at once, is not
claimed before its time (the database's), and is claimed within ``poll_min_seconds`` of
it by an idle host instance; an ordered subscription's scheduled head holds the later
entries; a scheduled entry of a service instance holds none of its other messages;
operators see, deliver now and cancel scheduled entries; bad times store nothing."""

from __future__ import annotations

import itertools
import math
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from messagebox import Message, MessageBox, UnknownScheduledEntry
from messagebox.claims import Claim
from messagebox.delivery import leases
from messagebox.errors import MessageValidationError, ValidationError
from messagebox.hosts import Delivery, HostApp, HostInstance, Orchestration, activate
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import FAST_HOST, claim, complete, table_counts, wait_for

HOUR = timedelta(hours=1)
_hosts = itertools.count()


def _host(box: MessageBox, **subscription: object) -> str:
    """A new host with one subscription (named as the host) to ``t.K == host``."""
    name = f"h{next(_hosts)}"
    box.create_host(name)
    box.subscribe(name, host=name, filter=P("t.K") == name, name=name, **subscription)  # type: ignore[arg-type]
    return name


def _msg(host: str, n: int = 0, **times: object) -> Message:
    return Message(f"{n}".encode(), promoted={"t.K": host, "t.N": n}, **times)  # type: ignore[arg-type]


def test_a_scheduled_entry_is_routed_at_once_and_claimed_only_when_due(box: MessageBox):
    # Given an entry due in an hour, by the store's clock
    h = _host(box)
    due = box.now() + HOUR
    [routed] = box.publish([_msg(h, deliver_at=due)])
    # Then it is routed and stored now, and seen as scheduled
    assert routed.subscriptions
    [q] = box.queue_stats(h)
    assert (q.depth, q.scheduled, q.ready, q.held, q.leased) == (1, 1, 0, 0, 0)
    assert q.next_due_at is not None
    assert abs(q.next_due_at - due) < timedelta(milliseconds=1)
    [entry] = box.scheduled(host=h)
    assert (entry.message_id, entry.name, entry.held) == (routed.message_id, h, False)
    assert box.stats().queued["scheduled"] == 1
    # When a host instance claims, it gets nothing
    assert claim(box, h, n=10) == []
    # Until it is due: made due now (as if the hour had passed)
    assert box.deliver_now(entry.id) == [entry.id]
    [c] = claim(box, h, n=10)
    assert c.msg == routed.message_id
    assert box.scheduled(host=h) == []


delays = st.lists(
    st.one_of(st.none(), st.integers(-3600, -1), st.integers(60, 3600)), min_size=1, max_size=8
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offsets=delays, batch_delay=st.one_of(st.none(), st.just(0), st.integers(60, 600)))
def test_exactly_the_due_entries_are_claimed(
    box: MessageBox, offsets: list[int | None], batch_delay: int | None
):
    # Given a batch whose messages are due in the past, in the future or (no deliver_at)
    # after the batch's delay
    h = _host(box)
    now = box.now()
    messages = [
        _msg(h, i, deliver_at=None if o is None else now + timedelta(seconds=o))
        for i, o in enumerate(offsets)
    ]
    box.publish(messages, delay=batch_delay)
    # When a host instance claims everything it can
    got = sorted(_n(box, c) for c in claim(box, h, n=100))
    # Then it got exactly the messages due by now; the others are seen as scheduled
    due = [
        i
        for i, o in enumerate(offsets)
        if (o is not None and o < 0) or (o is None and not batch_delay)
    ]
    assert got == due
    later = len(offsets) - len(due)
    [q] = box.queue_stats(h)
    assert (q.scheduled, q.leased, q.ready) == (later, len(due), 0)
    assert len(box.scheduled(host=h)) == later


def test_delay_holds_the_messages_without_their_own_deliver_at(box: MessageBox):
    h = _host(box)
    now = box.now()
    early = now + timedelta(minutes=1)
    box.publish([_msg(h, 0), _msg(h, 1, deliver_at=early)], delay=7200)
    by_n = {
        int(box.read_message(e.message_id).promoted["t.N"]): e.due_at  # type: ignore[arg-type]
        for e in box.scheduled(host=h)
    }
    assert abs(by_n[1] - early) < timedelta(milliseconds=1)
    assert timedelta(seconds=7199) < by_n[0] - now < timedelta(seconds=7300)


def test_a_deliver_at_in_the_past_is_due_at_once(box: MessageBox):
    h = _host(box)
    box.publish([_msg(h, deliver_at=datetime(2020, 1, 1, tzinfo=UTC))])
    assert len(claim(box, h, n=5)) == 1


@pytest.mark.parametrize(
    ("times", "error"),
    [
        ({"deliver_at": datetime(2030, 1, 1)}, "deliver_at must be timezone-aware"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at must be timezone-aware"),
        ({"deliver_at": "2030-01-01"}, "deliver_at must be a timezone-aware datetime"),
        ({"ttl": -1}, "ttl must be a finite number of seconds of at least 0"),
        ({"ttl": math.nan}, "ttl must be a finite number"),
        ({"ttl": math.inf}, "ttl must be a finite number"),
        ({"ttl": 366 * 86_400}, "ttl must be at most 365 days"),
        ({"ttl": 0}, "ttl must be more than 0"),
        ({"ttl": True}, "ttl must be a number of seconds"),
        (
            {
                "deliver_at": datetime(2031, 1, 1, tzinfo=UTC),
                "expires_at": datetime(2030, 1, 1, tzinfo=UTC),
            },
            "is not before expires_at",
        ),
        ({"expires_at": datetime(2031, 1, 1, tzinfo=UTC), "ttl": 5}, "not both"),
    ],
)
def test_a_message_with_bad_times_is_refused_when_built(times: dict[str, object], error: str):
    with pytest.raises(MessageValidationError, match=error):
        Message(b"x", **times)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-1, "delay must be a finite number of seconds of at least 0"),
        (math.nan, "delay must be a finite"),
        (400 * 86_400, "delay must be at most 365 days"),
        ("5", "delay must be a number of seconds"),
    ],
)
def test_a_bad_delay_stores_nothing(box: MessageBox, delay: object, error: str):
    h = _host(box)
    before = table_counts(box)
    with pytest.raises(ValidationError, match=error):
        box.publish([_msg(h)], delay=delay)  # type: ignore[arg-type]
    assert table_counts(box) == before


def test_a_message_due_after_its_expiry_refuses_the_batch(box: MessageBox):
    # Given a batch whose second message would be due (by the delay, or its own time)
    # after its expiry, counted from the publish
    h = _host(box)
    before = table_counts(box)
    with pytest.raises(MessageValidationError, match=r"message 1: due at .* not before its expiry"):
        box.publish([_msg(h, 0), _msg(h, 1, ttl=60)], delay=120)
    with pytest.raises(MessageValidationError, match="message 0: due at"):
        box.publish([_msg(h, 0, deliver_at=box.now() + HOUR, ttl=60)])
    with pytest.raises(MessageValidationError, match="message 0: due at"):
        box.publish([_msg(h, 0, expires_at=box.now() - HOUR)])  # expired already
    # Then nothing of those batches was stored
    assert table_counts(box) == before


def test_an_ordered_subscription_waits_behind_its_scheduled_head(box: MessageBox):
    # Given an ordered subscription whose oldest entry is due in an hour, and two more
    # due now, and one in the middle of a later run due in an hour too
    h = _host(box, ordered=True)
    later = box.now() + HOUR
    box.publish([_msg(h, 0, deliver_at=later), _msg(h, 1), _msg(h, 2)])
    # When a host instance claims its runs, it gets nothing: the head holds the rest
    assert _claim_run(box, h) == []
    # Once the head is due, the run is taken whole, in publish order
    [head] = box.scheduled(host=h)
    box.deliver_now(head.id)
    assert [_n(box, c) for c in _claim_run(box, h)] == [0, 1, 2]


def test_a_scheduled_entry_in_a_run_ends_the_run_before_it(box: MessageBox):
    h = _host(box, ordered=True)
    box.publish([_msg(h, 0), _msg(h, 1, deliver_at=box.now() + HOUR), _msg(h, 2)])
    run = _claim_run(box, h)
    assert [_n(box, c) for c in run] == [0]
    for c in run:
        complete(box, c)
    assert _claim_run(box, h) == []  # 2 waits behind 1


def test_a_scheduled_message_of_a_service_instance_holds_none_of_its_others(box: MessageBox):
    # Given a correlated subscription: its messages with one key go to one instance,
    # one at a time, in publish order
    h = f"h{next(_hosts)}"
    box.create_host(h)
    box.subscribe("svc", host=h, filter=P("t.K") == h, correlation=["t.Id"])
    box.publish(
        [
            Message(b"0", promoted={"t.K": h, "t.Id": "a", "t.N": 0}, deliver_at=box.now() + HOUR),
            Message(b"1", promoted={"t.K": h, "t.Id": "a", "t.N": 1}),
        ]
    )
    # When a host instance claims the instances' heads, the later message is the head:
    # the scheduled one is not the instance's yet
    [c] = claim(box, h, n=5, instances=True)
    assert _n(box, c) == 1
    complete(box, c)
    # and once the scheduled one is due, it goes
    [e] = box.scheduled(host=h)
    box.deliver_now(e.id)
    [c] = claim(box, h, n=5, instances=True)
    assert _n(box, c) == 0


def test_deliver_now_and_cancel_by_id_and_in_bulk(box: MessageBox):
    # Given six scheduled entries on two subscriptions
    h = _host(box)
    other = _host(box)
    later = box.now() + HOUR
    box.publish([_msg(h, i, deliver_at=later) for i in range(3)])
    box.publish([_msg(other, i, deliver_at=later) for i in range(3)])
    first, second, third = (e.id for e in box.scheduled(host=h))
    # When one is delivered now by id, and the rest of its subscription in bulk
    assert box.deliver_now(first) == [first]
    assert box.deliver_now(subscription=h) == [second, third]
    # Then they are claimed; the other subscription's stay scheduled
    assert len(claim(box, h, n=10)) == 3
    assert len(box.scheduled(subscription=other)) == 3
    # When one is cancelled by id and the rest by service
    one, *rest = (e.id for e in box.scheduled(subscription=other))
    msgs = [e.message_id for e in box.scheduled(subscription=other)]
    assert box.cancel_scheduled(one) == [one]
    assert box.cancel_scheduled(service=other) == rest
    # Then their references are released, and cleanup deletes their messages
    assert box.scheduled() == []
    assert [box.references(m) for m in msgs] == [0, 0, 0]
    assert box.cleanup().messages == 3


def test_operations_on_scheduled_entries_refuse_what_is_not_scheduled(box: MessageBox):
    h = _host(box)
    box.publish([_msg(h, 0), _msg(h, 1, deliver_at=box.now() + HOUR)])
    [scheduled] = box.scheduled(host=h)
    due = scheduled.id - 1  # the entry due now
    with pytest.raises(UnknownScheduledEntry, match=f"no scheduled entry {due}"):
        box.deliver_now(scheduled.id, due)  # all or none
    with pytest.raises(UnknownScheduledEntry):
        box.cancel_scheduled(10**12)
    assert [e.id for e in box.scheduled(host=h)] == [scheduled.id]
    with pytest.raises(ValidationError, match="give ids, or a host, subscription or service"):
        box.deliver_now()
    with pytest.raises(ValidationError, match="not both"):
        box.cancel_scheduled(scheduled.id, host=h)


def test_idle_host_instances_claim_scheduled_entries_within_poll_min_of_their_time(
    box: MessageBox, instances: list[HostInstance]
):
    # Given a host instance that backs off to 5 s between claims while idle, and
    # entries due from 0.6 to 1.8 s after their publish
    h = _host(box)
    seen: dict[int, float] = {}
    lock = threading.Lock()

    def handle(d: Delivery) -> None:
        with lock:
            seen[int(d.properties["t.N"])] = time.time()  # type: ignore[arg-type]

    settings = {**FAST_HOST, "poll_min_seconds": 0.05, "poll_max_seconds": 5.0}
    inst = HostInstance(box, h, {h: handle}, settings=settings).start()
    instances.append(inst)
    time.sleep(0.5)  # idle: its waits grow
    now = box.now()
    due = {n: now + timedelta(seconds=0.6 + 0.3 * n) for n in range(5)}
    box.publish([_msg(h, n, deliver_at=at) for n, at in due.items()])
    # When they fall due, then each is handled within poll_min (0.05 s) of its time,
    # give or take the machine's load: not up to poll_max (5 s) late
    wait_for(lambda: len(seen) == 5, "the scheduled entries handled", timeout=15)
    late = {n: seen[n] - due[n].timestamp() for n in due}
    assert min(late.values()) >= -0.01, late  # never early (same clock: this machine's)
    assert max(late.values()) < 1.0, late
    print(
        f"lateness of scheduled claims ({box.backend}):", {n: round(s, 3) for n, s in late.items()}
    )


def test_a_message_published_on_completion_keeps_its_times(
    box: MessageBox, instances: list[HostInstance]
):
    # Given a service that publishes, with its completion, a message due in an hour
    h = _host(box)
    later = box.now() + HOUR

    def relay(d: Delivery) -> None:
        d.publish_on_completion(Message(b"r", promoted={"t.Out": h}, deliver_at=later, ttl=7200))

    box.subscribe("sink", host=h, filter=P("t.Out") == h, name=f"{h}-sink")
    inst = HostInstance(box, h, {h: relay, "sink": lambda d: None}, settings=FAST_HOST).start()
    instances.append(inst)
    box.publish([_msg(h, 0)])
    # Then the message it published is scheduled, with its expiry
    wait_for(lambda: box.scheduled(host=h), "the published message scheduled")
    [e] = box.scheduled(host=h)
    assert abs(e.due_at - later) < timedelta(milliseconds=1)
    assert e.expires_at is not None
    assert e.expires_at > e.due_at


def _claim_run(box: MessageBox, host: str) -> list[Claim]:
    with box.store.transaction(serial=True) as conn:
        return list(
            leases.claim(
                conn,
                box.store.dialect,
                host=host,
                owner="t",
                n=10,
                lease_seconds=30,
                ordered=True,
            )
        )


def _n(box: MessageBox, claimed: Claim) -> int:
    return int(box.read_message(claimed.msg).promoted["t.N"])  # type: ignore[arg-type]


def test_plain_publishes_write_no_expiry_and_are_due_as_queued(box: MessageBox):
    # the common path writes as before: due when queued, no expiry
    h = _host(box)
    box.publish([_msg(h, i) for i in range(30)])
    q = mb_schema.queue
    with box.store.transaction() as conn:
        rows = conn.execute(
            sa.select(q.c.available_at, q.c.enqueued_at, q.c.expires_at).where(q.c.host == h)
        ).all()
    assert len(rows) == 30
    assert all(r.available_at == r.enqueued_at and r.expires_at is None for r in rows)


class _Nothing(BaseModel):
    pass


class _Reminder(Orchestration[_Nothing]):
    """Publishes a reminder due in an hour, expiring in two, and completes."""

    correlation = ("t.Id",)

    @activate(P("t.Kind") == "order")
    def order(self, d: Delivery) -> None:
        later = datetime.now(UTC) + HOUR
        self.publish(Message(b"remind", promoted={"t.Kind": "remind"}, deliver_at=later, ttl=7200))
        self.complete()


def test_an_orchestration_step_publishes_a_scheduled_message(
    box: MessageBox, instances: list[HostInstance]
):
    h = f"h{next(_hosts)}"
    app = HostApp(h)
    app.orchestration(_Reminder)
    app.subscribe("reminders", filter=P("t.Kind") == "remind", name=f"{h}-reminders")
    app.add_service("reminders", lambda d: None)
    app.setup(box)
    inst = HostInstance(box, h, app.services, settings=FAST_HOST).start()
    instances.append(inst)
    box.publish([Message(b"o", promoted={"t.Kind": "order", "t.Id": "a"})])
    wait_for(lambda: box.scheduled(host=h), "the reminder scheduled")
    [e] = box.scheduled(host=h)
    assert e.name == f"{h}-reminders"
    assert timedelta(minutes=59) < e.due_at - box.now() <= HOUR
    assert e.expires_at is not None
    assert e.expires_at - e.due_at < HOUR + timedelta(seconds=5)
    assert box.read_message(e.message_id).promoted["t.Id"] == "a"  # its correlation


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offsets=st.lists(st.one_of(st.none(), st.integers(60, 3600)), min_size=1, max_size=9),
    forced=st.sets(st.integers(0, 8), max_size=3),
    chunk=st.sampled_from([2, 3, 20_000]),
)
def test_each_entry_is_due_at_its_own_messages_time_on_every_publish_path(
    box: MessageBox, offsets: list[int | None], forced: set[int], chunk: int
):
    # Given messages, some scheduled, routed to two subscriptions each, some stored
    # suspended as well (a receive pipeline's refusal, routed: the message-by-message
    # path), published in chunks of ``chunk`` (one transaction)
    from messagebox.models import Suspension
    from messagebox.routing import router as mb_router

    h = _host(box)
    box.subscribe(f"{h}-2", host=h, filter=P("t.K") == h, name=f"{h}-2")
    now = box.now()
    messages = [
        _msg(h, i, deliver_at=None if o is None else now + timedelta(seconds=o))
        for i, o in enumerate(offsets)
    ]
    suspend = {i: Suspension("bad", "refused", route=True) for i in forced if i < len(offsets)}
    previous = mb_router.PUBLISH_CHUNK
    mb_router.PUBLISH_CHUNK = chunk
    try:
        routed = box.publish(messages, suspend=suspend)
    finally:
        mb_router.PUBLISH_CHUNK = previous
    # Then every entry of a message is due at the message's time (now when it has none)
    q = mb_schema.queue
    with box.store.transaction() as conn:
        rows = conn.execute(
            sa.select(q.c.msg, q.c.available_at, q.c.enqueued_at).where(q.c.host == h)
        ).all()
    due = {r.message_id: o for r, o in zip(routed, offsets, strict=True)}
    assert len(rows) == 2 * len(offsets)
    for msg, available, enqueued in rows:
        o = due[msg]
        if o is None:
            assert available == enqueued
        else:
            assert abs(available - (now + timedelta(seconds=o))) < timedelta(milliseconds=1)


def test_a_publish_in_the_callers_transaction_takes_a_delay(box: MessageBox):
    h = _host(box)
    with box.transaction() as conn:
        box.publish([_msg(h, 0), _msg(h, 1, ttl=7200)], connection=conn, delay=3600)
        assert box.scheduled(host=h) == []  # not committed yet
    found = box.scheduled(host=h)
    assert len(found) == 2
    assert [e.expires_at is None for e in found] == [True, False]
