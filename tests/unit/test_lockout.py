"""The lock-out policy (:mod:`messagebox.console.lockout`), on a clock the test sets: a
minute's lock after five failures, doubling to a cap; loopback as one address and IPv6
by its /64; a global budget that stops address rotation but never locks out loopback
or an address that presented a right secret lately."""

from __future__ import annotations

import pytest

from messagebox.console.lockout import Lockout, Policy

POLICY = Policy(attempts=5, window=60.0, cap=900.0, budget=20)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def lockout(clock: Clock) -> Lockout:
    return Lockout(lambda: POLICY, clock)


def fail(lockout: Lockout, address: str, times: int) -> None:
    for _ in range(times):
        assert lockout.wait(address) == 0
        lockout.failed(address)


def test_five_failures_lock_an_address_out_for_a_minute(lockout: Lockout, clock: Clock) -> None:
    fail(lockout, "192.0.2.1", 4)
    assert lockout.wait("192.0.2.1") == 0

    lockout.failed("192.0.2.1")

    assert lockout.wait("192.0.2.1") == 60.0
    assert lockout.wait("192.0.2.2") == 0
    clock.now += 60
    assert lockout.wait("192.0.2.1") == 0


def test_each_further_lock_doubles_up_to_the_cap(lockout: Lockout, clock: Clock) -> None:
    locks = []
    for _ in range(7):
        fail(lockout, "192.0.2.1", 5)
        locks.append(lockout.wait("192.0.2.1"))
        clock.now += locks[-1]

    assert locks == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0, 900.0]


def test_an_address_quiet_long_enough_starts_again(lockout: Lockout, clock: Clock) -> None:
    fail(lockout, "192.0.2.1", 5)
    clock.now += 60 + 900  # the lock, then the cap without a failure

    fail(lockout, "192.0.2.1", 5)

    assert lockout.wait("192.0.2.1") == 60.0


def test_failures_older_than_the_window_age_out(lockout: Lockout, clock: Clock) -> None:
    fail(lockout, "192.0.2.1", 4)
    clock.now += 61

    fail(lockout, "192.0.2.1", 4)

    assert lockout.wait("192.0.2.1") == 0


def test_loopback_addresses_are_one_and_ipv6_counts_by_its_64(lockout: Lockout) -> None:
    for address in ("127.0.0.1", "127.0.0.2", "::1", "127.9.9.9", "::ffff:127.0.0.1"):
        lockout.failed(address)
    for i in range(5):
        lockout.failed(f"2001:db8:1:2::{i:x}")

    assert lockout.wait("127.0.0.1") > 0
    assert lockout.wait("2001:db8:1:2:ffff::1") > 0
    assert lockout.wait("2001:db8:1:3::1") == 0


def test_the_global_budget_stops_address_rotation(lockout: Lockout, clock: Clock) -> None:
    for i in range(20):  # one guess each from twenty addresses
        fail(lockout, f"198.51.100.{i}", 1)

    assert lockout.wait("203.0.113.1") > 0  # a fresh address is refused too
    assert lockout.wait("2001:db8::1") > 0
    clock.now += 60
    assert lockout.wait("203.0.113.1") == 0


def test_the_budget_never_locks_out_loopback_or_a_known_operator(
    lockout: Lockout, clock: Clock
) -> None:
    lockout.succeeded("203.0.113.50")  # presented a right secret
    for i in range(20):
        fail(lockout, f"198.51.100.{i}", 1)

    assert lockout.wait("127.0.0.1") == 0
    assert lockout.wait("::1") == 0
    assert lockout.wait("203.0.113.50") == 0
    assert lockout.wait("203.0.113.51") > 0


def test_an_unparsable_address_is_its_own_key(lockout: Lockout) -> None:
    fail(lockout, "testclient", 5)

    assert lockout.wait("testclient") > 0
    assert lockout.wait("127.0.0.1") == 0
