"""A host app whose one subscription is ordered by ``t.K`` (per-key order), for process
tests: each delivery is appended to a file.

Environment: ``MB_TEST_OUT`` (a directory; each process writes ``<pid>.log``),
``MB_TEST_SLOW`` (seconds each delivery takes). A line is ``key publisher seq attempt
pid start end`` (``start``/``end``: ``time.monotonic_ns()``, one clock for every process
of the machine), written with one unbuffered ``write`` when the delivery ends, so that a
killed process loses no written line. Where ``MB_TEST_OUT`` holds a file ``kill-after``
(a number N), the first process to deliver a message kills itself (SIGKILL) when it has
written N lines: within a delivery, whose outcome it never records.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

app = HostApp("keyed", dequeue_threads=4, claim_batch=10, cleanup_interval_seconds=0)
app.subscribe("record", filter=P("t.Seq") >= 0, name="by-key", ordered_by="t.K")

_fd: int | None = None
_kill_after: int | None = None
_written = 0


def _victim(out: Path) -> int | None:
    """N if this process is to kill itself after N lines (the first to ask), else None."""
    if not (out / "kill-after").exists():
        return None
    try:
        os.close(os.open(out / "victim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    return int((out / "kill-after").read_text())


@app.service("record")
def record(d: Delivery) -> None:
    global _fd, _kill_after, _written
    if _fd is None:
        out = Path(os.environ["MB_TEST_OUT"])
        _kill_after = _victim(out)
        _fd = os.open(out / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    start = time.monotonic_ns()
    slow = float(os.environ.get("MB_TEST_SLOW", "0"))
    if slow:
        time.sleep(slow)
    p = d.properties
    line = f"{p['t.K']} {p['t.Pub']} {p['t.Seq']} {d.attempt} {os.getpid()} {start} "
    os.write(_fd, f"{line}{time.monotonic_ns()}\n".encode())
    _written += 1
    if _kill_after is not None and _written >= _kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
