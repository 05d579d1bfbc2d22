"""Typing traps at subscribe time, on both backends: a predicate that compares a
property with a type the stored messages never carry for it is warned about, by the
library (a log line), ``box.type_traps`` and the command line (a note)."""

from __future__ import annotations

import logging

import pytest

from messagebox import Message, MessageBox
from messagebox.predicates import P
from tests.cli_support import run_cli


@pytest.fixture
def zips(box: MessageBox) -> MessageBox:
    box.create_host("h")
    box.publish(
        [Message(b"x", promoted={"orders.Zip": 12345, "orders.Region": "EU"})],
        policy="drop",
    )
    box.publish([Message(b"x", promoted={"orders.Zip": 12345})])  # kept (suspended)
    return box


def test_subscribe_warns_of_a_type_the_stored_messages_never_carry(
    zips: MessageBox, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="messagebox.typecheck"):
        zips.subscribe("zip-text", host="h", filter=P("orders.Zip") == "12345")
    [record] = [r for r in caplog.records if r.name == "messagebox.typecheck"]
    assert getattr(record, "event", None) == "subscription-type-trap"
    assert "orders.Zip is compared with text ('12345')" in record.getMessage()
    assert "have it as a number" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="messagebox.typecheck"):
        zips.subscribe("zip-number", host="h", filter=P("orders.Zip") == 12345)
        zips.subscribe("new-prop", host="h", filter=P("orders.Never") == "x")  # unknown: fine
        zips.subscribe("in-mixed", host="h", filter=P("orders.Zip").in_([1, "2"]))
    messages = [r.getMessage() for r in caplog.records if r.name == "messagebox.typecheck"]
    assert len(messages) == 1
    assert "'in-mixed'" in messages[0]
    assert zips.type_traps({"a": P("orders.Zip") > 5, "b": P("orders.Zip").prefix("1")}) == [
        zips.type_traps({"b": P("orders.Zip").prefix("1")})[0]
    ]


def test_the_command_line_says_it_as_a_note(zips: MessageBox, backend_url: str) -> None:
    added = run_cli(
        [
            "--url",
            backend_url,
            "subscriptions",
            "add",
            "zip",
            "--host",
            "h",
            "--filter",
            'orders.Zip == "12345"',
        ]
    )
    assert added.returncode == 0, added.stderr
    assert added.stderr.count("warning: subscription 'zip': orders.Zip is compared with text") == 1
    changed = run_cli(
        [
            "--url",
            backend_url,
            "subscriptions",
            "set-filter",
            "zip",
            "--filter",
            "orders.Zip == 12345",
        ]
    )
    assert changed.returncode == 0, changed.stderr
    assert "warning" not in changed.stderr
    back = run_cli(
        [
            "--url",
            backend_url,
            "subscriptions",
            "set-filter",
            "zip",
            "--filter",
            'orders.Zip in ["1", "2"]',
        ]
    )
    assert back.returncode == 0, back.stderr
    assert "warning: subscription 'zip': orders.Zip is compared with text" in back.stderr
