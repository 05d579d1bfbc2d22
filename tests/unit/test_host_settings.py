"""Host settings: defaults, and bad ones refused in one error naming each setting."""

from __future__ import annotations

import re

import pytest

from messagebox.errors import ValidationError
from messagebox.models import PREFETCH_BATCHES, HostSettings


def test_no_values_give_the_defaults() -> None:
    assert HostSettings.checked("host 'h'", {}) == HostSettings()


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"max_attempts": "abc"}, "host 'h': bad settings: max_attempts: input should be a valid"),
        ({"lease_seconds": 0}, "lease_seconds: input should be greater than 0, not 0"),
        ({"bogus": 1}, "'bogus' is not a setting (they are: dequeue_threads, claim_batch"),
        (
            {"heartbeat_seconds": 10, "dead_after_seconds": 5},
            "bad settings: dead_after_seconds must be longer than heartbeat_seconds",
        ),
        ({"claim_batch": 0, "bogus": 1}, "claim_batch: input should be greater than or equal"),
        (
            {"handler_timeout_seconds": -1},
            "handler_timeout_seconds: input should be greater than 0, not -1",
        ),
    ],
)
def test_bad_settings_are_one_error_naming_each(values: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(says)):
        HostSettings.checked("host 'h'", values)


@pytest.mark.parametrize(
    ("values", "in_flight"),
    [
        ({}, 100),  # 4 threads of 10: at least 100
        ({"dequeue_threads": 4, "claim_batch": 50}, 200),  # a batch for every thread
        ({"dequeue_threads": 1, "claim_batch": 500}, 500),
        ({"dequeue_threads": 4, "claim_batch": 50, "max_in_flight": 60}, 60),  # as set
    ],
)
def test_max_in_flight_defaults_to_a_batch_for_every_thread(
    values: dict[str, object], in_flight: int
) -> None:
    assert HostSettings.checked("host 'h'", values).in_flight() == in_flight


@pytest.mark.parametrize(
    ("values", "in_flight"),
    [
        ({}, 640),  # 4 threads of 10, sixteen batches each
        ({"dequeue_threads": 1, "claim_batch": 5}, 100),  # at least 100
        ({"dequeue_threads": 4, "claim_batch": 50}, 3200),
        ({"dequeue_threads": 4, "claim_batch": 50, "max_in_flight": 60}, 60),  # as set
    ],
)
def test_where_claims_are_serialised_max_in_flight_defaults_to_sixteen_batches_a_thread(
    values: dict[str, object], in_flight: int
) -> None:
    settings = HostSettings.checked("host 'h'", values)
    assert PREFETCH_BATCHES == 16
    assert settings.in_flight(ahead=True) == in_flight
