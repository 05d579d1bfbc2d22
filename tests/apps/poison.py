"""A host app for fault tests: one service records each delivery to a file, and a
message with ``t.Poison`` true ends the process (``os._exit``), as a segfault or the
OOM killer would.

Environment: ``MB_TEST_OUT`` (a directory; each process appends to ``<pid>.log`` one
line ``message attempt pid`` per delivery started, before the poison check).
"""

from __future__ import annotations

import os
from pathlib import Path

from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

app = HostApp(
    "poisoned",
    dequeue_threads=2,
    claim_batch=20,
    max_attempts=3,
    poll_min_seconds=0.01,
    poll_max_seconds=0.2,
    heartbeat_seconds=0.2,
    dead_after_seconds=1.0,
    cleanup_interval_seconds=0,
)
app.subscribe("record", filter=P("t.N") >= 0, name="record-all")

_fd: int | None = None


@app.service("record")
def record(d: Delivery) -> None:
    global _fd
    if _fd is None:
        out = Path(os.environ["MB_TEST_OUT"]) / f"{os.getpid()}.log"
        _fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(_fd, f"{d.message_id} {d.attempt} {os.getpid()}\n".encode())
    if d.properties.get("t.Poison"):
        os._exit(3)
