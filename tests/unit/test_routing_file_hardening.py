"""Routing files and the other files the command line reads, against hostile or broken
input: a byte-order mark, nesting too deep to parse, files too large, not regular
(``/dev/zero``, a FIFO, a directory) or not UTF-8, and names that would carry escape
sequences or markup to a terminal or a page."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from messagebox.config.routing_file import MAX_FILE_BYTES, RoutingFileError, load, read
from messagebox.errors import ValidationError
from messagebox.specs import check_name
from tests.cli_support import run_cli

ONE = '[hosts.h]\n[[subscriptions]]\nservice = "s"\nhost = "h"\nfilter = "a.b == 1"\n'


# --- the text ---------------------------------------------------------------------------


def test_a_byte_order_mark_is_skipped() -> None:
    config = load("\ufeff" + ONE, "f.toml")
    assert list(config.hosts) == ["h"]
    assert list(config.subscriptions) == ["s"]


def test_a_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "routing.toml"
    path.write_bytes(b"\xef\xbb\xbf" + ONE.encode())
    assert list(load(read(path), str(path)).subscriptions) == ["s"]


@pytest.mark.parametrize(
    "value",
    [
        "[" * 10_000 + "]" * 10_000,
        "{ a = " * 10_000 + "1" + " }" * 10_000,
        "[{ a = " * 5_000 + "1" + " }]" * 5_000,
    ],
    ids=["arrays", "inline tables", "both"],
)
def test_nesting_too_deep_to_parse_is_refused_naming_file_and_line(value: str) -> None:
    text = ONE + f"correlation = {value}\n"
    with pytest.raises(RoutingFileError) as caught:
        load(text, "f.toml")
    said = str(caught.value)
    assert said.startswith("f.toml:6: ")
    assert "nested" in said
    assert len(said) < 300, said


# --- reading a file ---------------------------------------------------------------------


def test_a_file_past_the_limit_is_refused_naming_it_and_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(RoutingFileError) as caught:
        read(path)
    said = str(caught.value)
    assert str(path) in said
    assert "16 MiB" in said


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "full.toml"
    path.write_bytes(b"#" * MAX_FILE_BYTES)
    assert len(read(path)) == MAX_FILE_BYTES


def test_dev_zero_is_refused_without_reading_it() -> None:
    with pytest.raises(RoutingFileError, match=r"'/dev/zero'.*not a regular file"):
        read(Path("/dev/zero"))


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            read(fifo)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    reader = threading.Thread(target=attempt, daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():  # unblock it: open the FIFO for writing, then fail
        with open(fifo, "wb"):
            pass
        reader.join(timeout=5)
        pytest.fail("reading a FIFO blocked, waiting for a writer")
    [error] = outcome
    assert isinstance(error, RoutingFileError)
    assert "not a regular file (a FIFO)" in str(error)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RoutingFileError, match=r"is a directory"):
        read(tmp_path)


def test_binary_content_is_refused_naming_the_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"[hosts.h]\n\xff\xfe")
    with pytest.raises(RoutingFileError) as caught:
        read(path)
    said = str(caught.value)
    assert str(path) in said
    assert "not UTF-8" in said
    assert "byte 10" in said


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RoutingFileError, match=r"missing\.toml"):
        read(tmp_path / "missing.toml")


# --- the command line: apply, --filter @FILE, --properties-json @FILE ---------------------


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"duckdb:///{tmp_path / 'box.duckdb'}"


@pytest.mark.timeout(60)
def test_apply_of_dev_zero_is_a_usage_error(url: str) -> None:
    done = run_cli(["--url", url, "apply", "/dev/zero"])
    assert done.returncode == 2
    assert "'/dev/zero'" in done.stderr
    assert "not a regular file" in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv",
    [
        ["subscriptions", "add", "s", "--host", "h", "--filter", "@{}"],
        ["route", "explain", "--properties-json", "@{}"],
    ],
    ids=["--filter", "--properties-json"],
)
def test_an_at_file_option_is_bounded_and_regular(
    url: str, tmp_path: Path, argv: list[str]
) -> None:
    big = tmp_path / "big.txt"
    big.write_bytes(b" " * (MAX_FILE_BYTES + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for culprit, said in (
        (big, "16 MiB"),
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
    ):
        done = run_cli(["--url", url, *(a.format(culprit) for a in argv)])
        assert done.returncode == 2, done.stderr
        assert str(culprit) in done.stderr
        assert said in done.stderr


def test_properties_json_nested_too_deep_is_a_usage_error(url: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    done = run_cli(["--url", url, "route", "explain", "--properties-json", '{"a.b": ' + deep + "}"])
    assert done.returncode == 2, done.stderr
    assert "--properties-json" in done.stderr
    assert "nested" in done.stderr


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "evil\x1b[2J",
        "bell\x07",
        "c1\x9b31m",
        "rtl\u202eexe",
        "zero\u200bwidth",
        "line\u2028break",
        "para\u2029break",
        "private\ue000",
        "unassigned\U000e0080",
        "<script>",
        "a&b",
        'say "hi"',
        "it's",
        "back`tick",
        " leading",
        "trailing ",
        "trailing\t",
    ],
)
def test_a_name_with_control_characters_markup_or_edge_spaces_is_refused(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_name("host", name)
    assert "\x1b" not in str(caught.value)  # the name is shown escaped


@pytest.mark.parametrize("name", ["ship-eu", "zürich", "a b", "orders.v2", "東京", "ship_2/eu"])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert check_name("host", name) == name


@pytest.mark.parametrize(
    ("text", "where", "said"),
    [
        ('[hosts."evil\\u001b[2J"]\n', "f.toml:1: hosts.", r"host name 'evil\x1b[2J'"),
        (
            ONE.replace('service = "s"', 'service = "a<b"'),
            "f.toml:3: subscriptions[0].service: ",
            "service name 'a<b'",
        ),
        (
            ONE + 'name = "x\\u202e"\n',
            "f.toml:6: subscriptions[0].name: ",
            r"subscription name 'x\u202e'",
        ),
    ],
    ids=["host", "service", "subscription"],
)
def test_a_routing_file_name_goes_through_the_same_rule(text: str, where: str, said: str) -> None:
    with pytest.raises(RoutingFileError) as caught:
        load(text, "f.toml")
    message = str(caught.value)
    assert message.startswith(where), message
    assert said in message
    assert "\x1b" not in message  # shown escaped, not raw
    assert "\u202e" not in message
