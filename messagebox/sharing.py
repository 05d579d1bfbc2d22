"""Work that threads bring while a transaction runs, done together in the next one.

Where transactions run one at a time (DuckDB's in-process lock), a thread that must wait
anyway leaves its work with a :class:`Group`; the next thread to get its turn does every
waiting thread's work in one transaction (DuckDB costs about a millisecond a statement
whatever its row count). If that shared transaction fails, each thread does its own work
alone, so an error stays with the work that caused it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

W = TypeVar("W")
R = TypeVar("R")


class _Waiting(Generic[W, R]):
    __slots__ = ("alone", "done", "result", "work")

    def __init__(self, work: W) -> None:
        self.work = work
        self.done = False
        self.result: R | None = None
        self.alone = False  # a shared attempt failed: its thread does it alone


class Group(Generic[W, R]):
    """Threads' work waiting for ``turn`` (a lock), done together by whoever gets it."""

    def __init__(self, turn: AbstractContextManager[Any]) -> None:
        self.turn = turn
        self.mutex = threading.Lock()
        self.pending: list[_Waiting[W, R]] = []

    def run(
        self,
        work: W,
        together: Callable[[list[W]], list[R]],
        alone: Callable[[W], R],
    ) -> R:
        """``work``'s result: from ``together`` (the results of every waiting thread's
        work, in order, in one transaction) when this thread's turn comes or another's
        took it along, else (after a failed shared attempt) from ``alone``."""
        mine: _Waiting[W, R] = _Waiting(work)
        with self.mutex:
            self.pending.append(mine)
        with self.turn:  # held by the transaction that may take this work along
            if mine.done:
                return mine.result  # type: ignore[return-value]
            if mine.alone:
                return alone(work)
            with self.mutex:
                waiting, self.pending = self.pending, []
            try:
                results = together([w.work for w in waiting])
            except BaseException as exc:
                for w in waiting:
                    w.alone = True  # each does its own next, and gets its own error
                if len(waiting) == 1 or not isinstance(exc, Exception):
                    raise
                return alone(work)
            for w, result in zip(waiting, results, strict=True):
                w.result, w.done = result, True
            return mine.result  # type: ignore[return-value]
