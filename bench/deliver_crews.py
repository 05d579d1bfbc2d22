"""Consumer crews of ``bench.deliver``: threads of this process, or spawned worker
processes reused across runs.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import signal
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.deliver_common import READY_TIMEOUT_S, Body, EventLike
from bench.deliver_mb import mb_body
from bench.deliver_pgqueuer import pgq_body
from bench.deliver_raw import raw_pg_body


class Crew(Protocol):
    def launch(self) -> None:
        """Start the consumers and wait until each is connected and ready."""

    def go(self) -> None:
        """Let them consume."""

    def completed(self) -> int:
        """Completions so far."""

    def finish(self) -> list[dict[str, Any]]:
        """Stop them and return their summaries (raises a consumer's error)."""


class Threads:
    """Consumers as threads of this process, one body each."""

    def __init__(self, bodies: Sequence[Body]) -> None:
        self._bodies = list(bodies)
        self._go = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Semaphore(0)
        self._counts = [0] * len(self._bodies)
        self._results: list[Any] = [None] * len(self._bodies)
        self._threads: list[threading.Thread] = []

    def _run(self, i: int, body: Body) -> None:
        readied = False

        def ready() -> None:
            nonlocal readied
            readied = True
            self._ready.release()

        def add(n: int) -> None:
            self._counts[i] += n

        try:
            self._results[i] = body(ready, self._go, self._stop, add)
        except BaseException as exc:
            self._results[i] = exc
        finally:
            if not readied:
                self._ready.release()

    def launch(self) -> None:
        for i, body in enumerate(self._bodies):
            t = threading.Thread(
                target=self._run, args=(i, body), name=f"consumer-{i}", daemon=True
            )
            self._threads.append(t)
            t.start()
        try:
            for _ in self._bodies:
                if not self._ready.acquire(timeout=READY_TIMEOUT_S):
                    raise RuntimeError("a consumer did not get ready in time")
            self._raise()
        except BaseException:
            self._stop.set()
            self._go.set()
            raise

    def go(self) -> None:
        self._go.set()

    def completed(self) -> int:
        return sum(self._counts)

    def finish(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._go.set()
        for t in self._threads:
            t.join()
        self._raise()
        return list(self._results)

    def _raise(self) -> None:
        for r in self._results:
            if isinstance(r, BaseException):
                raise RuntimeError(f"a consumer failed: {r!r}") from r


@dataclass(frozen=True)
class WorkerTask:
    """What one worker process runs (picklable)."""

    system: str
    batch: int
    dsn: str
    schema: str
    mb_url: str = ""
    pgq_driver: str = "asyncpg"
    record: bool = False


def _task_body(task: WorkerTask) -> Body:
    if task.system == "raw":
        return raw_pg_body(task.dsn, task.schema, task.batch)
    if task.system == "pgqueuer":
        return pgq_body(task.pgq_driver, task.dsn, task.schema, task.batch, 1)
    return mb_body(task.mb_url, 1, task.batch, record=task.record)


def _worker_main(
    index: int,
    tasks: mp.Queue[WorkerTask | None],
    results: mp.Queue[tuple[str, int, Any]],
    go: EventLike,
    stop: EventLike,
    counts: Any,
) -> None:
    """A worker process: run tasks until told to exit (``None``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    logging.basicConfig(level=logging.WARNING)
    results.put(("up", index, None))  # imports done: no longer competing for the CPUs
    while (task := tasks.get()) is not None:

        def ready() -> None:
            results.put(("ready", index, None))

        def add(n: int) -> None:
            counts[index] += n

        try:
            summary = _task_body(task)(ready, go, stop, add)
            results.put(("done", index, summary))
        except BaseException:
            results.put(("error", index, traceback.format_exc()))


class WorkerPool:
    """Spawned worker processes, reused across runs (each costs ~1 s of imports)."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.size = size
        self._go = ctx.Event()
        self._stop = ctx.Event()
        self._counts = ctx.Array("q", size, lock=False)
        self._results: mp.Queue[tuple[str, int, Any]] = ctx.Queue()
        self._tasks: list[mp.Queue[WorkerTask | None]] = [ctx.Queue() for _ in range(size)]
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(i, q, self._results, self._go, self._stop, self._counts),
                name=f"bench-deliver-{i}",
                daemon=True,
            )
            for i, q in enumerate(self._tasks)
        ]
        for p in self._procs:
            p.start()
        self._expect("up", size, READY_TIMEOUT_S)

    def crew(self, task: WorkerTask, k: int) -> Crew:
        if k > self.size:
            raise ValueError(f"{k} processes asked of a pool of {self.size}")
        return _PoolCrew(self, task, k)

    def _expect(self, kind: str, k: int, timeout: float) -> list[Any]:
        out: list[Any] = []
        errors: list[str] = []
        while len(out) + len(errors) < k:
            try:
                status, index, payload = self._results.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"worker processes did not report {kind!r} in time") from None
            if status == "error":
                errors.append(f"worker process {index}:\n{payload}")
            elif status != kind:
                raise RuntimeError(f"worker process {index} said {status!r}, not {kind!r}")
            else:
                out.append(payload)
        if errors:
            raise RuntimeError("\n".join(errors))
        return out

    def close(self) -> None:
        self._go.set()
        self._stop.set()
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)


class _PoolCrew:
    def __init__(self, pool: WorkerPool, task: WorkerTask, k: int) -> None:
        self._pool = pool
        self._task = task
        self._k = k

    def launch(self) -> None:
        pool = self._pool
        pool._go.clear()
        pool._stop.clear()
        for i in range(pool.size):
            pool._counts[i] = 0
        for q in pool._tasks[: self._k]:
            q.put(self._task)
        try:
            pool._expect("ready", self._k, READY_TIMEOUT_S)
        except BaseException:
            pool._stop.set()  # let the ready ones finish; the run is aborted
            pool._go.set()
            raise

    def go(self) -> None:
        self._pool._go.set()

    def completed(self) -> int:
        return int(sum(self._pool._counts[: self._k]))

    def finish(self) -> list[dict[str, Any]]:
        self._pool._stop.set()
        self._pool._go.set()
        return self._pool._expect("done", self._k, READY_TIMEOUT_S)
