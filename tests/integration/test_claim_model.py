"""Claims against the promises of ordered and correlated subscriptions, under random
work (hypothesis), on both backends: a host with an ordered, correlated subscription,
a plain correlated one sharing its instances, another ordered one and a plain one;
messages published, claimed by two host instances (ordered runs, instance heads and
plain entries, as a host instance claims them), completed, failed for good (the rest of
a run given back, as a host instance does), failed to be retried at once, and resumed.

After every step:

- an ordered subscription is in one claimer's hands at a time, and nothing of it waits
  older than what is in hand, but for messages that a suspended one of their instance
  holds, or that were resumed (or released by a resumed one) after it was taken;
- a service instance is in one claimer's hands at a time, one message at a time
  (several only as consecutive entries of one ordered run), and never while an older
  message of it waits or a suspended one holds it;
- no entry is taken twice;

and at the end, once what is in hand is handled and claims go on, every message is
delivered but those that suspended ones hold.
"""

from __future__ import annotations

import itertools
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messagebox import Message, MessageBox
from messagebox.claims import Claim, Failure
from messagebox.delivery import leases
from messagebox.models import HostSettings
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.conftest import FAST_HOST

OWNERS = ("a", "b")
RETRY_AT_ONCE = HostSettings(retry_backoff_seconds=0.0, max_attempts=3)
_hosts = itertools.count()

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("publish"),
            st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2)), min_size=1, max_size=4),
        ),
        st.tuples(st.just("claim"), st.sampled_from(OWNERS), st.integers(1, 4)),
        st.tuples(st.just("complete"), st.integers(0, 50)),
        st.tuples(st.just("fail"), st.integers(0, 50)),
        st.tuples(st.just("retry"), st.integers(0, 50)),
        st.tuples(st.just("resume"), st.integers(0, 50)),
    ),
    min_size=4,
    max_size=25,
)


def _rows(box: MessageBox, host: str) -> list[Any]:
    q = mb_schema.queue
    with box.store.transaction() as conn:
        return list(
            conn.execute(
                sa.select(q.c.id, q.c.sub, q.c.instance_id, q.c.lease_owner, q.c.lease_expires)
                .where(q.c.host == host)
                .order_by(q.c.id)
            ).all()
        )


def _held(box: MessageBox) -> set[str]:
    s = mb_schema.suspended
    with box.store.transaction() as conn:
        return {
            r.instance_id
            for r in conn.execute(sa.select(s.c.instance_id).where(s.c.resumable)).all()
            if r.instance_id is not None
        }


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(work=steps)
def test_claims_keep_the_promises_of_ordered_and_correlated_subscriptions(
    backend_url: str, work: list[tuple[Any, ...]]
) -> None:
    with MessageBox(backend_url, publisher="tests") as box:
        _check(box, work)


