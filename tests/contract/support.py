"""What the contract scenarios share: short calls of the port and of the set-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from messagebox.claims import Claim, Failure
from messagebox.message import Message
from messagebox.models import HostSettings
from messagebox.outcomes import Outcomes
from messagebox.port import HostStore
from messagebox.predicates import P
from tests.contract.conftest import Harness

LONG = 30.0
"""A lease, back-off or delay that does not end during a test."""
SHORT = 0.5
"""One that ends soon (real backends wait for it)."""


def claim(port: HostStore, n: int = 10, lease: float = LONG, **options: Any) -> list[Claim]:
    options.setdefault("ordered", False)
    options.setdefault("instances", False)
    claims, _ = port.claim(n, lease, **options)
    return claims


def outcomes(
    done: Sequence[Claim] = (),
    failed: Sequence[Failure] = (),
    unstarted: Sequence[Claim] = (),
    stop: Sequence[int] = (),
    **settings: Any,
) -> Outcomes:
    return Outcomes(list(done), list(failed), list(unstarted), HostSettings(**settings), set(stop))


def messages(*keys: object, **extra: Any) -> list[Message]:
    """One message a key, ``a.K`` promoted (left out for ``None``)."""
    return [Message(b"x", promoted={} if k is None else {"a.K": k}, **extra) for k in keys]


def catch_all(store: Harness, **options: Any) -> int:
    """A subscription of host ``h`` to every message with ``a.K``; its id."""
    return store.subscribe("s", host="h", filter=P("a.K").exists(), **options).id
