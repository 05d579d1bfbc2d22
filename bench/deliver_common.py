"""What the parts of ``bench.deliver`` share: the settings, the consumer protocol
(:data:`Body`), the log and the do-nothing handler.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ("duckdb", "postgresql")
SYSTEMS = ("raw", "pgqueuer", "messagebox")
PUBLISH_BATCH = 1_000
HOST = "bench"
SERVICE = "noop"
POLL_MIN_S = 0.01
POLL_MAX_S = 0.2
LATENCY_BATCH = 10
RAW_IDLE_S = 0.001  # the raw loop's poll interval when idle (latency runs)
RAW_TABLE = "raw_queue"
WATCH_S = 0.002  # how often the parent reads the completion counters
COUNT_EVERY_S = 0.005  # how often a messagebox consumer publishes its completed count
SETTLE_S = 0.3  # idle time for a latency consumer before the first publish
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 10.0  # latency runs: wait this long for the last deliveries


class EventLike(Protocol):
    """``threading.Event`` or a multiprocessing event."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def is_set(self) -> bool: ...
    def set(self) -> None: ...


Add = Callable[[int], None]
"""Report n more completions."""
Body = Callable[[Callable[[], None], EventLike, EventLike, Add], dict[str, Any]]
"""One consumer: ``body(ready, go, stop, add)`` connects, calls ``ready()``, waits for
``go``, consumes (reporting completions through ``add``) until ``stop`` or drained, and
returns a picklable summary."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def noop(_item: object) -> None:
    """The do-nothing handler."""