def _check(box: MessageBox, work: list[tuple[Any, ...]]) -> None:
    n = next(_hosts)  # each example its own host and services (the store is reused)
    host, svc = f"h{n}", f"svc{n}"
    box.create_host(host, **FAST_HOST)
    kinds = {
        "a": box.subscribe(
            svc,
            host=host,
            filter=(P("t.Kind") == "a") & (P("t.H") == host),
            ordered=True,
            correlation=["t.K"],
        ),
        "b": box.subscribe(
            svc, host=host, filter=(P("t.Kind") == "b") & (P("t.H") == host), correlation=["t.K"]
        ),
        "c": box.subscribe(
            f"other{n}", host=host, filter=(P("t.Kind") == "c") & (P("t.H") == host), ordered=True
        ),
        "d": box.subscribe(
            f"plain{n}", host=host, filter=(P("t.Kind") == "d") & (P("t.H") == host)
        ),
    }
    ordered = {kinds["a"].id, kinds["c"].id}
    dialect = box.store.dialect
    hands: dict[str, dict[int, Claim]] = {o: {} for o in OWNERS}
    resumed_after: dict[int, set[int]] = {}  # entry resumed -> entries in hand then
    taken: set[int] = set()
    for step in work:
        if step[0] == "publish":
            box.publish(
                [
                    Message(b"x", promoted={"t.Kind": k, "t.K": key, "t.H": host})
                    for k, key in step[1]
                ]
            )
        elif step[0] == "claim":
            owner, n = step[1], step[2]
            with box.store.transaction(serial=True) as conn:
                got = leases.claim(
                    conn,
                    dialect,
                    host=host,
                    owner=owner,
                    n=n,
                    lease_seconds=300.0,
                    ordered=True,
                    instances=True,
                )
            for c in got:
                assert c.id not in taken, f"entry {c.id} taken twice"
                taken.add(c.id)
                hands[owner][c.id] = c
        elif step[0] in ("complete", "fail", "retry"):
            held = [(o, c) for o in OWNERS for c in hands[o].values()]
            if not held:
                continue
            owner, c = held[step[1] % len(held)]
            with box.store.transaction(serial=True) as conn:
                if step[0] == "complete":
                    leases.finish(conn, dialect, owner, [c], [], HostSettings(), set())
                else:
                    failure = Failure(c, "refused", permanent=step[0] == "fail")
                    leases.finish(conn, dialect, owner, [], [failure], RETRY_AT_ONCE, set())
                    # a host instance gives back the rest of a failed run
                    rest = [
                        r for r in hands[owner].values() if r.run and r.sub == c.sub and r.id > c.id
                    ]
                    leases.give_back(conn, owner, rest)
                    for r in rest:
                        del hands[owner][r.id]
                        taken.discard(r.id)
            del hands[owner][c.id]
            if step[0] == "retry":
                taken.discard(c.id)  # delivered again
        else:
            suspended = box.suspended(host=host)
            if not suspended:
                continue
            entry = suspended[step[1] % len(suspended)]
            box.resume(entry.id)
            in_hand = {i for o in OWNERS for i in hands[o]}
            rows = _rows(box, host)
            [instance] = [r.instance_id for r in rows if r.id == entry.id]
            for r in rows:  # it and what it held now wait behind what is in hand
                if r.id == entry.id or (instance is not None and r.instance_id == instance):
                    resumed_after.setdefault(r.id, set()).update(in_hand)
            taken.discard(entry.id)
        _invariants(box, host, ordered, resumed_after)
    # then, handling whatever is in hand and claiming again, everything is delivered but
    # what suspended messages hold: no subscription waits on another
    while True:
        with box.store.transaction(serial=True) as conn:
            for owner in OWNERS:
                done = list(hands[owner].values())
                leases.finish(conn, dialect, owner, done, [], HostSettings(), set())
                hands[owner] = {}
            got = leases.claim(
                conn,
                dialect,
                host=host,
                owner="a",
                n=4,
                lease_seconds=300.0,
                ordered=True,
                instances=True,
            )
        if not got:
            break
        hands["a"] = {c.id: c for c in got}
    holding = _held(box)
    left = [r.id for r in _rows(box, host) if r.instance_id not in holding]
    assert not left, f"entries {left} never delivered"


def _invariants(
    box: MessageBox, host: str, ordered: set[int], resumed_after: dict[int, set[int]]
) -> None:
    rows = _rows(box, host)
    held = _held(box)
    leased = [r for r in rows if r.lease_expires is not None]  # none lapses here
    waiting = [r for r in rows if r.lease_expires is None]
    for sub in ordered:
        mine = [r for r in leased if r.sub == sub]
        assert len({r.lease_owner for r in mine}) <= 1, f"ordered subscription {sub} in two hands"
        for r in mine:
            older = [
                w
                for w in waiting
                if w.sub == sub
                and w.id < r.id
                and w.instance_id not in held
                and r.id not in resumed_after.get(w.id, set())
            ]
            assert not older, f"entry {r.id} of {sub} in hand while older {older[0].id} waits"
    instances = {r.instance_id for r in leased if r.instance_id is not None}
    for instance in instances:
        mine = [r for r in leased if r.instance_id == instance]
        assert len({r.lease_owner for r in mine}) == 1, f"instance {instance} in two hands"
        if len(mine) > 1:
            several = f"instance {instance}: several in hand, not of one ordered run"
            assert len({r.sub for r in mine}) == 1, several
            assert mine[0].sub in ordered, several
        first = min(r.id for r in mine)
        older = [
            w
            for w in waiting
            if w.instance_id == instance
            and w.id < first
            and first not in resumed_after.get(w.id, set())
        ]
        assert not older, f"instance {instance}: {first} in hand while older {older[0].id} waits"
