"""A claimed batch's outcomes as a host instance records them (completed, failed, given
back), what recording them did, and what a thread asks a claim for
(:mod:`messagebox.delivery.consumer`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from messagebox.claims import Claim, Failure, Finished
from messagebox.models import HostSettings


@dataclass(frozen=True)
class Outcomes:
    """A claimed batch's outcomes, to record in one transaction: entries completed,
    failed, and claimed but never handed to a service (given back)."""

    done: Sequence[Claim]
    failed: Sequence[Failure]
    unstarted: Sequence[Claim]
    settings: HostSettings
    stop_on_failure: set[int]

    def __bool__(self) -> bool:
        return bool(self.done or self.failed or self.unstarted)

    @property
    def size(self) -> int:
        return len(self.done) + len(self.failed) + len(self.unstarted)


def merged(all_outcomes: list[Outcomes]) -> Outcomes | None:
    """Several batches' outcomes as one, to record in one transaction (None for none)."""
    if not all_outcomes:
        return None
    if len(all_outcomes) == 1:
        return all_outcomes[0]
    last = all_outcomes[-1]
    return Outcomes(
        [c for o in all_outcomes for c in o.done],
        [f for o in all_outcomes for f in o.failed],
        [c for o in all_outcomes for c in o.unstarted],
        last.settings,
        set().union(*(o.stop_on_failure for o in all_outcomes)),
    )


@dataclass(frozen=True)
class Recorded:
    """What recording a batch's outcomes did: the entries finished and given back."""

    finished: Finished
    given: int


class Keys(NamedTuple):
    """How many entries of keyed runs a claim takes: at most ``most`` (0: none), at most
    ``per_key`` of one key; and whether it takes only those."""

    most: int = 0
    per_key: int = 0
    only: bool = False
    """No other entry to claim (the host's subscriptions are all ordered by a property)."""


NO_KEYS = Keys()


@dataclass(frozen=True)
class ClaimAsk:
    """One thread's claim waiting for a transaction (see :meth:`Consumer.claim`)."""

    n: int
    instances: bool
    outcomes: Outcomes | None
    ordered: int = 0
    """The most entries of an ordered run this thread takes (0: none)."""
    keys: Keys = NO_KEYS
    """The keyed runs this thread takes."""
