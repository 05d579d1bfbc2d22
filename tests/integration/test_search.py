"""Search (issue 58, item 4), on both backends: several conditions in the filter language,
ranges included; each message's state (queued, in hand, suspended, done, deleted, the
last kept by tracking after cleanup); a window of publish times, a limit and a scan cap
with a cursor to go on; and a property test: every search, followed page by page, finds
exactly what the reference evaluator finds in the window, newest first."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox, clock
from messagebox.errors import ValidationError
from messagebox.ops import search_walk
from messagebox.ops.search import SearchResult
from messagebox.predicates import Filter, P, filter_matches
from messagebox.properties import decode_context
from messagebox.storage import schema, store_clock
from tests.conftest import claim, complete, scratch_url
from tests.strategies import filters, messages


def orders(box: MessageBox, rows: list[tuple[str, float, str]]) -> dict[str, uuid.UUID]:
    """Publish an order a row (id, total, region); their message ids by order id."""
    routed = box.publish(
        [
            Message(b"<o/>", promoted={"orders.Id": i, "orders.Total": t, "orders.Region": r})
            for i, t, r in rows
        ]
    )
    return {row[0]: r.message_id for row, r in zip(rows, routed, strict=True)}


def release(box: MessageBox, entry_id: int) -> None:
    """Put a claimed entry back on its queue, unleased."""
    q = schema.queue
    with box.store.transaction() as conn:
        conn.execute(
            q.update().where(q.c.id == entry_id).values(lease_owner=None, lease_expires=None)
        )


def test_several_conditions_find_messages_newest_first_with_their_state(
    box: MessageBox,
) -> None:
    box.configure_tracking(True)
    box.create_host("h")
    box.subscribe("bill", host="h", filter=P("orders.Total") >= 0, name="bill")
    box.subscribe("audit", host="h", filter=P("orders.Region") == "EU", name="audit")
    # Given orders published one after another
    ids: dict[str, uuid.UUID] = {}
    for row in [
        ("A1", 6000.0, "EU"),
        ("A2", 7000, "EU"),
        ("A3", 9000, "US"),
        ("A4", 5000, "EU"),
        ("A5", 8000.5, "EU"),
        ("A6", 100, "EU"),
    ]:
        ids |= orders(box, [row])
    # and their bills suspended: A1's resumed, A3's left suspended, the others terminated
    box.set_service_state("bill", "unenlisted")
    box.set_service_state("bill", "started")
    for entry in box.suspended():
        if entry.message_id == ids["A1"]:
            box.resume(entry.id)
        elif entry.message_id != ids["A3"]:
            box.terminate(entry.id)
    # and A5's and A6's audits done, A2's in hand, the others back on the queue
    for c in claim(box, "h", n=10):
        if c.msg in (ids["A5"], ids["A6"]):
            complete(box, c)
        elif c.msg != ids["A2"]:
            release(box, c.id)
    box.publish([Message(b"x", promoted={"orders.Id": "B1"}, written={"orders.Total": 9e9})])
    # and cleanup, with tracking on, deletes A5 and A6 (nothing refers to them)
    assert box.cleanup().tracked_messages == 2
    # and then A4's audit is done too
    for c in claim(box, "h", n=10):
        if c.msg == ids["A4"]:
            complete(box, c)
        else:
            release(box, c.id)

    # When the operator searches with a range and an equality
    found = box.search('orders.Total > 5000 and orders.Region == "EU"')
    # Then the EU orders above 5000 come, newest first, each with its state
    assert [(m.promoted["orders.Id"], m.state) for m in found.found] == [
        ("A5", "deleted"),
        ("A2", "in hand"),
        ("A1", "queued"),
    ]
    assert found.found[0].deleted_at is not None
    assert found.found[1].deleted_at is None
    assert [m.entries for m in found.found] == [{}, {"in hand": 1}, {"queued": 2}]
    assert (found.capped, found.next, found.pushed_down, found.scanned) == (False, None, True, 7)
    # and a range alone; a written property of that name never matches
    assert [m.promoted["orders.Id"] for m in box.search("orders.Total >= 9000").found] == ["A3"]
    states = {m.promoted["orders.Id"]: m.state for m in box.search("orders.Id exists").found}
    assert states == {
        "B1": "suspended",  # a routing failure
        "A6": "deleted",
        "A5": "deleted",
        "A4": "done",
        "A3": "suspended",
        "A2": "in hand",
        "A1": "queued",
    }
    # and an int finds a float of that value, and a float an int
    assert [m.id for m in box.search("orders.Total == 6000").found] == [ids["A1"]]
    assert [m.id for m in box.search("orders.Total in [7000.0, 1]").found] == [ids["A2"]]
    # With tracking off, what cleanup deletes is not kept
    box.configure_tracking(False)
    report = box.cleanup()
    assert (report.messages, report.tracked_messages) == (1, 0)  # A4
    assert [m.state for m in box.search('orders.Id == "A4"').found] == []


def test_a_window_a_limit_and_a_scan_cap_page_through_with_a_cursor(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0)
    # Given 25 messages, published in 5 batches (a batch shares its publish time)
    routed = [
        r
        for b in range(5)
        for r in box.publish([Message(b"x", promoted={"t.N": b * 5 + k}) for k in range(5)])
    ]
    newest_first = [r.message_id for r in routed][::-1]
    every = box.search("t.N >= 0", limit=1000)
    assert {m.id for m in every.found} == set(newest_first)
    assert [m.published_at for m in every.found] == sorted(
        (m.published_at for m in every.found), reverse=True
    )
    order = [m.id for m in every.found]
    # When the operator pages through 7 at a time
    pages: list[SearchResult] = [box.search("t.N >= 0", limit=7)]
    while pages[-1].next is not None:
        pages.append(box.search("t.N >= 0", limit=7, after=pages[-1].next))
    # Then the pages, joined, are the whole answer in order, each at most 7
    assert [m.id for p in pages for m in p.found] == order
    assert [len(p.found) for p in pages] == [7, 7, 7, 4]
    assert not any(p.capped for p in pages)
    # When the scan cap is 4: each call goes through 4 messages at most, and says so
    capped: list[SearchResult] = [box.search("t.N >= 20", scan=4)]
    while capped[-1].next is not None:
        capped.append(box.search("t.N >= 20", scan=4, after=capped[-1].next))
    assert [m.id for p in capped for m in p.found] == order[:5]
    assert all(p.scanned <= 4 for p in capped)
    assert capped[0].capped
    assert capped[0].scanned == 4
    assert not capped[-1].capped
    assert capped[-1].next is None
    # and a window: none before, none after
    now = datetime.now(UTC) + timedelta(hours=1)
    assert box.search("t.N >= 0", until=now - timedelta(days=1)).found == []
    assert box.search("t.N >= 0", since=now).found == []
    assert len(box.search("t.N >= 0", since=timedelta(hours=1), limit=100).found) == 25
    with pytest.raises(ValidationError, match="the window is empty"):
        box.search("t.N >= 0", since=timedelta(hours=1), until=timedelta(hours=2))


def test_a_scan_reads_pages_of_growing_size_up_to_its_cap(box: MessageBox) -> None:
    # Given 3,501 messages: the oldest an order of its own, then 7 batches of 500
    box.publish([Message(b"", promoted={"o.N": 0, "o.Id": "first"})], policy="suspend")
    for start in range(1, 3500, 500):
        box.publish(
            [Message(b"", promoted={"o.N": n}) for n in range(start, start + 500)],
            policy="suspend",
        )
    # When a search for it goes through 2,500 a call (pages of 1,000, then 1,500)
    first = box.search('o.Id == "first"', scan=2_500)
    # Then the cap stops the first call, and the next goes on to it
    assert (first.found, first.capped, first.scanned) == ([], True, 2_500)
    second = box.search('o.Id == "first"', scan=2_500, after=first.next)
    assert [m.promoted["o.Id"] for m in second.found] == ["first"]
    assert (second.capped, second.scanned, second.next) == (False, 1_001, None)
    # and a range (nothing pushed down) finds the newest 50 first
    ranged = box.search("o.N >= 3000")
    assert {m.promoted["o.N"] for m in ranged.found} <= set(range(3001, 3501))  # the last batch
    assert (len(ranged.found), ranged.capped, ranged.scanned) == (50, False, 50)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"filter": "orders.Total>>5000"}, "column"),
        ({"filter": "orders.Total > 1e999"}, "not finite"),
        ({"filter": "(" * 200 + "a.B == 1" + ")" * 200}, "nest"),
        ({"filter": "a.B == 1 or " * 5000 + "a.B == 2"}, "at most 20,000"),
        ({"filter": "a.B == 1", "limit": 0}, "limit must be an int from 1 to 1,000"),
        ({"filter": "a.B == 1", "limit": True}, "limit must be an int"),
        ({"filter": "a.B == 1", "scan": 10**9}, "scan must be an int from 1 to 1,000,000"),
        ({"filter": "a.B == 1", "since": datetime(2024, 1, 1)}, "with a time zone"),
        ({"filter": "a.B == 1", "since": timedelta(days=-1)}, "from zero to"),
        ({"filter": "a.B == 1", "since": timedelta(days=10**6)}, "from zero to"),
        ({"filter": "a.B == 1", "after": "tomorrow"}, "is not one a search gave"),
        ({"filter": "a.B == 1", "after": f"-99999999999999999.{'0' * 32}"}, "out of range"),
        ({"filter": 42}, "cannot combine 42 into a filter"),
    ],
)
def test_bad_searches_are_refused_naming_the_problem(
    box: MessageBox, kwargs: dict[str, object], says: str
) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by both backends' runs
    filt = kwargs.pop("filter")
    with pytest.raises(ValidationError) as refused:
        box.search(filt, **kwargs)  # type: ignore[arg-type]
    assert says in str(refused.value)


def test_tracking_keeps_a_deleted_message_until_its_retention(box: MessageBox) -> None:
    box.configure_tracking(True, retention=timedelta(hours=1))
    box.publish([Message(b"x", promoted={"t.N": 1})], policy="suspend")  # no subscription
    [entry] = box.suspended()
    box.terminate(entry.id)
    assert box.cleanup().tracked_messages == 1
    [gone] = box.search("t.N == 1").found
    assert (gone.state, gone.publisher, gone.promoted) == ("deleted", "tests", {"t.N": 1})
    with box.store.transaction() as conn:  # published two hours ago, as far as tracking knows
        conn.execute(
            schema.tracked_message.update().values(
                published_at=store_clock.now(conn) - timedelta(hours=2)
            )
        )
    assert box.search("t.N == 1", since=timedelta(hours=3)).found != []
    assert box.cleanup().tracked_trimmed == 1
    assert box.search("t.N == 1", since=timedelta(hours=3)).found == []


def test_a_message_id_published_again_after_cleanup_is_kept_once(box: MessageBox) -> None:
    box.configure_tracking(True)
    again = uuid.uuid4()
    for n in (1, 2):  # the publisher names the message; the second comes after cleanup
        box.publish([Message(b"x", id=again, promoted={"t.N": n})], policy="suspend")
        [entry] = box.suspended()
        box.terminate(entry.id)
        assert box.cleanup().messages == 1
    [kept] = box.search("t.N exists").found
    assert (kept.id, kept.state, kept.promoted) == (again, "deleted", {"t.N": 1})


# --- the property: what a search finds is what the reference evaluator finds ---


@pytest.fixture(scope="module", params=["duckdb", "postgresql"])
def searched_box(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MessageBox]:
    with scratch_url(request.param, tmp_path_factory.mktemp("search")) as url:
        box = MessageBox(url, publisher="tests")
        box.configure_tracking(True)
        try:
            yield box
        finally:
            box.close()


def naive(box: MessageBox, filt: Filter, since: datetime) -> list[uuid.UUID]:
    """Every message stored or kept by tracking, published since ``since``, that the
    reference evaluator matches; newest first."""
    found = []
    with box.store.transaction() as conn:
        for t in (schema.spool, schema.tracked_message):
            for r in conn.execute(sa.select(t.c.id, t.c.published_at, t.c.context)):
                at = clock.utc(r.published_at)
                if at >= since and filter_matches(filt, decode_context(r.context)[0]):
                    found.append((at, uuid.UUID(str(r.id))))
    return [msg for _, msg in sorted(found, reverse=True)]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(st.lists(messages, min_size=1, max_size=6), min_size=1, max_size=3),
    filt=filters,
    limit=st.integers(1, 5),
    scan=st.integers(1, 12),
    gone=st.integers(0, 3),
)
def test_a_search_followed_page_by_page_finds_what_the_evaluator_finds(
    searched_box: MessageBox,
    batches: list[list[dict[str, object]]],
    filt: Filter,
    limit: int,
    scan: int,
    gone: int,
) -> None:
    box = searched_box
    with box.store.transaction() as conn:
        since = store_clock.now(conn)
    # Given messages published in batches (routing failures: stored, suspended), some of
    # them then terminated and deleted by cleanup (kept by tracking)
    for batch in batches:
        box.publish([Message(b"", promoted=p) for p in batch], policy="suspend", trusted=True)
    entries = [e for e in box.suspended() if e.suspended_at >= since]
    if gone and entries:
        box.terminate(*[e.id for e in entries[:gone]])
        box.cleanup()
    expected = naive(box, filt, since)
    # When the search is followed from call to call, each reading pages of 1 to 4
    # messages, the ends of 2 pages a statement
    with pytest.MonkeyPatch.context() as small:
        small.setattr(search_walk, "PAGE", 1)
        small.setattr(search_walk, "MAX_PAGE", 4)
        small.setattr(search_walk, "ENDS_AT_ONCE", 2)
        pages = [box.search(filt, since=since, limit=limit, scan=scan)]
        while pages[-1].next is not None and len(pages) < 200:
            pages.append(
                box.search(filt, since=since, limit=limit, scan=scan, after=pages[-1].next)
            )
    # Then together they find exactly those, newest first, each page within its bounds
    assert [m.id for p in pages for m in p.found] == expected
    assert all(len(p.found) <= limit and p.scanned <= scan for p in pages)
    deleted = {m.id for p in pages for m in p.found if m.state == "deleted"}
    with box.store.transaction() as conn:
        kept = set(conn.execute(sa.select(schema.tracked_message.c.id)).scalars().all())
    assert deleted == {uuid.UUID(str(k)) for k in kept} & set(expected)
