"""What the per-key order tests under load share: racing publishers, and the checks of
what the hosts handled (order per key, one at a time per key, keys in parallel)."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from messagebox import Message, MessageBox
from messagebox.hosts import Delivery


@dataclass(frozen=True)
class Handled:
    """One delivery as a service saw it: the message's key, publisher and number in
    that publisher's sequence of the key, the attempt, who handled it and when
    (``time.monotonic_ns()``, one clock for every process of the machine)."""

    key: int
    pub: int
    seq: int
    attempt: int
    worker: str
    start: int
    end: int


def read_logs(out: Path) -> list[Handled]:
    """The deliveries the processes of ``tests.apps.keyed`` wrote (whole lines only)."""
    found = []
    for log in out.glob("*.log"):
        text = log.read_text()
        for line in text[: text.rfind("\n") + 1].splitlines():
            key, pub, seq, attempt, pid, start, end = line.split()
            found.append(
                Handled(int(key), int(pub), int(seq), int(attempt), pid, int(start), int(end))
            )
    return found


def publish_racing(url: str, keys: int, per_key: int, publishers: int = 2) -> None:
    """``publishers`` threads, each with a store of its own, publish at once
    ``per_key // publishers`` messages of every key (``t.K``), numbered in each
    publisher's order (``t.Seq``): a batch per number, its keys shuffled."""
    errors: list[BaseException] = []

    def publish(pub: int) -> None:
        rng = random.Random(pub)
        try:
            with MessageBox(url, publisher=f"racer-{pub}") as box:
                for seq in range(per_key // publishers):
                    order = list(range(keys))
                    rng.shuffle(order)
                    box.publish(
                        Message(b"x", promoted={"t.K": k, "t.Pub": pub, "t.Seq": seq})
                        for k in order
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(p,)) for p in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def check_order(
    handled: Sequence[Handled], keys: int, per_key: int, publishers: int = 2, *, again: bool
) -> int:
    """Assert, for every key: each publisher's messages were handled in its order,
    every one of them, one delivery of the key at a time. Without ``again`` each was
    handled once, at its first attempt; with it (a host was killed) a message may be
    handled again, only at a later attempt, the key going on from there in order.
    Returns how many deliveries repeated an earlier one."""
    by_key: dict[int, list[Handled]] = {}
    for h in handled:
        by_key.setdefault(h.key, []).append(h)
    assert sorted(by_key) == list(range(keys))
    for key, seen in by_key.items():
        seen.sort(key=lambda h: h.start)
        for before, after in itertools.pairwise(seen):  # one at a time
            assert after.start >= before.end, (key, before, after)
        for pub in range(publishers):
            seqs = [(h.seq, h.attempt) for h in seen if h.pub == pub]
            assert {s for s, _ in seqs} == set(range(per_key // publishers)), (key, pub)
            if not again:
                assert seqs == [(s, 1) for s in range(per_key // publishers)], (key, pub, seqs)
                continue
            assert seqs[0][0] == 0, (key, pub, seqs)
            for (prev, _), (seq, attempt) in itertools.pairwise(seqs):
                # in order, or back to an earlier one, delivered again after the kill
                assert seq == prev + 1 or (attempt > 1 and seq <= prev), (key, pub, seqs)
    return len(handled) - len({(h.key, h.pub, h.seq) for h in handled})


def in_parallel(handled: Iterable[Handled]) -> float:
    """The share of the time from the first delivery's start to the last one's end
    during which deliveries of at least two keys were in flight at once."""
    events = sorted(
        [(h.start, 1) for h in handled] + [(h.end, -1) for h in handled],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    if not events:
        return 0.0
    busy = 0
    at_least_two = 0
    last = events[0][0]
    for at, step in events:
        if busy >= 2:
            at_least_two += at - last
        busy += step
        last = at
    return at_least_two / max(1, events[-1][0] - events[0][0])


class KeyRecorder:
    """A service that records each key's ``t.N`` as delivered and counts deliveries of a
    key that overlap; the one ``fail`` names raises."""

    def __init__(self, fail: tuple[str, int] | None = None) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, list[int]] = {}
        self.busy: set[str] = set()
        self.overlaps = 0
        self.fail = fail

    def __call__(self, d: Delivery) -> None:
        key, n = str(d.properties["t.K"]), int(d.properties["t.N"])  # type: ignore[arg-type]
        with self.lock:
            self.overlaps += key in self.busy
            self.busy.add(key)
        try:
            if self.fail == (key, n):
                raise RuntimeError(f"cannot take {key} {n}")
            with self.lock:
                self.seen.setdefault(key, []).append(n)
        finally:
            with self.lock:
                self.busy.discard(key)

    def count(self) -> int:
        with self.lock:
            return sum(map(len, self.seen.values()))
