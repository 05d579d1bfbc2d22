"""An in-memory store with the SQL stores' delivery semantics (claims under leases,
attempts, retries and suspension, ordered runs, per-key order, scheduled delivery,
expiry, dead instances, timers and steps), for tests and embedding: a
:class:`MemoryStore` to set up and publish to, a :class:`MemoryConsumer` per host
instance (the :class:`messagebox.port.HostStore` port), a :class:`MemoryBox` a host
instance runs on (the :class:`messagebox.port.HostBox` port), and the clocks it reads
(:class:`ManualClock` moves only when a test says so)."""

from messagebox.memory.box import MemoryBox
from messagebox.memory.clocks import Clock, ManualClock, SystemClock
from messagebox.memory.consumer import MemoryConsumer
from messagebox.memory.state import Entry, MemoryStore, Suspended, Timer

__all__ = [
    "Clock",
    "Entry",
    "ManualClock",
    "MemoryBox",
    "MemoryConsumer",
    "MemoryStore",
    "Suspended",
    "SystemClock",
    "Timer",
]
