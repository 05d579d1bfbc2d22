"""Group commit of a receive adapter's concurrent inputs (messagebox.adapters.grouping):
what waits while a group is submitted goes in the next one, each caller gets its own
result, a failed group's inputs are submitted again alone, a throttled group is
everybody's answer, and nobody is left waiting."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest

from messagebox.adapters import grouping
from messagebox.adapters.base import Inbound, Submitted
from messagebox.adapters.grouping import GroupedSink
from messagebox.errors import BackendUnavailable, PipelineError, Throttled
from tests.conftest import wait_for


class FakeSink:
    """Answers each input with an id made of its bytes; ``first`` runs in the first
    submit (to hold it while others arrive); an input whose bytes are in ``bad`` fails
    any submit it is part of."""

    max_bytes = 1 << 20

    def __init__(self, first: Callable[[], None] = lambda: None, bad: bytes = b"") -> None:
        self.calls: list[list[bytes]] = []
        self.first = first
        self.bad = bad

    def submit(self, inputs: list[Inbound]) -> list[Submitted]:
        bodies = [i.open().read() for i in inputs]
        self.calls.append(bodies)
        if len(self.calls) == 1:
            self.first()
        if self.bad and self.bad in bodies:
            raise PipelineError(f"refuses {self.bad!r}", code="bad", component="fake")
        return [Submitted((_id(b),)) for b in bodies]


def _id(body: bytes) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_OID, body.decode())


def _callers(
    grouped: GroupedSink, bodies: list[bytes]
) -> tuple[list[threading.Thread], dict[bytes, object]]:
    got: dict[bytes, object] = {}

    def call(body: bytes) -> None:
        try:
            got[body] = grouped.submit(Inbound.of_bytes(body))
        except Exception as exc:
            got[body] = exc

    threads = [threading.Thread(target=call, args=(b,)) for b in bodies]
    return threads, got


def _held_first(n_waiting: int, bad: bytes = b"") -> tuple[GroupedSink, FakeSink]:
    """A grouped sink whose first submit waits until ``n_waiting`` others wait."""
    holder: list[GroupedSink] = []

    def first() -> None:
        wait_for(lambda: len(holder[0]._waiting) == n_waiting, what=f"{n_waiting} waiting")

    sink = FakeSink(first, bad)
    grouped = GroupedSink(sink)
    holder.append(grouped)
    return grouped, sink


def _first_then_the_rest(
    grouped: GroupedSink, sink: FakeSink, bodies: list[bytes]
) -> dict[bytes, object]:
    """The first body's caller, then (once its submit has begun) the others' at once;
    what each got."""
    threads, got = _callers(grouped, bodies)
    threads[0].start()
    wait_for(lambda: len(sink.calls) == 1, what="the first submit")
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    return got


def test_inputs_that_wait_while_a_group_is_submitted_go_together_each_with_its_result() -> None:
    grouped, sink = _held_first(19)
    bodies = [str(i).encode() for i in range(20)]
    got = _first_then_the_rest(grouped, sink, bodies)
    assert [len(c) for c in sink.calls] == [1, 19]  # one alone, then the rest together
    assert got == {b: Submitted((_id(b),)) for b in bodies}
    assert grouped.groups == 2
    assert not grouped._leading
    assert not grouped._waiting


def test_a_failed_group_submits_each_input_alone_and_only_the_culprit_fails() -> None:
    grouped, sink = _held_first(4, bad=b"bad")
    got = _first_then_the_rest(grouped, sink, [b"first", b"a", b"bad", b"b", b"c"])
    assert sink.calls == [[b"first"], [b"a", b"bad", b"b", b"c"], [b"a"], [b"bad"], [b"b"], [b"c"]]
    assert isinstance(got[b"bad"], PipelineError)
    assert {b: got[b] for b in (b"first", b"a", b"b", b"c")} == {
        b: Submitted((_id(b),)) for b in (b"first", b"a", b"b", b"c")
    }


@pytest.mark.parametrize(
    "error",
    [Throttled("queue full"), BackendUnavailable("database down"), RuntimeError("broken")],
    ids=["throttled", "database-down", "broken"],
)
def test_a_throttled_unreachable_or_broken_group_is_every_callers_answer_and_nobody_waits(
    error: Exception,
) -> None:
    class Failing(FakeSink):
        def submit(self, inputs: list[Inbound]) -> list[Submitted]:
            self.calls.append([i.open().read() for i in inputs])
            raise error

    failing = Failing()
    grouped = GroupedSink(failing)
    threads, got = _callers(grouped, [str(i).encode() for i in range(8)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert all(v is error for v in got.values())
    assert len(got) == 8
    assert sum(len(c) for c in failing.calls) == 8
    assert not grouped._leading
    assert not grouped._waiting


def test_a_group_is_bounded_by_inputs_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grouping, "MAX_GROUP", 3)
    monkeypatch.setattr(grouping, "MAX_GROUP_BYTES", 10)
    grouped = GroupedSink(FakeSink())
    for body in (b"1", b"2", b"3", b"4", b"12345678901", b"5"):
        grouped._waiting.append(grouping._Ask(Inbound.of_bytes(body)))
    taken = []
    while grouped._waiting:
        taken.append([a.inbound.size for a in grouped._take()])
    assert taken == [[1, 1, 1], [1], [11], [1]]  # a large one alone
