"""Failed secrets, counted: the console's lock-out of addresses that guess.

Every secret the console checks counts — a login, a form's ``token`` field, an
``Authorization: Bearer`` header on a page or on the management API — for the address
it came from (the socket peer, or behind trusted proxies the client they name:
:mod:`messagebox.console.clients`). A locked-out address gets 429 with
``Retry-After``, its secret not even compared. The policy (:class:`Policy`):

- **Per address**: ``attempts`` failures within ``window`` seconds lock it out for
  ``window`` seconds; each further lock (its next ``attempts`` failures) lasts twice the
  last, up to ``cap``; quiet for ``cap`` after its lock, it starts again. All loopback
  addresses count as one; an IPv6 address counts as its /64 network (what one host gets).
- **Global budget**: all other addresses together get ``budget`` failures per
  ``window``; past it each of them is refused until the oldest failure ages out, so
  rotating addresses (over IPv6, or from many hosts) guesses no faster than that.
  Loopback is never refused by the budget, nor an address that presented a right secret
  in the last ``known`` seconds: an attacker elsewhere cannot lock the operator out of
  the console's own machine (or an SSH tunnel to it), nor out of a browser already in.

Someone on the console's own machine shares the loopback address with the operator and
can keep it locked out (one failure per lock, the locks capped at ``cap``); such a user
may anyway be able to stop the process. Behind a reverse proxy on the same machine
every client is loopback unless the proxy is named as trusted.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

LOOPBACK = "loopback"
"""The key every loopback address counts under."""


@dataclass(frozen=True)
class Policy:
    """How many failed secrets the console takes, and for how long it refuses after."""

    attempts: int = 5
    """Failures from one address within ``window`` that lock it out."""
    window: float = 60.0
    """Seconds: the span failures count in, and the first lock's length."""
    cap: float = 900.0
    """Seconds: the longest lock; also how long a locked address must stay quiet to
    start again."""
    budget: int = 100
    """Failures per ``window`` from every address but loopback and known ones together."""
    known: float = 8 * 3600.0
    """Seconds an address that presented a right secret is spared the global budget."""

    def lock_seconds(self, strikes: int) -> float:
        """The length of an address's ``strikes``-th lock."""
        return float(min(self.window * 2 ** min(strikes - 1, 32), self.cap))


@dataclass
class _Address:
    failures: list[float] = field(default_factory=list)
    """Since its last lock, within the window."""
    strikes: int = 0
    locked_at: float = 0.0
    last: float = 0.0

    def served(self, policy: Policy, now: float) -> bool:
        """Whether its last lock, and ``cap`` of quiet after it, are over."""
        return now - self.locked_at >= policy.lock_seconds(self.strikes) + policy.cap


def key(address: str) -> str:
    """What an address counts as: loopback as one, IPv6 as its /64, anything else as it
    is (an unparsable one as its text)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Lockout:
    """Failed and right secrets by address, and who must wait. ``policy`` is asked at
    each call (so a change applies at once); ``clock`` gives monotonic seconds."""

    SWEEP_ABOVE = 10_000
    """Addresses remembered before the quiet ones are forgotten."""

    def __init__(
        self,
        policy: Callable[[], Policy] = Policy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses: dict[str, _Address] = {}
        self._spent: deque[float] = deque()
        """When each failure of the global budget happened, oldest first."""
        self._known: dict[str, float] = {}

    def wait(self, address: str) -> float:
        """Seconds ``address`` must wait before a secret of its is checked (0: none)."""
        policy, now, who = self._policy(), self._clock(), key(address)
        with self._lock:
            found = self._addresses.get(who)
            if found is not None and found.strikes:
                left = found.locked_at + policy.lock_seconds(found.strikes) - now
                if left > 0:
                    return left
            if self._budgeted(who, policy, now):
                self._age(policy, now)
                if len(self._spent) >= policy.budget:
                    return max(self._spent[0] + policy.window - now, 0.001)
        return 0.0

    def failed(self, address: str) -> None:
        """Count a wrong secret from ``address``."""
        policy, now, who = self._policy(), self._clock(), key(address)
        with self._lock:
            found = self._addresses.get(who)
            if found is None or (found.strikes and found.served(policy, now)):
                found = self._addresses[who] = _Address()
            found.failures = [t for t in found.failures if now - t < policy.window] + [now]
            found.last = now
            if len(found.failures) >= policy.attempts:
                found.strikes += 1
                found.locked_at = now
                found.failures = []
            if self._budgeted(who, policy, now):
                self._spent.append(now)
            if len(self._addresses) > self.SWEEP_ABOVE:
                self._sweep(policy, now)

    def succeeded(self, address: str) -> None:
        """Note a right secret from ``address``: it is spared the global budget."""
        now, who = self._clock(), key(address)
        with self._lock:
            self._known[who] = now
            if len(self._known) > self.SWEEP_ABOVE:
                known = self._policy().known
                self._known = {k: t for k, t in self._known.items() if now - t < known}

    def _budgeted(self, who: str, policy: Policy, now: float) -> bool:
        """Whether ``who`` counts against the global budget."""
        if who == LOOPBACK:
            return False
        seen = self._known.get(who)
        return seen is None or now - seen >= policy.known

    def _age(self, policy: Policy, now: float) -> None:
        while self._spent and now - self._spent[0] >= policy.window:
            self._spent.popleft()

    def _sweep(self, policy: Policy, now: float) -> None:
        """Forget the addresses with nothing to remember: no lock running or to double,
        no failure in the window."""
        self._addresses = {
            who: found
            for who, found in self._addresses.items()
            if now - found.last < policy.window or (found.strikes and not found.served(policy, now))
        }
