"""A host app whose one service appends each delivery to a file, for process tests.

Environment: ``MB_TEST_OUT`` (a directory; each process writes ``<pid>.log``),
``MB_TEST_SLOW`` (seconds each delivery takes). A message with ``t.Fail`` true fails.
A line is ``message sub attempt pid``, written with one unbuffered ``write`` so that a
killed process loses no written line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

app = HostApp("workers", dequeue_threads=2, claim_batch=20, cleanup_interval_seconds=0)
app.subscribe("record", filter=P("t.N") >= 0, name="record-all")

_fd: int | None = None


@app.service("record")
def record(d: Delivery) -> None:
    global _fd
    if _fd is None:
        out = Path(os.environ["MB_TEST_OUT"]) / f"{os.getpid()}.log"
        _fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    if d.properties.get("t.Fail"):
        raise RuntimeError(f"told to fail {d.message_id}")
    slow = float(os.environ.get("MB_TEST_SLOW", "0"))
    if slow:
        time.sleep(slow)
    os.write(_fd, f"{d.message_id} {d.subscription.id} {d.attempt} {os.getpid()}\n".encode())
