"""Guards of routing as code, on both backends: a routing file that declares nothing, or
no subscription while some are live, is refused by apply (plan says so) unless the
operator means it (``--allow-empty``, ``allow_empty=True``); and names an old store
holds with escape sequences come out escaped on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from messagebox import MessageBox
from messagebox.errors import ValidationError
from messagebox.models import HostSettings
from messagebox.predicates import P
from messagebox.storage import store_clock, subscriptions
from tests.cli_support import run_cli
from tests.conftest import table_counts

LIVE = """
[hosts.shipping]

[[subscriptions]]
name = "ship-eu"
service = "ship"
host = "shipping"
filter = 'orders.Region == "EU"'
"""

NOTHING = ["", "   \n\n\t\n", "# exported on Monday\n\n# (it failed)\n", "\ufeff"]


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    box.apply(LIVE)
    return box


@pytest.mark.parametrize("text", NOTHING, ids=["empty", "blank", "comments", "bom"])
def test_a_file_that_declares_nothing_is_refused(shop: MessageBox, text: str) -> None:
    before = table_counts(shop)
    versions = shop.versions()
    with pytest.raises(ValidationError, match="declares no host, service or subscription"):
        shop.apply(text)
    assert table_counts(shop) == before
    assert shop.versions() == versions


def test_a_file_that_declares_nothing_is_refused_on_an_empty_store_too(box: MessageBox) -> None:
    with pytest.raises(ValidationError, match="--allow-empty"):
        box.apply("")


def test_a_file_that_declares_nothing_is_applied_when_asked(shop: MessageBox) -> None:
    applied = shop.apply("", allow_empty=True)
    assert applied.version is not None
    assert shop.subscriptions() == []
    assert shop.hosts() == []


def test_a_file_that_would_remove_every_subscription_is_refused(shop: MessageBox) -> None:
    # Given a file cut short after its hosts (an export that failed half way)
    cut = LIVE.split("[[subscriptions]]")[0]
    before = table_counts(shop)
    with pytest.raises(ValidationError, match=r"remove all 1 live subscription\(s\) \(ship-eu\)"):
        shop.apply(cut)
    assert table_counts(shop) == before
    shop.apply(cut, allow_empty=True)
    assert shop.subscriptions() == []
    assert [h.name for h in shop.hosts()] == ["shipping"]


def test_hosts_alone_are_applied_while_no_subscription_is_live(box: MessageBox) -> None:
    assert box.apply("[hosts.a]\n").version == 1


def test_plan_says_an_empty_file_would_be_refused(shop: MessageBox) -> None:
    plan = shop.plan("", window=None)
    [blocker] = plan.blockers
    assert "declares no host, service or subscription" in blocker
    assert f"! {blocker}" in plan.describe()


def test_a_rollback_is_not_guarded(box: MessageBox) -> None:
    # Given a first version that had only a host, then a subscription applied
    box.create_host("shipping")
    box.apply(LIVE)
    # When rolled back to it: the operator named that version
    box.rollback(1)
    assert box.subscriptions() == []


def test_the_command_line_refuses_an_empty_file_unless_allowed(
    backend_url: str, tmp_path: Path
) -> None:
    env = {"MESSAGEBOX_URL": backend_url}
    assert run_cli(["init"], env=env).returncode == 0
    path = tmp_path / "routing.toml"
    path.write_text(LIVE)
    assert run_cli(["apply", str(path)], env=env).returncode == 0
    path.write_text("")  # `messagebox export > routing.toml` failed
    plan = run_cli(["plan", "--no-traffic", str(path)], env=env)
    assert plan.returncode == 4
    assert "! " in plan.stdout
    assert "--allow-empty" in plan.stdout
    refused = run_cli(["apply", str(path)], env=env)
    assert refused.returncode == 1
    assert "declares no host, service or subscription" in refused.stderr
    with MessageBox(backend_url) as box:
        assert [s.name for s in box.subscriptions()] == ["ship-eu"]
    allowed = run_cli(["apply", "--allow-empty", str(path)], env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert "- subscription ship-eu" in allowed.stdout
    with MessageBox(backend_url) as box:
        assert box.subscriptions() == []


def test_hosts_list_escapes_a_stored_name_with_escape_sequences(backend_url: str) -> None:
    # Given names an old store accepted (written below the API's checks)
    hostile = "evil\x1b]0;owned\x07\x1b[2J"
    with MessageBox(backend_url) as box:
        with box.store.transaction(serial=True) as conn:
            subscriptions.create_host(conn, hostile, HostSettings(), store_clock.now(conn))
        box.create_host("h")
        box.subscribe("svc", host="h", filter=P("a.B") == 1, name="plain")
    # When the hosts are listed
    listed = run_cli(["hosts", "list"], env={"MESSAGEBOX_URL": backend_url})
    # Then the name is shown escaped, and no escape character reaches the terminal
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout
    assert "\x07" not in listed.stdout
    assert "evil\\x1b]0;owned\\x07\\x1b[2J" in listed.stdout
