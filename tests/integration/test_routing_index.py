"""The in-memory routing index follows the database: a change made through another
store (another process, on PostgreSQL) routes from the next publish, a version gap makes
it load everything again, and a publish never routes against a mix of versions
(both backends)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.errors import ValidationError
from messagebox.predicates import P
from messagebox.storage import subscriptions
from messagebox.storage.routing_index import RoutingIndex


def _index(box: MessageBox) -> RoutingIndex:
    index = box.store.routing
    assert index is not None
    return index


def _subs(box: MessageBox, props: dict[str, object]) -> tuple[int, ...]:
    [routed] = box.publish([Message(b"", promoted=props)], policy="drop")
    return routed.subscriptions


def test_changes_made_through_another_store_route_from_the_next_publish(backend_url: str):
    with MessageBox(backend_url) as admin, MessageBox(backend_url) as publisher:
        admin.create_host("h")
        assert _subs(publisher, {"a.X": 1}) == ()
        one = admin.subscribe("one", host="h", filter=P("a.X") == 1)
        assert _subs(publisher, {"a.X": 1}) == (one.id,)
        two = admin.subscribe("two", host="h", filter=P("a.X") >= 1)
        assert _subs(publisher, {"a.X": 1}) == (one.id, two.id)
        # a stopped service still routes (its entries wait, held); an unenlisted one not
        admin.set_service_state("one", "stopped")
        assert _subs(publisher, {"a.X": 1}) == (one.id, two.id)
        assert {d.state for d in publisher.queue_depth("h") if d.subscription == one.id} == {"held"}
        admin.set_service_state("one", "unenlisted")
        assert _subs(publisher, {"a.X": 1}) == (two.id,)
        admin.set_service_state("one", "started")
        assert _subs(publisher, {"a.X": 1}) == (one.id, two.id)
        admin.unsubscribe(two.id)
        assert _subs(publisher, {"a.X": 2}) == ()
        assert _subs(publisher, {"a.X": 1}) == (one.id,)
        # caught up change by change: the whole set was loaded once
        assert _index(publisher).loads == 1
        assert _index(publisher).version == 6  # two subscribes, three states, one removal


def test_a_gap_in_the_versions_loads_every_subscription_again(backend_url: str):
    with MessageBox(backend_url) as admin, MessageBox(backend_url) as publisher:
        admin.create_host("h")
        one = admin.subscribe("one", host="h", filter=P("a.X") == 1)
        assert _subs(publisher, {"a.X": 1}) == (one.id,)
        two = admin.subscribe("two", host="h", filter=P("a.X") == 1)
        three = admin.subscribe("three", host="h", filter=P("a.X") == 1)
        with admin.store.transaction() as conn:  # versions pruned under the publisher
            conn.execute(
                sa.text(
                    "DELETE FROM mb_routing_change "
                    "WHERE version < (SELECT max(version) FROM mb_routing_change)"
                )
            )
        assert _subs(publisher, {"a.X": 1}) == (one.id, two.id, three.id)
        assert _index(publisher).loads == 2


def test_a_publish_routes_against_one_version_while_subscriptions_change(backend_url: str):
    """Each change moves a whole group of three subscriptions from one value to another
    (remove three, add three, in one transaction): a publish racing the changes sees all
    three of one group or none, never a part of one."""
    with MessageBox(backend_url) as admin, MessageBox(backend_url) as publisher:
        admin.create_host("h")
        rounds = 15
        done = threading.Event()
        seen: list[int] = []
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                while not done.is_set():
                    seen.append(len(_subs(publisher, {"a.X": 1})))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        thread = threading.Thread(target=publish)
        thread.start()
        try:
            for r in range(rounds):
                made = admin.subscribe_many(
                    [
                        {"service": f"s{r}-{k}", "host": "h", "filter": P("a.X") == 1}
                        for k in range(3)
                    ]
                )
                if r % 2:  # let some publishes see the group before it goes
                    wait_until = len(seen) + 2
                    deadline = time.monotonic() + 30
                    while len(seen) < wait_until and time.monotonic() < deadline:
                        done.wait(0.001)
                admin.unsubscribe(*[s.id for s in made])
        finally:
            done.set()
            thread.join(30)
        assert not errors
        assert set(seen) == {0, 3}


def test_the_cleanup_job_trims_old_versions_and_a_lagging_index_reloads(backend_url: str):
    with MessageBox(backend_url) as admin, MessageBox(backend_url) as publisher:
        admin.create_host("h")
        first = [admin.subscribe(f"s{i}", host="h", filter=P("a.X") == i) for i in range(3)]
        assert _subs(publisher, {"a.X": 1}) == (first[1].id,)
        late = [admin.subscribe(f"t{i}", host="h", filter=P("a.X") == 1) for i in range(2)]
        # the job keeps the newest thousand versions: here, all of them
        assert admin.cleanup().routing_versions == 0
        with admin.store.transaction() as conn:
            assert subscriptions.prune_versions(conn, keep=1) == 4
        # the publisher, two versions behind the one kept, loads everything again
        assert _subs(publisher, {"a.X": 1}) == (first[1].id, *(s.id for s in late))
        assert _index(publisher).loads == 2
        assert _index(publisher).version == 5


def test_an_unknown_router_is_refused_by_name(duckdb_url: str):
    with pytest.raises(ValidationError, match="router 'fast' is not one of index, sql"):
        MessageBox(duckdb_url, router="fast")


def test_a_new_subscription_in_a_gone_ones_slot_routes_in_id_order(backend_url: str):
    """The index files a subscription under a slot and reuses a removed one's: a batch's
    matches still come in subscription-id order, with each one's queue columns."""
    with MessageBox(backend_url) as box:
        box.create_host("h")
        box.create_host("k")
        made = [
            box.subscribe(f"s{i}", host="hk"[i % 2], filter=P("a.X") >= i, priority=i)
            for i in range(4)
        ]
        assert _subs(box, {"a.X": 9}) == tuple(s.id for s in made)
        box.unsubscribe(made[0].id, made[2].id)
        assert _subs(box, {"a.X": 9}) == (made[1].id, made[3].id)  # their slots are free
        later = [box.subscribe(f"t{i}", host="k", filter=P("a.X") >= 0) for i in range(3)]
        index = _index(box)
        assert index.loads == 1  # followed change by change, so the freed slots were reused
        want = (made[1].id, made[3].id, *(s.id for s in later))
        routed = box.publish([Message(b"", promoted={"a.X": x}) for x in (9, 0, 2)], policy="drop")
        assert [r.subscriptions for r in routed] == [
            want,
            tuple(s.id for s in later),
            (made[1].id, *(s.id for s in later)),
        ]
        entries = {(d.subscription, d.host) for d in box.queue_depth("k")}
        assert {(s.id, "k") for s in later} <= entries
        assert (made[1].id, "k") in entries


