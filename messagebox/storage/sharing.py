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


LINGER = 0.0005
"""How long a leader waits for as much work as the last one took along (seconds),
before it takes the turn: never while holding it (the turn of claims and step commits
is DuckDB's in-process lock, which every transaction there waits for)."""


class _Waiting(Generic[W, R]):
    __slots__ = ("alone", "done", "result", "work")

    def __init__(self, work: W) -> None:
        self.work = work
        self.done = False
        self.result: R | None = None
        self.alone = False  # a shared attempt failed: its thread does it alone


class Group(Generic[W, R]):
    """Threads' work waiting for ``turn`` (a lock), done together by whoever gets it.

    One thread at a time leads: it takes ``turn`` and does the work left with the group
    by then, its own included. The others wait on the group's condition, not on
    ``turn``: a thread whose work a leader did returns as soon as it is done. (When
    they waited on ``turn`` to learn that, each had to take it in turn after every
    transaction, one more thread's work leaving per transaction: eight threads
    publishing single messages on DuckDB went two to a transaction, at 480 msgs/s.)"""

    def __init__(self, turn: AbstractContextManager[Any]) -> None:
        self.turn = turn
        self.mutex = threading.Condition(threading.Lock())
        self.pending: list[_Waiting[W, R]] = []
        self.leading = False
        self.last = 1  # how much work the last leader took along

    def run(
        self,
        work: W,
        together: Callable[[list[W]], list[R]],
        alone: Callable[[W], R],
    ) -> R:
        """``work``'s result: from ``together`` (the results of every waiting thread's
        work, in order, in one transaction) when this thread leads or a leader took it
        along, else (after a failed shared attempt) from ``alone``, under ``turn``."""
        owned = getattr(self.turn, "_is_owned", None)  # an RLock: is it this thread's?
        if owned is not None and owned():  # in a transaction that holds it: no waiting
            with self.turn:
                return together([work])[0]
        mine: _Waiting[W, R] = _Waiting(work)
        with self.mutex:
            self.pending.append(mine)
            self.mutex.notify_all()  # a lingering leader counts it
            while self.leading and not mine.done:
                self.mutex.wait()
            if not mine.done:
                self.leading = True
                if len(self.pending) < self.last:  # as many as last time may come
                    self.mutex.wait_for(lambda: len(self.pending) >= self.last, LINGER)
        if mine.done:
            if mine.alone:
                with self.turn:
                    return alone(work)
            return mine.result  # type: ignore[return-value]
        try:
            with self.turn:  # held by the transaction that takes the waiting work along
                with self.mutex:
                    waiting, self.pending = self.pending, []
                    self.last = len(waiting)
                try:
                    results = together([w.work for w in waiting])
                except BaseException as exc:
                    self._finish(waiting, None)
                    if len(waiting) == 1 or not isinstance(exc, Exception):
                        raise
                    return alone(work)
                self._finish(waiting, results)
                return mine.result  # type: ignore[return-value]
        finally:
            with self.mutex:
                self.leading = False
                self.mutex.notify_all()

    def _finish(self, waiting: list[_Waiting[W, R]], results: list[R] | None) -> None:
        """Hand each waiting thread its result, or (None: the shared attempt failed) its
        work to do alone, and wake them."""
        with self.mutex:
            for i, w in enumerate(waiting):
                if results is None:
                    w.alone = True  # each does its own next, and gets its own error
                else:
                    w.result = results[i]
                w.done = True
            self.mutex.notify_all()


class Groups:
    """One store's groups by name, made on first use, each with ``turn()`` as its turn.

    Per store, not per database: the leader does the work it takes along through its
    own store (its transaction, its count hooks, its outage), so work brought through
    one store is never done, nor counted, through another. The turn is the database's
    in-process lock all the same, so the groups of two stores of one database still
    take turns."""

    def __init__(self, turn: Callable[[], AbstractContextManager[Any]]) -> None:
        self._turn = turn
        self._groups: dict[str, Group[Any, Any]] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> Group[Any, Any]:
        """The group ``name`` (made now if it is new)."""
        with self._guard:
            group = self._groups.get(name)
            if group is None:
                group = self._groups[name] = Group(self._turn())
            return group
