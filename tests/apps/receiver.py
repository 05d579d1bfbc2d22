"""A host app with a file receive location and a file send port, for crash tests.

Environment: ``MB_TEST_IN`` (the inbound folder), ``MB_TEST_OUT`` (the outbound
folder), and ``MB_TEST_CRASH_AFTER`` (exit abruptly right after that many batches were
published, before their files are archived: the most dangerous moment to die).
"""

from __future__ import annotations

import os

from messagebox.adapters import Inbound, Submitted
from messagebox.hosts import HostApp, Transport
from messagebox.pipelines import Field, PropertySchema, XmlReceive
from messagebox.predicates import P

app = HostApp(
    "receiver",
    dequeue_threads=2,
    claim_batch=20,
    poll_min_seconds=0.01,
    poll_max_seconds=0.2,
    heartbeat_seconds=0.2,
    dead_after_seconds=1.0,
    cleanup_interval_seconds=0.5,
)
item = PropertySchema("Item", {"t.N": Field("/Item/N", int)})
location = app.receive_port("in").location(
    "drop",
    f"file://{os.environ['MB_TEST_IN']}?mask=*.xml&interval=0.05&batch=25&recover_interval=0.3",
    pipeline=XmlReceive([item]),
)
app.send_port(
    "out",
    filter=P("t.N") >= 0,
    transport=Transport(
        f"file://{os.environ['MB_TEST_OUT']}/%SourceFileName%.%MessageID%",
        options=(("fsync", False),),
    ),
)

_crash_after = int(os.environ.get("MB_TEST_CRASH_AFTER", "0"))
if _crash_after:
    _submit = location.submit
    _batches = 0

    def _submit_then_die(inputs: list[Inbound]) -> list[Submitted]:
        global _batches
        results = _submit(inputs)
        _batches += 1
        if _batches >= _crash_after:
            os._exit(9)  # committed, but the files are still taken, not archived
        return results

    location.submit = _submit_then_die  # type: ignore[method-assign]
