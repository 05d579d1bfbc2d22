"""Work that threads leave while a transaction runs, done together in the next one
(``messagebox.storage.sharing.Group``): the work left while a leader runs goes in one next
call, each thread gets its own result, a thread whose work was done returns without
taking the turn, a failed shared attempt leaves each thread its own work and error, and
a thread that holds the turn already is not made to wait for itself."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from messagebox.storage import sharing
from messagebox.storage.sharing import Group
from tests.conftest import wait_for


def _start(target: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def _leader_then_three(
    group: Group[int, int],
    run: Callable[[int], None],
    first_in: threading.Event,
    release: threading.Event,
) -> None:
    """``run(0)`` leads and holds its transaction (``together`` sets ``first_in`` and
    waits for ``release``) while ``run`` of 1, 2 and 3 leave their work; then all end."""
    threads = [_start(lambda: run(0))]
    first_in.wait(10)
    threads += [_start(lambda n=n: run(n)) for n in (1, 2, 3)]  # type: ignore[misc]
    wait_for(lambda: len(group.pending) == 3, what="three threads waiting")
    release.set()
    for t in threads:
        t.join(10)


def test_work_left_during_a_transaction_goes_in_the_next_one_each_gets_its_own() -> None:
    group: Group[int, int] = Group(threading.Lock())
    calls: list[list[int]] = []
    first_in, release = threading.Event(), threading.Event()

    def together(works: list[int]) -> list[int]:
        calls.append(list(works))
        if works == [0]:
            first_in.set()
            release.wait(10)
        return [w * 10 for w in works]

    results: dict[int, int] = {}

    def run(n: int) -> None:
        results[n] = group.run(n, together, lambda w: -1)

    _leader_then_three(group, run, first_in, release)
    assert results == {0: 0, 1: 10, 2: 20, 3: 30}
    assert calls[0] == [0]
    assert sorted(calls[1]) == [1, 2, 3]  # all three in the next transaction
    assert len(calls) == 2


class _Gate:
    """A lock that can also be closed: no one takes it until it opens again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = threading.Event()
        self.open.set()

    def __enter__(self) -> None:
        self.open.wait(10)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_thread_whose_work_was_done_returns_without_taking_the_turn() -> None:
    gate = _Gate()
    group: Group[int, int] = Group(gate)
    results: dict[int, int] = {}
    gate.open.clear()  # the leader waits for its turn while the other thread arrives

    def together(works: list[int]) -> list[int]:
        gate.open.clear()  # nobody takes the turn after this transaction
        return [w + 1 for w in works]

    def run(n: int) -> None:
        results[n] = group.run(n, together, lambda w: -1)

    leader = _start(lambda: run(0))
    wait_for(lambda: group.leading, what="a leader")
    follower = _start(lambda: run(1))
    wait_for(lambda: len(group.pending) == 2, what="both threads' work waiting")
    gate.open.set()
    leader.join(10)
    follower.join(10)  # done by the leader: it returns though the turn stays closed
    assert not follower.is_alive()
    assert results == {0: 1, 1: 2}
    gate.open.set()


def test_a_failed_shared_attempt_leaves_each_thread_its_own_work_and_error() -> None:
    group: Group[int, int] = Group(threading.Lock())
    first_in, release = threading.Event(), threading.Event()
    shared_calls: list[list[int]] = []

    def together(works: list[int]) -> list[int]:
        shared_calls.append(list(works))
        if works == [0]:
            first_in.set()
            release.wait(10)
            return [0]
        raise ValueError("one of them is bad")

    def alone(work: int) -> int:
        if work == 2:
            raise KeyError(work)
        return work * 100

    results: dict[int, object] = {}

    def run(n: int) -> None:
        try:
            results[n] = group.run(n, together, alone)
        except Exception as exc:
            results[n] = type(exc).__name__

    _leader_then_three(group, run, first_in, release)
    assert results == {0: 0, 1: 100, 2: "KeyError", 3: 300}
    assert len(shared_calls) == 2


def test_one_thread_alone_gets_the_shared_error() -> None:
    group: Group[int, int] = Group(threading.Lock())

    def together(works: list[int]) -> list[int]:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        group.run(1, together, lambda w: w)


def test_a_thread_that_holds_the_turn_is_not_made_to_wait_for_itself() -> None:
    turn = threading.RLock()
    group: Group[int, int] = Group(turn)
    leader_waiting = threading.Event()
    results: dict[int, int] = {}

    def together(works: list[int]) -> list[int]:
        return [w + 1 for w in works]

    with turn:  # as a transaction of the store's in-process lock would
        # another thread leads and waits for the turn this thread holds
        def lead() -> None:
            leader_waiting.set()
            results[5] = group.run(5, together, lambda w: -1)

        other = _start(lead)
        leader_waiting.wait(10)
        wait_for(lambda: group.leading, what="the other thread leading")
        assert group.run(1, together, lambda w: -1) == 2  # done here, at once
    other.join(10)
    assert results == {5: 6}


def test_a_leader_waits_briefly_for_as_much_work_as_the_last_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three threads that publish one message each, one after the other: the leader
    waits (up to ``LINGER``) for as many as the last transaction took, so they go
    together instead of one a transaction."""
    monkeypatch.setattr(sharing, "LINGER", 30.0)
    group: Group[int, int] = Group(threading.Lock())
    group.last = 3
    calls: list[list[int]] = []

    def together(works: list[int]) -> list[int]:
        calls.append(sorted(works))
        return works

    threads = [_start(lambda: group.run(1, together, lambda w: -1))]
    wait_for(lambda: group.leading, what="a leader")
    threads += [_start(lambda n=n: group.run(n, together, lambda w: -1)) for n in (2, 3)]  # type: ignore[misc]
    for t in threads:
        t.join(10)
    assert calls == [[1, 2, 3]]
    assert group.last == 3


def test_a_leader_does_not_wait_past_the_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharing, "LINGER", 0.01)
    group: Group[int, int] = Group(threading.Lock())
    group.last = 3
    assert group.run(7, lambda works: [w * 2 for w in works], lambda w: -1) == 14
    assert group.last == 1  # a lone publisher next: no wait at all
