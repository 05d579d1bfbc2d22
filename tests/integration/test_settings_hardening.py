"""Host settings that could break a store (issue 55, items 1 and 2), on both backends:
a non-finite or huge value is refused the same way from Python, the command line and a
routing file, storing nothing; a store that already holds one (written by an older
version) still opens, lists, exports and applies, and ``hosts set`` repairs it; the
longest lease allowed still claims on PostgreSQL."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from messagebox import Message, MessageBox
from messagebox.config.routing_file import RoutingFileError
from messagebox.errors import ValidationError
from messagebox.models import DAY, HostSettings
from messagebox.predicates import P
from messagebox.storage import schema as mb_schema
from tests.cli_support import run_cli
from tests.conftest import claim, table_counts


def _break(box: MessageBox, host: str, settings: str) -> None:
    """Store ``settings`` as an older version did (``lease_seconds=Infinity`` was
    written as ``null``)."""
    h = mb_schema.host
    with box.store.transaction() as conn:
        conn.execute(h.update().where(h.c.name == host).values(settings=settings))


@pytest.mark.parametrize(
    "options",
    [
        {"lease_seconds": math.inf},
        {"retry_backoff_seconds": float("inf")},
        {"poll_max_seconds": math.nan},
        {"dead_after_seconds": 1e300},
        {"max_attempts": 2**63 - 1},
        {"max_in_flight": 2**63 - 1},
        {"handler_timeout_seconds": 1e300},
        {"cleanup_interval_seconds": 1e300},
    ],
)
def test_python_refuses_a_non_finite_or_huge_setting(
    box: MessageBox, options: dict[str, Any]
) -> None:
    before = table_counts(box)
    with pytest.raises(ValidationError, match=f"host 'h1': bad settings: {next(iter(options))}"):
        box.create_host("h1", **options)
    box.create_host("h2")
    with pytest.raises(ValidationError, match="bad settings"):
        box.configure_host("h2", **options)
    assert box.host("h2").settings == HostSettings()
    assert table_counts(box) == {**before, "mb_host": before["mb_host"] + 1}


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e308", "9223372036854775807"])
def test_the_command_line_refuses_them_and_stores_nothing(backend_url: str, value: str) -> None:
    run_cli(["--url", backend_url, "init"])
    name = "max_attempts" if value.startswith("9") else "lease_seconds"
    done = run_cli(["--url", backend_url, "hosts", "add", "h1", "--set", f"{name}={value}"])
    assert done.returncode == 2, done  # bad usage
    assert f"bad settings: {name}: " in done.stderr
    assert "Traceback" not in done.stderr
    listed = run_cli(["--url", backend_url, "--json", "hosts", "list"])
    assert listed.returncode == 0
    assert listed.stdout.strip() == "[]"


def test_a_routing_file_with_an_infinite_setting_applies_nothing(
    box: MessageBox, tmp_path: Path
) -> None:
    path = tmp_path / "routing.toml"
    path.write_text("[hosts.h1]\nlease_seconds = inf\n")
    before = table_counts(box)
    with pytest.raises(RoutingFileError, match="lease_seconds"):
        box.apply(path)
    assert table_counts(box) == before


def test_a_store_holding_a_bad_setting_opens_lists_and_is_repaired(backend_url: str) -> None:
    with MessageBox(backend_url) as box:
        box.create_host("h1", dequeue_threads=8)
        box.subscribe("svc", host="h1", filter=P("t.N") >= 0, name="all")
        _break(box, "h1", '{"dequeue_threads": 8, "lease_seconds": null}')
        [host] = box.hosts()
        assert host.settings == HostSettings(dequeue_threads=8)  # the rest as stored
        assert host.repairs
        assert "lease_seconds" in host.repairs[0]
        [stats] = box.host_stats()
        assert stats.repairs == host.repairs
        exported = box.export_config()  # export, and apply what it gives
        assert exported.hosts["h1"] == HostSettings(dequeue_threads=8)
        box.apply(exported.text())
        box.publish([Message(b"x", promoted={"t.N": 1})])  # it still routes and claims
        assert len(claim(box, "h1", n=1)) == 1
    listed = run_cli(["--url", backend_url, "hosts", "list"])
    assert listed.returncode == 0, listed
    assert "host 'h1' stored a bad setting: lease_seconds" in listed.stderr
    assert "messagebox hosts set h1 --set" in listed.stderr
    fixed = run_cli(["--url", backend_url, "hosts", "set", "h1", "--set", "lease_seconds=90"])
    assert fixed.returncode == 0, fixed
    with MessageBox(backend_url) as box:
        [host] = box.hosts()
        assert host.repairs == ()
        assert host.settings == HostSettings(dequeue_threads=8, lease_seconds=90)
    assert "bad setting" not in run_cli(["--url", backend_url, "hosts", "list"]).stderr


def test_the_longest_lease_allowed_still_claims(backend_url: str) -> None:
    """``lease_seconds=1e308`` made every claim fail on PostgreSQL (timestamp out of
    range); the bound is one that the database's clock arithmetic takes."""
    with MessageBox(backend_url) as box:
        box.create_host("h1", lease_seconds=DAY, dead_after_seconds=DAY)
        box.subscribe("svc", host="h1", filter=P("t.N") >= 0, name="all")
        box.publish([Message(b"x", promoted={"t.N": 1})])
        assert len(claim(box, "h1", n=1, lease_seconds=DAY)) == 1


def test_a_bad_stored_setting_does_not_stop_a_host_instance(box: MessageBox) -> None:
    from messagebox.hosts import HostInstance

    box.create_host("h1")
    _break(box, "h1", '{"retry_backoff_seconds": null, "poll_max_seconds": 1e308}')
    inst = HostInstance(box, "h1", {})
    assert inst.settings == HostSettings()
    with box.store.transaction() as conn:  # nothing was written back by reading
        stored = conn.execute(sa.select(mb_schema.host.c.settings)).scalar_one()
    assert "null" in stored


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e308", "true"])
def test_the_console_refuses_them_and_repairs_a_bad_stored_one(box: MessageBox, value: str) -> None:
    import warnings

    from messagebox.console import create_app
    from tests.console_support import login

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    box.create_host("h1")
    _break(box, "h1", '{"lease_seconds": null}')
    client = TestClient(create_app(box, token="t"), base_url="http://127.0.0.1:8080")
    client.follow_redirects = False
    page = client.get("/")
    assert page.status_code == 200
    assert "bad stored setting: lease_seconds" in page.text
    csrf = login(client, box, "ada", "admin", page="/")  # a host's settings need an admin
    refused = client.post(
        "/hosts/settings",
        data={"host": "h1", "settings": f"heartbeat_seconds={value}", "csrf": csrf},
    )
    assert refused.status_code == 400
    assert "heartbeat_seconds" in refused.text
    fixed = client.post(
        "/hosts/settings", data={"host": "h1", "settings": "lease_seconds=45", "csrf": csrf}
    )
    assert fixed.status_code == 303, fixed.text
    assert box.host("h1").repairs == ()
    assert box.host("h1").settings.lease_seconds == 45
