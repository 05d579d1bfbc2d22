"""Group commit for receive adapters: inputs submitted at once by concurrent callers
(HTTP requests, each on its own thread) are published together, in one transaction.

The first caller to find nobody submitting leads: it submits every input waiting (its
own among them, at most ``MAX_GROUP``) in one :meth:`Sink.submit`, hands each caller
its result, and passes the lead to the first caller still waiting. A caller alone is
submitted at once, as before; under load a transaction carries many inputs instead of
one each. Each caller gets what a submit of its input alone would have given: when a
group's submit raises (an ``Idempotency-Key`` two of them share, a pipeline error that
fails its input), each of its inputs is submitted again alone; only
:class:`~messagebox.errors.Throttled` and
:class:`~messagebox.errors.BackendUnavailable` are everybody's answer at once (each
alone would wait for the same queue, or the same database).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from messagebox.adapters.base import Inbound, Sink, Submitted
from messagebox.errors import BackendUnavailable, MessageBoxError, Throttled

MAX_GROUP = 128
"""Inputs submitted together at most (the rest wait for the next group)."""
MAX_GROUP_BYTES = 16 * 1024 * 1024
"""Bytes of inputs submitted together at most (one input may be larger: it goes alone)."""


@dataclass(eq=False)
class _Ask:
    inbound: Inbound
    ready: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    result: Submitted | None = None
    error: BaseException | None = None

    def outcome(self) -> Submitted:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class GroupedSink:
    """Submits one input at a time for many threads, grouped (see the module)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._lock = threading.Lock()
        self._waiting: list[_Ask] = []
        self._leading = False
        self.groups = 0
        """Transactions submitted (a group, or an input of a failed group alone)."""

    def submit(self, inbound: Inbound) -> Submitted:
        """Publish ``inbound`` (with whatever others wait beside it); its result, or the
        error its own submit would have raised."""
        ask = _Ask(inbound)
        with self._lock:
            self._waiting.append(ask)
            lead = not self._leading
            self._leading = True
        if not lead:
            ask.ready.wait()
        if lead or ask.lead:
            self._lead()
        return ask.outcome()

    def _lead(self) -> None:
        with self._lock:
            group = self._take()
        try:
            self._submit(group)
        finally:
            with self._lock:
                if self._waiting:
                    self._waiting[0].lead = True
                    self._waiting[0].ready.set()
                else:
                    self._leading = False
            for ask in group:
                ask.ready.set()

    def _take(self) -> list[_Ask]:
        """The next group: the oldest waiting inputs, within the group's bounds."""
        size = 0
        n = 0
        for ask in self._waiting[:MAX_GROUP]:
            size += ask.inbound.size
            if n and size > MAX_GROUP_BYTES:
                break
            n += 1
        group = self._waiting[:n]
        del self._waiting[:n]
        return group

    def _submit(self, group: list[_Ask]) -> None:
        try:
            self.groups += 1
            results = self.sink.submit([a.inbound for a in group])
        except (Throttled, BackendUnavailable) as exc:
            for ask in group:
                ask.error = exc
            return
        except MessageBoxError as exc:
            if len(group) == 1:
                group[0].error = exc
                return
            for ask in group:  # each alone: its own answer
                self._submit([ask])
            return
        except BaseException as exc:  # never leave a caller waiting
            for ask in group:
                ask.error = exc
            return
        for ask, result in zip(group, results, strict=True):
            ask.result = result
