"""Host settings: defaults, and bad ones refused in one error naming each setting."""

from __future__ import annotations

import math
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
        ({"lease_seconds": 0}, "lease_seconds: input should be greater than or equal to 0.01"),
        ({"bogus": 1}, "'bogus' is not a setting (they are: dequeue_threads, claim_batch"),
        (
            {"heartbeat_seconds": 10, "dead_after_seconds": 5},
            "bad settings: dead_after_seconds must be longer than heartbeat_seconds",
        ),
        ({"claim_batch": 0, "bogus": 1}, "claim_batch: input should be greater than or equal"),
        (
            {"handler_timeout_seconds": -1},
            "handler_timeout_seconds: input should be greater than or equal to 0.01, not -1",
        ),
        (
            {"message_ttl_seconds": 0},
            "message_ttl_seconds: input should be greater than or equal to 0.01, not 0",
        ),
        (
            {"message_ttl_seconds": 366 * 86_400},
            "message_ttl_seconds: input should be less than or equal to 31536000",
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


FINITE_FLOAT_SETTINGS = [
    name for name, field in HostSettings.model_fields.items() if name.endswith("_seconds")
]


@pytest.mark.parametrize("name", FINITE_FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "Infinity", "NaN", 1e300])
def test_no_time_setting_takes_an_infinite_nan_or_huge_value(name: str, value: object) -> None:
    """Issue 55: ``lease_seconds=Infinity`` was stored as null and bricked the store;
    ``1e308`` made every PostgreSQL claim fail."""
    with pytest.raises(ValidationError, match=rf"bad settings: {name}: "):
        HostSettings.checked("host 'h'", {name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_attempts", 2**63 - 1),
        ("max_in_flight", 2**63 - 1),
        ("throttle_queue_depth", 2**63 - 1),
        ("dequeue_threads", 257),
        ("claim_batch", 10**9),
        ("dequeue_threads", True),  # not 1
        ("max_attempts", False),
    ],
)
def test_counts_are_bounded_and_not_bools(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"bad settings: {name}: "):
        HostSettings.checked("host 'h'", {name: value})


def test_every_bound_is_in_the_json_schema() -> None:
    """The routing file's JSON Schema says the bounds (and that times are finite)."""
    props = HostSettings.model_json_schema()["properties"]
    for name, field in HostSettings.model_fields.items():
        if field.annotation in (int, float, int | None, float | None):
            text = repr(props[name])
            assert "maximum" in text, (name, props[name])
            assert "minimum" in text, (name, props[name])


def test_the_default_handler_time_out_is_five_minutes() -> None:
    assert HostSettings().handler_timeout_seconds == 300.0


@pytest.mark.parametrize(
    ("stored", "settings", "said"),
    [
        ('{"lease_seconds": null, "dequeue_threads": 8}', {"dequeue_threads": 8}, "lease_seconds"),
        ('{"lease_seconds": 1e308}', {}, "less than or equal to 86400"),
        ('{"handler_timeout_seconds": Infinity}', {}, "handler_timeout_seconds"),
        ('{"bogus": 1, "claim_batch": 20}', {"claim_batch": 20}, "'bogus' is not a setting"),
        ('{"poll_min_seconds": 5}', {}, "poll_max_seconds must be at least poll_min_seconds"),
        ("not json", {}, "unreadable settings"),
    ],
)
def test_bad_stored_settings_read_as_defaults_and_say_so(
    stored: str, settings: dict[str, object], said: str
) -> None:
    """A store an older version wrote a bad value into still opens: that value is read
    as its default (the others as stored), and the problem is said."""
    got, repairs = HostSettings.from_stored(stored)
    assert got == HostSettings.model_validate(settings)
    assert any(said in r for r in repairs), repairs


def test_sound_stored_settings_have_nothing_to_say() -> None:
    assert HostSettings.from_stored(HostSettings().model_dump_json()) == (HostSettings(), ())


def test_a_host_ttl_is_none_by_default_and_at_most_a_year() -> None:
    assert HostSettings().message_ttl_seconds is None
    year = HostSettings.checked("host 'h'", {"message_ttl_seconds": 365 * 86_400})
    assert year.message_ttl_seconds == 365 * 86_400
    assert HostSettings.from_stored('{"message_ttl_seconds": null}') == (HostSettings(), ())
