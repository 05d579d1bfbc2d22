"""What a timed stretch of a bench cost: wall seconds, this process's CPU seconds, and
the busy CPU seconds of the whole machine (Linux ``/proc/stat``; elsewhere unknown).

The machine less the process is the rest of the work: PostgreSQL's server and the
kernel (on DuckDB, the engine's own threads are in the process). A figure per message
handled says where a rate's limit lies: two cores give at most 2 s of CPU a second.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


def _machine_busy() -> float | None:
    """Busy CPU seconds of the machine since boot (all cores), or None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields) - idle) / ticks


@dataclass(frozen=True)
class Spent:
    """A stretch's wall time and CPU: this process's and, where known, the machine's."""

    seconds: float
    process: float
    machine: float | None

    def per(self, n: int) -> tuple[float, float | None]:
        """Microseconds of CPU per item: this process's, and the rest of the machine's."""
        rest = None if self.machine is None else max(0.0, self.machine - self.process)
        return 1e6 * self.process / n, None if rest is None else 1e6 * rest / n


class Meter:
    """Starts measuring when made; :meth:`stop` gives what was spent since."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._busy = _machine_busy()

    def stop(self) -> Spent:
        wall = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        busy = _machine_busy()
        machine = None if busy is None or self._busy is None else busy - self._busy
        return Spent(wall, cpu, machine)
