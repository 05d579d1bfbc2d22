"""Resubmitting a suspended receive failure, on both backends: through the receive
location's pipeline (an edited body), refused again (nothing changes), or as it is
with changed properties (no location at hand); the entry goes in the transaction that
publishes it; only receive failures; from the command line, audited."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from messagebox import Message, MessageBox
from messagebox.adapters.http import HttpReceive
from messagebox.errors import PipelineError, UnknownSuspendedEntry, ValidationError
from messagebox.hosts import HostApp
from messagebox.hosts.ports import ReceiveLocation, running_location
from messagebox.models import RECEIVE_FAILURE
from messagebox.predicates import P
from tests.apps.orders_in import build
from tests.cli_support import run_cli
from tests.conftest import table_counts, wait_for
from tests.integration.test_ports import running

BAD = b"<Order><Region>EU</Region>"  # not well-formed
GOOD = b"<Order><Region>EU</Region></Order>"


def _location(app: HostApp) -> ReceiveLocation:
    [port] = app.receive_ports
    [loc] = port.locations
    return loc


@pytest.fixture
def refused(box: MessageBox, backend_url: str) -> tuple[HostApp, int]:
    """A receive failure: a malformed order posted to the app's location (its error
    report delivered); the app and the suspended entry's id."""
    app = build()
    with running(app, backend_url), httpx.Client(timeout=10) as client:
        loc = _location(app)
        assert running_location(box, "web", "orders") is loc  # found where it runs
        assert isinstance(loc.adapter, HttpReceive)
        answer = client.post(loc.adapter.address, content=BAD)
        assert answer.status_code == 422, answer.text
        [message_id] = answer.json()["suspended"]
        wait_for(lambda: not box.queue_depth(), "the error report delivered")
    assert running_location(box, "web", "orders") is None
    [entry] = box.suspended(message_id=message_id)
    assert entry.reason == RECEIVE_FAILURE
    return app, entry.id


def test_an_edited_body_goes_through_the_locations_pipeline(
    box: MessageBox, refused: tuple[HostApp, int]
) -> None:
    app, entry_id = refused
    old = box.suspended_entry(entry_id).message_id
    [routed] = box.resubmit(entry_id, body=GOOD, location=_location(app))
    assert routed.outcome == "routed"
    assert [s.name for s in box.subscriptions() if s.id in routed.subscriptions] == ["ship-eu"]
    stored = box.read_message(routed.message_id)
    assert stored.body == GOOD
    assert stored.promoted["orders.Region"] == "EU"  # promoted by the pipeline
    assert stored.promoted["messagebox.ReceiveLocationName"] == "orders"
    assert not [k for k in stored.promoted if k.startswith("ErrorReport.")]
    with pytest.raises(UnknownSuspendedEntry):
        box.suspended_entry(entry_id)
    assert box.references(old) == 0
    assert box.check() == []


def test_a_pipeline_that_refuses_it_again_changes_nothing(
    box: MessageBox, refused: tuple[HostApp, int]
) -> None:
    app, entry_id = refused
    before = table_counts(box)
    with pytest.raises(PipelineError, match="refuses the resubmitted input again"):
        box.resubmit(entry_id, location=_location(app))
    with pytest.raises(PipelineError):
        box.resubmit(entry_id, body=b"<Order/>", location=_location(app))  # no region
    assert table_counts(box) == before
    assert box.suspended_entry(entry_id).reason == RECEIVE_FAILURE


def test_without_a_location_it_is_published_as_it_is_with_the_given_properties(
    box: MessageBox, refused: tuple[HostApp, int]
) -> None:
    _, entry_id = refused
    [routed] = box.resubmit(entry_id, properties={"orders.Region": "EU"})
    stored = box.read_message(routed.message_id)
    assert stored.body == BAD  # its bytes, as stored
    assert stored.promoted["orders.Region"] == "EU"
    assert stored.promoted["messagebox.ReceivePortName"] == "web"  # kept from the input
    assert not [k for k in {**stored.promoted, **stored.written} if k.startswith("ErrorReport.")]
    assert [s.name for s in box.subscriptions() if s.id in routed.subscriptions] == ["ship-eu"]
    assert box.suspended() == []


def test_only_a_receive_failure_is_resubmitted(box: MessageBox) -> None:
    [failure] = box.publish([Message(b"x", promoted={"a.B": 1})])  # matches nothing
    [entry] = box.suspended(message_id=failure.message_id)
    with pytest.raises(ValidationError, match="not a receive-failure"):
        box.resubmit(entry.id)
    with pytest.raises(UnknownSuspendedEntry):
        box.resubmit(entry.id + 1000)


def test_the_command_line_resubmits_an_edited_body_through_the_app(
    backend_url: str, box: MessageBox, refused: tuple[HostApp, int], tmp_path: Path
) -> None:
    _, entry_id = refused
    fixed = tmp_path / "fixed.xml"
    fixed.write_bytes(GOOD)
    argv = ["--url", backend_url, "suspended", "resubmit", str(entry_id), "--body", str(fixed)]
    done = run_cli([*argv, "--app", "tests.apps.orders_in:app"])
    assert done.returncode == 0, done.stderr
    assert f"suspended entry {entry_id} resubmitted through receive location web/orders" in (
        done.stdout
    )
    assert box.suspended() == []
    assert "suspended resubmit" in [e.action for e in box.audit_log()]
    again = run_cli(argv)
    assert again.returncode == 3  # gone
    bad_app = run_cli([*argv, "--app", "tests.apps.nowhere:app"])
    assert bad_app.returncode == 2


def test_the_command_line_says_when_the_location_is_not_at_hand(
    backend_url: str, refused: tuple[HostApp, int]
) -> None:
    _, entry_id = refused
    done = run_cli(
        [
            "--url",
            backend_url,
            "--json",
            "suspended",
            "resubmit",
            str(entry_id),
            "-p",
            "orders.Region=EU",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert "receive location web/orders is not running here" in done.stderr
    assert '"location": null' in done.stdout


def test_the_failures_page_offers_no_resume_for_a_receive_failure(
    box: MessageBox, refused: tuple[HostApp, int]
) -> None:
    import re
    import warnings

    from starlette.exceptions import StarletteDeprecationWarning

    from messagebox.console import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StarletteDeprecationWarning)
        from starlette.testclient import TestClient

    box.create_host("billing")
    box.subscribe("bill", host="billing", filter=P("t.N") >= 0)
    box.publish([Message(b"x", promoted={"t.N": 1})])
    box.set_service_state("bill", "unenlisted")  # what waits is suspended, resumable
    page = TestClient(create_app(box, token="t"), base_url="http://127.0.0.1:8080").get("/failures")
    rows = {
        reason: row
        for row in re.findall(r'<tr id="group-[^"]+">(.*?)</tr>', page.text, re.S)
        for reason in re.findall(r"<td>([a-z-]+-(?:failure|unenlisted))</td>", row)
    }
    assert 'value="resume"' not in rows[RECEIVE_FAILURE]
    assert 'value="terminate"' in rows[RECEIVE_FAILURE]
    assert 'value="resume"' in rows["service-unenlisted"]
