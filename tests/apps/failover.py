"""A host app and a publisher for failover tests (tests/integration/test_failover.py).

The host app ``app`` (host ``relay``) takes ``HANDLE_SECONDS`` a delivery and records it
in ``$MB_TEST_OUT/<pid>.log`` as ``message attempt monotonic-time``, one unbuffered
``write`` a line. The publisher
(``python -m tests.apps.failover URL ACKED``) publishes five messages every 20 ms until
SIGTERM, appending each acknowledged message's id and the time of its acknowledgement
to ``ACKED``; a publish the store refuses as unreachable is tried again (new messages),
every 50 ms. Times are ``time.monotonic()``, which every process of the machine shares.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from messagebox import BackendUnavailable, Message, MessageBox
from messagebox.hosts import Delivery, HostApp
from messagebox.predicates import P

HANDLE_SECONDS = 0.01
"""What a delivery takes: a batch is in flight for a moment, as real work would be."""

app = HostApp("relay")
app.subscribe("record", filter=P("t.N") >= 0, name="relay-all")

_fd: int | None = None


@app.service("record")
def record(d: Delivery) -> None:
    global _fd
    if _fd is None:
        out = Path(os.environ["MB_TEST_OUT"]) / f"{os.getpid()}.log"
        _fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    time.sleep(HANDLE_SECONDS)
    os.write(_fd, f"{d.message_id} {d.attempt} {time.monotonic():.6f}\n".encode())


def publish(url: str, acked: str) -> None:
    """Publish until SIGTERM (see the module)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    box = MessageBox(url, publisher="failover-publisher")
    fd = os.open(acked, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    n = 0
    while not stop.is_set():
        batch = [Message(b"x", promoted={"t.N": n + i}) for i in range(5)]
        try:
            routed = box.publish(batch)
        except BackendUnavailable:
            stop.wait(0.05)
            continue
        n += len(batch)
        now = time.monotonic()
        os.write(fd, "".join(f"{r.message_id} {now:.6f}\n" for r in routed).encode())
        stop.wait(0.02)
    os.close(fd)
    box.close()


if __name__ == "__main__":
    publish(sys.argv[1], sys.argv[2])