def test_queue_columns_follow_every_subscription_s_own_values(backend_url: str):
    """While every subscription has the common priority, state, instance and order, a
    batch writes those columns as one repeated value; a subscription with its own
    values (added, or taking a removed one's slot) is queued with them, and so are the
    others with theirs, on both routes of the columns."""
    from messagebox.storage import schema

    def queued(box: MessageBox) -> set[tuple[object, ...]]:
        q = schema.queue
        with box.store.transaction() as conn:
            rows = conn.execute(
                sa.select(q.c.sub, q.c.priority, q.c.state, q.c.instance_id, q.c.ordered)
            )
            found = {tuple(r) for r in rows}
            conn.execute(q.delete())
        return found

    with MessageBox(backend_url) as box:
        box.create_host("h")
        plain = [box.subscribe(f"p{i}", host="h", filter=P("a.X") >= 0) for i in range(2)]
        box.publish([Message(b"", promoted={"a.X": 1})])
        assert queued(box) == {(s.id, 0, "ready", None, False) for s in plain}
        own = box.subscribe("own", host="h", filter=P("a.X") >= 0, priority=5, ordered=True)
        held = box.subscribe("held", host="h", filter=P("a.X") >= 0, state="stopped")
        box.publish([Message(b"", promoted={"a.X": 1})])
        assert queued(box) == {
            *((s.id, 0, "ready", None, False) for s in plain),
            (own.id, 5, "ready", None, True),
            (held.id, 0, "held", None, False),
        }
        box.unsubscribe(own.id, held.id)
        box.publish([Message(b"", promoted={"a.X": 1})])
        assert queued(box) == {(s.id, 0, "ready", None, False) for s in plain}
        later = box.subscribe("later", host="h", filter=P("a.X") >= 0)  # in a freed slot
        box.publish([Message(b"", promoted={"a.X": 1})])
        assert queued(box) == {(s.id, 0, "ready", None, False) for s in [*plain, later]}
        assert _index(box).loads == 1
