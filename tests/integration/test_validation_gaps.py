"""Input that used to fail with a raw Python or driver error (issue 18, D8) is refused
with a messagebox error that names the culprit, on every backend, and stores nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from messagebox import (
    FilterValidationError,
    Message,
    MessageBox,
    MessageValidationError,
    UnknownHost,
    ValidationError,
)
from messagebox.cli import EXIT_USAGE
from messagebox.predicates import MAX_NESTING, P, parse_filter, to_filter
from tests.conftest import table_counts

ROOT = Path(__file__).resolve().parents[2]
EAST = timezone(timedelta(hours=5))
WEST = timezone(timedelta(hours=-5))


@pytest.fixture
def ready(box: MessageBox) -> MessageBox:
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("a.X").exists())
    return box


def nested_text(depth: int) -> str:
    return "(" * depth + "a.X == 1" + ")" * depth


# --- 1. a datetime that leaves the datetime range when moved to UTC ---


@pytest.mark.parametrize("kind", ["promoted", "written"])
@pytest.mark.parametrize(
    "when", [datetime(1, 1, 1, tzinfo=EAST), datetime(9999, 12, 31, 23, tzinfo=WEST)]
)
def test_a_datetime_out_of_range_in_utc_is_refused_naming_the_property(
    kind: str, when: datetime
) -> None:
    with pytest.raises(MessageValidationError, match=r"'a\.When'.*out of range in UTC"):
        Message(b"x", **{kind: {"a.When": when}})  # type: ignore[arg-type]


def test_a_filter_datetime_out_of_range_in_utc_is_refused(ready: MessageBox) -> None:
    before = table_counts(ready)
    with pytest.raises(FilterValidationError, match=r"a\.When.*out of range in UTC"):
        ready.subscribe("bad", host="h", filter=P("a.When") >= datetime(1, 1, 1, tzinfo=EAST))
    with pytest.raises(FilterValidationError, match="out of range in UTC"):
        parse_filter('a.When >= datetime("0001-01-01T00:00:00+05:00")')
    assert table_counts(ready) == before


# --- 2. a str part that has no UTF-8 encoding ---


@pytest.mark.parametrize(
    ("make", "culprit"),
    [
        (lambda: Message("\ud800"), "part 'body'"),
        (lambda: Message(parts={"head": b"ok", "tail": "ab\udfffc"}), "part 'tail'"),
        (lambda: Message("x", body_part="main\ud800"), "part name 'main\\\\ud800'"),
    ],
)
def test_text_with_a_lone_surrogate_is_refused_naming_the_part(
    ready: MessageBox, make: Any, culprit: str
) -> None:
    before = table_counts(ready)
    with pytest.raises(MessageValidationError, match=rf"{culprit}.*lone surrogate"):
        ready.publish([make()])
    assert table_counts(ready) == before


# --- 3. an unknown routing policy ---


def test_an_unknown_routing_policy_is_refused_listing_the_policies(ready: MessageBox) -> None:
    before = table_counts(ready)
    with pytest.raises(
        ValidationError, match=r"routing policy 'bogus'.*one of suspend, drop, raise"
    ):
        ready.publish([Message(b"x", promoted={"a.X": 1})], policy="bogus")
    assert table_counts(ready) == before


# --- 4. NUL characters in names ---


@pytest.mark.parametrize(
    ("act", "culprit"),
    [
        (lambda b: b.create_host("a\x00b"), "host name 'a\\\\x00b'"),
        (lambda b: b.subscribe("s\x00", host="h", filter=P("a.X") == 1), "service name"),
        (lambda b: b.subscribe("s", host="h\x00", filter=P("a.X") == 1), "host name"),
        (lambda b: b.subscribe("s", name="n\x00", host="h", filter=P("a.X") == 1), "subscription"),
        (
            lambda b: b.subscribe(
                "s", host="h", kind="instance", instance_id="i\x00", filter=P("a.X") == 1
            ),
            "instance_id",
        ),
        (lambda b: b.publish([Message(parts={"p\x00": b"x"})]), "part name 'p\\\\x00'"),
    ],
)
def test_a_nul_in_a_name_is_refused_naming_the_field(
    ready: MessageBox, act: Any, culprit: str
) -> None:
    before = table_counts(ready)
    with pytest.raises(ValidationError, match=rf"{culprit}.*NUL"):
        act(ready)
    assert table_counts(ready) == before
    assert [h.name for h in ready.hosts()] == ["h"]


def test_a_lone_surrogate_in_a_name_is_refused_naming_the_field(ready: MessageBox) -> None:
    before = table_counts(ready)
    with pytest.raises(ValidationError, match=r"host name .*lone surrogate"):
        ready.create_host("h\ud800")
    assert table_counts(ready) == before


# --- 5. filters nested too deep ---


def test_filter_text_nested_too_deep_is_refused() -> None:
    assert parse_filter(nested_text(MAX_NESTING)) == to_filter(P("a.X") == 1)
    with pytest.raises(
        FilterValidationError, match=f"column {MAX_NESTING + 1}: .*nested more than {MAX_NESTING}"
    ):
        parse_filter(nested_text(MAX_NESTING + 1))
    with pytest.raises(FilterValidationError, match="nested more than"):
        parse_filter(nested_text(400))


def test_a_python_filter_nested_too_deep_is_refused() -> None:
    expr: Any = P("a.X") == 0
    for i in range(1, 1200):  # alternating | and &, so nothing flattens
        expr = (expr | (P("a.X") == i)) if i % 2 else (expr & (P("a.Y") == i))
    with pytest.raises(FilterValidationError, match=f"nested more than {MAX_NESTING} levels"):
        to_filter(expr)


def test_the_cli_refuses_a_filter_nested_too_deep_with_exit_code_2(ready: MessageBox) -> None:
    before = table_counts(ready)
    url = ready.url.render_as_string(hide_password=False)
    command = ["subscriptions", "add", "deep", "--host", "h", "--filter", nested_text(400)]
    result = subprocess.run(
        [sys.executable, "-m", "messagebox.cli", "--url", url, *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (result.returncode, result.stdout) == (EXIT_USAGE, ""), result.stderr[-2000:]
    assert f"nested more than {MAX_NESTING} levels deep" in result.stderr
    assert "Traceback" not in result.stderr
    assert table_counts(ready) == before


# --- 6. listings by an unknown host ---


@pytest.mark.parametrize(
    "listing",
    [
        lambda b: b.queue_stats("nope"),
        lambda b: b.suspended(host="nope"),
        lambda b: b.queue_depth("nope"),
        lambda b: b.instances("nope"),
    ],
)
def test_a_listing_by_an_unknown_host_raises_unknown_host(ready: MessageBox, listing: Any) -> None:
    with pytest.raises(UnknownHost, match="no host named 'nope'"):
        listing(ready)


def test_a_listing_by_a_known_host_without_entries_is_empty(ready: MessageBox) -> None:
    assert ready.queue_stats("h") == []
    assert ready.suspended(host="h") == []
    assert ready.queue_depth("h") == []
    assert ready.instances("h") == []


@pytest.mark.parametrize("chunk", [0, -1, 1.5, "10"])
def test_reading_the_spool_in_chunks_refuses_a_bad_chunk(box: MessageBox, chunk: object) -> None:
    with pytest.raises(ValidationError, match="chunk must be a positive int"):
        box.iter_promoted(chunk)  # type: ignore[arg-type]
