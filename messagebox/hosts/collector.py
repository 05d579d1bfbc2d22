"""The garbage collector while host instances run: the objects the process held when
the first one started are left out of its full collections.

CPython's full collection walks every tracked object, and a process that runs a host
instance holds a great many from its start that live as long as it does: the modules,
classes and functions of the application and its libraries (about 130,000 in the bench
processes). A host instance's batches make many objects that live a little while, so
full collections come often, and each walked them all: 80-90 ms, with every thread
stopped. In ``bench.orchestrate`` they took about a quarter of the orchestration's time
on DuckDB.

So the first host instance to start in a process moves every object the process then
holds into the collector's permanent generation (:func:`gc.freeze`), which collections
skip; the last one to stop gives them back (:func:`gc.unfreeze`). Objects made while
instances run are collected as usual. An unreachable cycle among the frozen objects
is freed only after that last stop, and :func:`gc.get_objects` (which tools that look
for leaks read) leaves the frozen objects out meanwhile.

Set ``MESSAGEBOX_GC_FREEZE=0`` to leave the collector alone. It is also left alone when
the collector is disabled, or when something else froze objects first (a server that
freezes before it forks, say): those stay frozen, as their owner meant.
"""

from __future__ import annotations

import gc
import os
import threading

_guard = threading.Lock()
_running = 0
_froze = False


def enabled() -> bool:
    """Whether host instances freeze the objects held at the first start."""
    return os.environ.get("MESSAGEBOX_GC_FREEZE", "1") != "0"


def instance_started() -> None:
    """A host instance starts: the first of the process freezes what the process holds."""
    global _running, _froze
    with _guard:
        _running += 1
        if _running == 1 and enabled() and gc.isenabled() and gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True


def instance_stopped() -> None:
    """A host instance stopped: the last gives back what the first froze."""
    global _running, _froze
    with _guard:
        _running -= 1
        if _running == 0 and _froze:
            gc.unfreeze()
            _froze = False
