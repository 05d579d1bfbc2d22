"""Subscription changes against publishes in flight (issue 55, item 7), on both
backends: a publish that routed under the subscriptions before a change commits before
the change does its work, or waits and routes under the new ones. After an apply, an
unsubscribe or an unenlist, no queue entry sits on a subscription that no longer exists
(or is ready on one that is stopped), whatever publishes were running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.models import SUBSCRIPTION_REMOVED
from messagebox.predicates import P
from messagebox.routing import router as mb_router
from messagebox.storage import schema as mb_schema
from tests.conftest import wait_for

OLD = (
    '[hosts.h]\n[[subscriptions]]\nname = "a"\nservice = "a"\nhost = "h"\nfilter = "t.x == 1"\n'
    '[[subscriptions]]\nname = "b"\nservice = "b"\nhost = "h"\nfilter = "t.x == 1"\n'
)
NEW = (
    '[hosts.h]\n[[subscriptions]]\nname = "a"\nservice = "a"\nhost = "h"\nfilter = "t.x == 1"\n'
    '[[subscriptions]]\nname = "c"\nservice = "c"\nhost = "h"\nfilter = "t.x == 1"\n'
)


def orphans(box: MessageBox) -> int:
    """Queue entries whose subscription does not exist."""
    q, s = mb_schema.queue, mb_schema.subscription
    with box.store.transaction() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(q)
                .where(~sa.exists().where(s.c.id == q.c.sub))
            ).scalar_one()
        )


class Publishers:
    """Threads publishing batches of ``t.x == 1`` messages until stopped; each
    publish is slowed between routing and commit, where the race is."""

    def __init__(self, box: MessageBox, n: int = 3) -> None:
        self.box = box
        self.count = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.box.publish([Message(b"m", promoted={"t.x": 1}) for _ in range(5)])
                with self.lock:
                    self.count += 5
        except BaseException as exc:
            self.errors.append(exc)

    def at_least(self, n: int) -> None:
        wait_for(lambda: self.count >= n or bool(self.errors), what=f"{n} published", timeout=60)
        assert not self.errors, self.errors

    def __enter__(self) -> Publishers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


@pytest.fixture
def slow_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each publish waits 20 ms after it routes, before it writes and commits."""
    real: Callable[..., Any] = mb_router.route_matches

    def slow(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        time.sleep(0.02)
        return found

    monkeypatch.setattr(mb_router, "route_matches", slow)


@pytest.mark.usefixtures("slow_routing")
def test_after_an_apply_no_entry_sits_on_a_removed_subscription(box: MessageBox) -> None:
    box.apply(OLD)
    with Publishers(box) as pubs:
        for text in (NEW, OLD, NEW, OLD):
            pubs.at_least(pubs.count + 20)
            box.apply(text)
            left = orphans(box)  # publishers still running: checked at once
            assert left == 0, f"{left} entries on a removed subscription after an apply"
        pubs.at_least(pubs.count + 20)
    assert not pubs.errors
    assert orphans(box) == 0
    removed = [e for e in box.suspended() if e.reason == SUBSCRIPTION_REMOVED]
    assert removed  # the waiting entries of each removed subscription were suspended


@pytest.mark.usefixtures("slow_routing")
def test_after_an_unsubscribe_no_entry_sits_on_the_removed_subscription(box: MessageBox) -> None:
    box.create_host("h")
    box.subscribe("a", host="h", filter=P("t.x") == 1, name="a")
    with Publishers(box) as pubs:
        for n in range(4):
            box.subscribe("b", host="h", filter=P("t.x") == 1, name=f"b{n}")
            pubs.at_least(pubs.count + 20)
            box.unsubscribe(f"b{n}")
            assert orphans(box) == 0
    assert orphans(box) == 0


@pytest.mark.usefixtures("slow_routing")
def test_after_a_stop_no_entry_of_the_service_is_ready(box: MessageBox) -> None:
    """Entries routed to a started service but committed after it was stopped would be
    ready (claimable) on a stopped service."""
    box.create_host("h")
    box.subscribe("a", host="h", filter=P("t.x") == 1, name="a")
    q = mb_schema.queue
    with Publishers(box) as pubs:
        for _ in range(3):
            box.set_service_state("a", "started")
            pubs.at_least(pubs.count + 20)
            box.set_service_state("a", "stopped")
            with box.store.transaction() as conn:
                ready = conn.execute(
                    sa.select(sa.func.count()).select_from(q).where(q.c.state == "ready")
                ).scalar_one()
            assert ready == 0, f"{ready} entries ready on a stopped service"
