"""A host app for fault tests: a message with ``t.Hang`` true hangs its handler for
ever (a call to a dependency that never answers); the others are recorded.

Environment: ``MB_TEST_OUT`` (a directory; each process appends to ``<pid>.log`` one
line ``message attempt`` per delivery it completes).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

app = HostApp(
    "hanging",
    dequeue_threads=4,
    claim_batch=10,
    max_attempts=2,
    handler_timeout_seconds=0.5,
    retry_backoff_seconds=0,
    poll_min_seconds=0.01,
    poll_max_seconds=0.2,
    heartbeat_seconds=0.2,
    dead_after_seconds=1.0,
    cleanup_interval_seconds=0,
)
app.subscribe("record", filter=P("t.N") >= 0, name="record-all")

_never = threading.Event()
_fd: int | None = None


@app.service("record")
def record(d: Delivery) -> None:
    global _fd
    if d.properties.get("t.Hang"):
        _never.wait()
    if _fd is None:
        out = Path(os.environ["MB_TEST_OUT"]) / f"{os.getpid()}.log"
        _fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(_fd, f"{d.message_id} {d.attempt}\n".encode())
