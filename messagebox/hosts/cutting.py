"""How a claim for several dequeue threads is cut into their batches, and how long a
thread's claims leave keyed runs alone after finding none."""

from __future__ import annotations

import threading

from messagebox.claims import Claim, in_claim_order
from messagebox.hosts.timing import Clock

STEP_BATCHES = 16
"""Where one claim serves several threads (DuckDB; orchestrations on PostgreSQL), its
orchestration steps go to a thread together, up to this many ``claim_batch`` at a time:
one read, one load and one commit for them all (at 4 threads of 50,
``bench.orchestrate`` on DuckDB: split by ``claim_batch``, 829 steps/s; up to 4
batches, 1,564; on a faster machine, up to 4 gave 3,800-4,300 and up to 16, with claims
ahead at the handlers' pace, 5,100-6,500. On PostgreSQL, alternating five runs each:
a batch a thread, 1,309-2,102 steps/s (median 1,493); claims ahead at the handlers'
pace and up to 16 batches, 2,511-3,593 (2,975)). Their messages are
read together, a chunk of ``hosts.service.BATCH_READ_TOTAL`` bytes at a time."""

KEYED_REST_SECONDS = 0.02
"""How long a thread whose claim found no free key claims no keyed runs (every thread,
where one claim serves them all: DuckDB), where its host has other subscriptions
beside those ordered by a property; twice as long after each such claim in a row, up
to :data:`KEYED_REST_MOST`. Looking for them costs a claim as much as a plain claim
costs on DuckDB (the planning of its statement: 2.5 ms), 0.2 ms on PostgreSQL: a
tenth and more of the rest of the host's rate when there are none. A keyed entry then
waits that much more for a claim, at most (on PostgreSQL the thread that holds a key
claims its next run as it completes the last, resting or not)."""
KEYED_REST_MOST = 0.16


def cut_into_batches(claims: list[Claim], size: int) -> list[list[Claim]]:
    """A claim for several threads cut into their batches: an ordered run alone first,
    for the claiming thread, which handles it in order; keyed runs, each key's whole in
    one batch (:func:`key_batches`); entries of service instances (orchestration steps)
    together, up to :data:`STEP_BATCHES` batches' worth; then the others in batches of
    ``size`` (``claim_batch``)."""
    run = [c for c in claims if c.run]
    if run:
        claims = [c for c in claims if not c.run]
    keyed = [c for c in claims if c.key is not None]
    if keyed:
        claims = [c for c in claims if c.key is None]
    steps = [c for c in claims if c.instance_id is not None]
    rest = [c for c in claims if c.instance_id is None] if steps else claims
    most = STEP_BATCHES * size
    return (
        ([run] if run else [])
        + key_batches(keyed, size)
        + [steps[i : i + most] for i in range(0, len(steps), most)]
        + [rest[i : i + size] for i in range(0, len(rest), size)]
    )


def key_batches(keyed: list[Claim], size: int) -> list[list[Claim]]:
    """Keyed claims (in claim order) in batches of about ``size``, each key's run whole
    in one batch and in publish order: a key is handled by one thread at a time."""
    runs: dict[tuple[int, str | None], list[Claim]] = {}
    for c in keyed:
        runs.setdefault((c.sub, c.key), []).append(c)
    batches: list[list[Claim]] = []
    batch: list[Claim] = []
    for run in runs.values():
        if batch and len(batch) + len(run) > size:
            batches.append(batch)
            batch = []
        batch.extend(run)
    if batch:
        batches.append(batch)
    for b in batches:
        in_claim_order(b)
    return batches


class KeyedRests:
    """The rests of keyed claims: per thread (or one for all, where claims are
    serialised), no keyed claim before when, and how long the last rest was."""

    def __init__(self, clock: Clock, *, shared: bool) -> None:
        self._clock = clock
        self._shared = shared
        self._rests: dict[int, tuple[float, float]] = {}

    def share(self, keyed: int, only: bool) -> tuple[int, bool]:
        """``(keyed, only)`` (:meth:`HostSubscriptions.keyed_share`) for this thread's
        claim: no keyed runs while its keyed claims rest, unless they are all there is."""
        rest = self._rests.get(self._slot(), (0.0, 0.0))
        resting = self._clock.monotonic() < rest[0]
        return (0, False) if keyed and not only and resting else (keyed, only)

    def after_claim(self, asked: int, only: bool, claims: list[Claim]) -> None:
        """After a claim that asked for keyed runs beside other entries: one that found
        none rests keyed claims for :data:`KEYED_REST_SECONDS`, twice as long after
        each such claim in a row up to :data:`KEYED_REST_MOST`; one that found some
        ends the rest."""
        if not asked or only:
            return
        slot, rests = self._slot(), self._rests
        if any(c.key is not None for c in claims):
            rests.pop(slot, None)
            return
        last = rests.get(slot, (0.0, 0.0))[1]
        rest = min(KEYED_REST_MOST, 2 * last) if last else KEYED_REST_SECONDS
        rests[slot] = (self._clock.monotonic() + rest, rest)

    def _slot(self) -> int:
        return 0 if self._shared else threading.get_ident()
