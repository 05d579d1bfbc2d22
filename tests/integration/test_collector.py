"""The garbage collector while host instances run (hosts/collector.py): the first to
start freezes what the process holds, the last to stop gives it back; it stays out of
the way when told to, when the collector is off, and of a freeze made by someone else.
Not a storage matter: DuckDB only."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery, HostInstance, collector
from messagebox.predicates import P
from tests.conftest import FAST_HOST, wait_for

pytestmark = pytest.mark.parametrize("backend_url", ["duckdb"], indirect=True)


@pytest.fixture(autouse=True)
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with nothing frozen and the collector on, and counts
    the host instances it starts from none (whatever an earlier test left running)."""
    monkeypatch.setattr(collector, "_running", 0)
    monkeypatch.setattr(collector, "_froze", False)
    gc.unfreeze()
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def _instance(box: MessageBox, host: str, seen: list[bytes]) -> HostInstance:
    box.create_host(host)
    box.subscribe(host, host=host, filter=P("t.Host") == host, name=host)

    def handle(d: Delivery) -> None:
        seen.append(d.body)

    return HostInstance(box, host, {host: handle}, settings=FAST_HOST)


def test_frozen_while_instances_run_and_given_back_by_the_last(
    box: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    freezes: list[int] = []
    freeze = gc.freeze

    def counted() -> None:
        freezes.append(1)
        freeze()

    monkeypatch.setattr(gc, "freeze", counted)
    seen: list[bytes] = []
    first, second = _instance(box, "a", seen), _instance(box, "b", seen)
    try:
        first.start()
        assert gc.get_freeze_count() > 1000  # the modules, classes and functions held
        second.start()
        assert len(freezes) == 1  # only the first start freezes
        box.publish(
            [Message(b"x", promoted={"t.Host": "a"}), Message(b"y", promoted={"t.Host": "b"})]
        )
        wait_for(lambda: sorted(seen) == [b"x", b"y"], "both delivered")
        first.stop(5)
        assert gc.get_freeze_count() > 1000  # one still runs
    finally:
        first.stop(5)
        second.stop(5)
    assert gc.get_freeze_count() == 0


def test_left_alone_when_told_or_when_off(box: MessageBox, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    monkeypatch.setenv("MESSAGEBOX_GC_FREEZE", "0")
    for host in ("a", "b"):
        inst = _instance(box, host, seen).start()
        try:
            assert gc.get_freeze_count() == 0
        finally:
            inst.stop(5)
        monkeypatch.delenv("MESSAGEBOX_GC_FREEZE", raising=False)
        gc.disable()


def test_a_freeze_made_before_is_kept(box: MessageBox) -> None:
    gc.freeze()  # as a server that freezes before it forks
    frozen = gc.get_freeze_count()
    _instance(box, "a", []).start().stop(5)
    assert gc.get_freeze_count() > frozen // 2  # not given back by the host instance
