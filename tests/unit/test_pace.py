"""A host instance's pace (hosts/dispatch.py, ``Pace``): the entries its threads
finished lately, per second, which bounds how far it claims ahead on DuckDB."""

from __future__ import annotations

import time

import pytest

from messagebox.hosts.dispatch import Pace


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


def test_a_new_pace_is_zero(clock: _Clock) -> None:
    assert Pace(window=1.0).per_second() == 0.0


def test_a_young_instance_is_paced_over_its_life_so_far(clock: _Clock) -> None:
    # Given an instance half a second old that finished 100 entries
    pace = Pace(window=1.0)
    clock.now += 0.5
    pace.add(100)
    # Then its pace is 200 a second, not 100
    assert pace.per_second() == pytest.approx(200.0)


def test_only_the_last_window_counts(clock: _Clock) -> None:
    # Given 300 entries finished at once, then 50 a second and a half later
    pace = Pace(window=1.0)
    clock.now += 1.0
    pace.add(300)
    clock.now += 1.5
    pace.add(50)
    # Then the pace is over the last second: the 50 only
    assert pace.per_second() == pytest.approx(50.0)
    # and with nothing more finished, it falls to zero
    clock.now += 1.1
    assert pace.per_second() == 0.0


def test_beginning_again_forgets_what_was_finished_before(clock: _Clock) -> None:
    # Given a pace made long before its instance starts, with entries finished
    pace = Pace(window=1.0)
    pace.add(500)
    clock.now += 10.0
    # When it begins (the instance starts) and 50 finish in its first half second
    pace.begin()
    clock.now += 0.5
    pace.add(50)
    # Then the pace is 100 a second: over the half second since it began
    assert pace.per_second() == pytest.approx(100.0)
