"""``plan`` and ``apply`` run lint, on both backends: an error (a group or filter that can
never match, a property none of the newest stored messages carries) in a subscription
the file adds or whose filter it changes refuses the apply unless forced; warnings are
said; what is live and unchanged is warned about, not refused; ``apply --dry-run``
exits as ``plan`` does; plain ``lint`` names misspelt properties without a window."""

from __future__ import annotations

from pathlib import Path

import pytest

from messagebox import Message, MessageBox
from messagebox.config.routing_lint import DUPLICATE, NEVER, UNKNOWN_PROPERTY, UNSATISFIABLE
from messagebox.errors import ValidationError
from messagebox.predicates import P
from tests.cli_support import run_cli
from tests.conftest import table_counts

HEAD = "[hosts.shipping]\n"


def sub(name: str, filt: str, service: str | None = None) -> str:
    return (
        f"[[subscriptions]]\nname = '{name}'\nservice = '{service or name}'\n"
        f"host = 'shipping'\nfilter = '{filt}'\n"
    )


CONTRADICTION = HEAD + sub("both", 'orders.Region == "US" and orders.Region == "EU"')
TYPO = HEAD + sub("typo", 'orders.Regoin == "US"')
GOOD = HEAD + sub("eu", 'orders.Region == "EU"')


@pytest.fixture
def orders(box: MessageBox) -> MessageBox:
    """A store that has seen orders with a region and a total."""
    box.publish([Message(b"o", promoted={"orders.Region": "EU", "orders.Total": 5})])
    return box


def test_an_unsatisfiable_filter_is_refused_and_nothing_applied(orders: MessageBox) -> None:
    before = table_counts(orders)
    with pytest.raises(ValidationError, match="2 lint error") as refused:
        orders.apply(CONTRADICTION)
    assert "--force (Python: force=True)" in str(refused.value)
    assert "both, group 1: unsatisfiable-group" in str(refused.value)
    assert table_counts(orders) == before
    assert orders.versions() == []


def test_a_property_no_stored_message_carries_is_refused_naming_the_nearest(
    orders: MessageBox,
) -> None:
    with pytest.raises(ValidationError, match=r"did you mean 'orders\.Region'"):
        orders.apply(TYPO)
    assert orders.subscriptions() == []


def test_force_applies_it_and_says_what_it_was_forced_past(orders: MessageBox) -> None:
    applied = orders.apply(CONTRADICTION, force=True)
    assert applied.version is not None
    assert {f.kind for f in applied.lint.errors} == {UNSATISFIABLE, NEVER}
    assert [s.name for s in orders.subscriptions()] == ["both"]


def test_without_stored_messages_no_property_is_unknown(box: MessageBox) -> None:
    applied = box.apply(TYPO)
    assert applied.lint.errors == ()
    assert applied.lint.warnings == ()


def test_the_engines_properties_and_tests_of_absence_are_not_unknown(orders: MessageBox) -> None:
    text = HEAD + sub("errors", 'ErrorReport.ErrorType == "FailedMessage"')
    text += sub("local", 'orders.Region == "EU" and orders.Remote not_exists')
    text += sub("received", 'messagebox.ReceivePortName == "in"')
    assert orders.apply(text).lint.errors == ()


def test_what_is_live_and_unchanged_is_warned_about_not_refused(orders: MessageBox) -> None:
    # Given a subscription made with a group that can never match (subscribe only warns)
    orders.create_host("shipping")
    orders.subscribe(
        "both",
        host="shipping",
        filter=(P("orders.Region") == "US") & (P("orders.Region") == "EU"),
        name="both",
    )
    # When a file keeps it as it is and adds a good one
    applied = orders.apply(orders.export_config().text() + sub("eu", 'orders.Region == "EU"'))
    # Then it applies, warning about the old one
    assert applied.version is not None
    assert applied.lint.errors == ()
    assert {(f.subscription, f.kind) for f in applied.lint.warnings} >= {("both", NEVER)}


def test_a_duplicate_is_a_warning(orders: MessageBox) -> None:
    text = GOOD + sub("eu-again", 'orders.Region == "EU"', service="eu")
    applied = orders.apply(text)
    assert applied.lint.errors == ()
    assert [(f.subscription, f.kind) for f in applied.lint.warnings] == [("eu-again", DUPLICATE)]


def test_plan_shows_what_apply_would_refuse(orders: MessageBox) -> None:
    plan = orders.plan(TYPO, window=None)
    assert [f.kind for f in plan.lint.errors] == [UNKNOWN_PROPERTY]
    lines = plan.describe()
    assert any(line.startswith("! lint error: typo: unknown-property") for line in lines)
    assert "! apply refuses a file with lint errors unless --force (Python: force=True)" in lines
    assert plan.as_json()["lint"]["errors"][0]["kind"] == UNKNOWN_PROPERTY


def test_a_rollback_is_not_checked(orders: MessageBox) -> None:
    orders.apply(TYPO, force=True)
    orders.apply(GOOD)
    assert orders.rollback(1).version is not None
    assert [s.name for s in orders.subscriptions()] == ["typo"]


def test_plain_lint_names_a_misspelt_property_without_a_window(orders: MessageBox) -> None:
    [finding] = orders.lint(TYPO)
    assert finding.kind == UNKNOWN_PROPERTY
    assert "did you mean 'orders.Region'?" in finding.reason


def test_subscribe_warns_of_a_property_no_stored_message_carries(orders: MessageBox) -> None:
    orders.create_host("h")
    orders.subscribe("s", host="h", filter=P("orders.Totl") > 5)
    [finding] = orders.lint_subscriptions("s")
    assert (finding.kind, "did you mean 'orders.Total'?" in finding.reason) == (
        UNKNOWN_PROPERTY,
        True,
    )


def test_the_command_line_refuses_plans_and_forces_alike(backend_url: str, tmp_path: Path) -> None:
    env = {"MESSAGEBOX_URL": backend_url}
    assert run_cli(["init"], env=env).returncode == 0
    assert run_cli(["publish", "-p", "orders.Region=EU"], env=env).returncode == 0
    path = tmp_path / "routing.toml"
    path.write_text(CONTRADICTION)
    plan = run_cli(["plan", str(path)], env=env)
    dry = run_cli(["apply", "--dry-run", str(path)], env=env)
    assert plan.returncode == dry.returncode == 4
    for shown in (plan.stdout, dry.stdout):
        assert "! lint error: both, group 1: unsatisfiable-group" in shown
    refused = run_cli(["apply", str(path)], env=env)
    assert refused.returncode == 1
    assert "lint error" in refused.stderr
    assert "--force" in refused.stderr
    forced = run_cli(["apply", "--force", str(path)], env=env)
    assert forced.returncode == 0, forced.stderr
    assert "applied as version" in forced.stdout
    assert "warning: applied with --force: both, group 1: unsatisfiable-group" in forced.stderr
    again = run_cli(["apply", "--dry-run", str(path)], env=env)
    assert again.returncode == 0  # no change
    path.write_text(TYPO)
    lint = run_cli(["lint", str(path)], env=env)
    assert lint.returncode == 4
    assert "did you mean 'orders.Region'?" in lint.stdout
