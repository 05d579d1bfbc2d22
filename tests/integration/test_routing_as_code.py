"""Routing as code on both backends: export → apply round trip, plan (diff and traffic),
apply in place or by replacement, host changes, versions and rollback, bad input that
applies nothing, lint against traffic, and an apply racing four publishers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from messagebox import Message, MessageBox
from messagebox.config.routing_file import RoutingFileError, load
from messagebox.config.routing_lint import DEAD, UNKNOWN_PROPERTY
from messagebox.errors import Conflict, NotFound, ValidationError
from messagebox.models import SUBSCRIPTION_REMOVED, State
from messagebox.predicates import P
from tests.cli_support import run_cli
from tests.conftest import table_counts

SHOP = """
[hosts.shipping]
dequeue_threads = 2

[hosts.billing]

[services.bill]
state = "stopped"

[[subscriptions]]
name = "ship-eu"
service = "ship"
host = "shipping"
filter = 'orders.Region == "EU"'
priority = 5

[[subscriptions]]
name = "ship-us"
service = "ship"
host = "shipping"
filter = 'orders.Region == "US" and orders.Total >= 100'
ordered = true
on_failure = "stop"

[[subscriptions]]
name = "bill"
service = "bill"
host = "billing"
filter = 'orders.Total > 0 or orders.Free exists'

[[subscriptions]]
name = "bill-audit"
service = "bill"
host = "billing"
filter = 'orders.Audit == true'
state = "unenlisted"

[[subscriptions]]
name = "flow"
service = "flow"
host = "billing"
kind = "instance"
correlation = ["orders.Id"]
filter = 'orders.Step exists'
"""


def _shape(box: MessageBox) -> list[tuple[object, ...]]:
    return [
        (
            s.name,
            s.service,
            s.host,
            str(s.filter),
            s.kind,
            s.priority,
            s.state,
            s.ordered,
            s.on_failure,
            s.correlation,
        )
        for s in sorted(box.subscriptions(), key=lambda s: s.name)
    ]


def test_export_then_apply_on_an_empty_store_reproduces_it(box: MessageBox, tmp_path: Path) -> None:
    box.apply(SHOP)
    text = box.export_config().text()
    with MessageBox(f"duckdb:///{tmp_path / 'other.duckdb'}") as other:
        applied = other.apply(text)
        assert applied.version == 1  # an empty store: nothing to keep before it
        assert other.export_config().text() == text
        assert _shape(other) == _shape(box)
        assert {h.name: h.settings for h in other.hosts()} == {
            h.name: h.settings for h in box.hosts()
        }
    assert load(text) == load(SHOP)
    # the states came through: a stopped service, an unenlisted subscription
    states = {s.name: s.state for s in box.subscriptions()}
    assert states["bill"] is State.STOPPED
    assert states["bill-audit"] is State.UNENLISTED
    assert states["ship-eu"] is State.STARTED


def _publish(box: MessageBox, rows: list[dict[str, object]]) -> list[object]:
    return [r.message_id for r in box.publish([Message(b"m", promoted=p) for p in rows])]


def test_plan_shows_the_diff_and_which_messages_move(box: MessageBox) -> None:
    box.apply(SHOP)
    eu, uk, us_small, nothing = _publish(
        box,
        [
            {"orders.Region": "EU", "orders.Total": 0},
            {"orders.Region": "UK", "orders.Total": 0},
            {"orders.Region": "US", "orders.Total": 50},
            {"orders.Region": "FR", "orders.Total": 0},
        ],
    )
    changed = (
        SHOP.replace('orders.Region == "EU"', 'orders.Region in ["EU", "UK"]')
        .replace("orders.Total >= 100", "orders.Total >= 10")
        .replace("priority = 5", "priority = 6")
    )
    before = table_counts(box)
    plan = box.plan(changed)
    assert table_counts(box) == before  # a plan changes nothing
    assert {(c.name, c.action, c.fields) for c in plan.diff.subscriptions} == {
        ("ship-eu", "change", ("filter", "priority")),
        ("ship-us", "change", ("filter",)),
    }
    traffic = plan.traffic
    assert traffic is not None
    assert traffic.messages == 4
    assert traffic.changed == 2
    assert traffic.subscriptions["ship-eu"].gained == 1
    assert traffic.subscriptions["ship-eu"].gained_samples == [uk]
    assert traffic.subscriptions["ship-us"].gained_samples == [us_small]
    # UK matched nothing and would route; the small US order routes to bill either way
    assert (traffic.fixed_failures, traffic.new_failures) == (1, 0)
    assert traffic.fixed_failure_samples == [uk]
    assert nothing not in {m for e in traffic.subscriptions.values() for m in e.gained_samples}
    text = "\n".join(plan.describe())
    assert '- orders.Region == "EU"' in text
    assert '+ orders.Region in ["EU", "UK"]' in text
    assert "priority: 5 -> 6" in text
    # the other way: ship-eu loses the EU message, which becomes a routing failure
    narrower = SHOP.replace('orders.Region == "EU"', 'orders.Region == "DE"')
    back = box.plan(narrower).traffic
    assert back is not None
    assert (back.subscriptions["ship-eu"].lost, back.new_failures) == (1, 1)
    assert back.new_failure_samples == [eu]
    assert not box.plan(SHOP).changed


def test_apply_changes_in_place_keeping_ids_and_waiting_entries(box: MessageBox) -> None:
    box.apply(SHOP)
    ids = {s.name: s.id for s in box.subscriptions()}
    _publish(box, [{"orders.Region": "EU"}, {"orders.Region": "US", "orders.Total": 500}])
    depth = {q.subscription: q.depth for q in box.queue_depth()}
    changed = SHOP.replace('orders.Region == "EU"', 'orders.Region == "DE"').replace(
        'host = "shipping"\nfilter = \'orders.Region == "US"',
        'host = "billing"\nfilter = \'orders.Region == "US"',
    )
    applied = box.apply(changed)
    actions = {c.name: c.action for c in applied.diff.subscriptions}
    assert actions == {"ship-eu": "change", "ship-us": "replace"}
    after = {s.name: s for s in box.subscriptions()}
    assert after["ship-eu"].id == ids["ship-eu"]
    assert {q.subscription: q.depth for q in box.queue_depth()}.get(ids["ship-eu"]) == depth[
        ids["ship-eu"]
    ]
    assert after["ship-us"].id != ids["ship-us"]
    assert after["ship-us"].host == "billing"
    # the replaced subscription's waiting entry was suspended, re-routable
    [gone] = box.suspended(reason=SUBSCRIPTION_REMOVED)
    assert gone.subscription == ids["ship-us"]
    # a publish now routes by the new filter
    [routed] = box.publish([Message(b"m", promoted={"orders.Region": "DE"})])
    assert routed.subscriptions == (ids["ship-eu"],)


def test_apply_adds_changes_and_removes_hosts(box: MessageBox) -> None:
    box.apply(SHOP)
    grown = SHOP.replace("dequeue_threads = 2", "dequeue_threads = 3\nclaim_batch = 50") + (
        "\n[hosts.spare]\nmax_attempts = 2\n"
    )
    applied = box.apply(grown)
    assert {(h.name, h.action) for h in applied.diff.hosts} == {
        ("shipping", "change"),
        ("spare", "add"),
    }
    assert box.host("shipping").settings.claim_batch == 50
    assert box.host("spare").settings.max_attempts == 2
    box.apply(SHOP)  # spare is not named any more: removed
    assert "spare" not in {h.name for h in box.hosts()}


def test_a_busy_host_left_out_is_refused_and_nothing_is_applied(box: MessageBox) -> None:
    box.apply(SHOP)
    _publish(box, [{"orders.Region": "EU"}])  # waits on shipping's queue
    versions = box.versions()
    without = SHOP.replace("[hosts.shipping]\ndequeue_threads = 2\n", "").split("[[subscriptions]]")
    only_billing = "[[subscriptions]]".join([without[0], *without[3:]])
    before = table_counts(box)
    with pytest.raises(Conflict, match="'shipping' is not in the routing file but is not empty"):
        box.apply(only_billing)
    assert table_counts(box) == before
    assert box.versions() == versions


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '[hosts.a]\n[[subscriptions]]\nservice = "x"\nhost = "a"\nfiltr = "a.b == 1"\n',
            ":5: subscriptions[0].filtr: unknown key 'filtr'",
        ),
        (
            '[hosts.a]\n[[subscriptions]]\nservice = "x"\nhost = "a"\nfilter = "a.b = 1"\n',
            ":5: subscriptions[0].filter: filter text, column",
        ),
        (
            '[hosts.a]\n[[subscriptions]]\nservice = "x"\nhost = "b"\nfilter = "a.b == 1"\n',
            ":4: subscriptions[0].host: no host named 'b'",
        ),
        (
            '[hosts.a]\n[[subscriptions]]\nservice = "x"\nhost = "a"\nfilter = "a.b == 1"\n'
            '[[subscriptions]]\nservice = "x"\nhost = "a"\nfilter = "a.b == 2"\n',
            ":6: subscriptions[1].name: a subscription named 'x' is declared twice",
        ),
        ("[hosts.a]\nmax_attempts = 0\n", ":2: hosts.a.max_attempts: Input should be greater"),
        (
            '[hosts.a]\n[services.y]\nstate = "stopped"\n',
            ":2: services.y: service 'y' has no subscription",
        ),
        ("[hosts.a\n", "not valid TOML"),
    ],
)
def test_bad_input_is_refused_naming_file_line_and_key(
    box: MessageBox, tmp_path: Path, text: str, said: str
) -> None:
    box.apply(SHOP)
    path = tmp_path / "routing.toml"
    path.write_text(text)
    before = table_counts(box)
    with pytest.raises(RoutingFileError) as caught:
        box.apply(path)
    assert str(caught.value).startswith(str(path))
    assert said in str(caught.value)
    assert table_counts(box) == before


def test_versions_and_rollback(box: MessageBox) -> None:
    box.create_host("old")
    box.subscribe("legacy", host="old", filter=P("a.B") == 1)
    first = box.apply(SHOP)
    assert first.version == 2  # version 1 keeps what was live before the first apply
    [v2, v1] = box.versions()
    assert (v1.version, v2.version) == (1, 2)
    assert v2.digest == load(SHOP).digest()
    assert {c["name"]: c["action"] for c in v2.changes["subscriptions"]}["legacy"] == "remove"
    assert box.apply(SHOP).version is None  # nothing changed: no version
    back = box.rollback(1)
    assert back.version == 3
    assert box.versions()[0].rollback_of == 1
    assert [s.name for s in box.subscriptions()] == ["legacy"]
    assert box.routing_version(2).content == SHOP
    box.rollback(2)
    assert {s.name for s in box.subscriptions()} == set(load(SHOP).subscriptions)
    with pytest.raises(NotFound, match="no routing version 9"):
        box.rollback(9)


def test_lint_against_traffic(box: MessageBox) -> None:
    box.apply(SHOP)
    _publish(box, [{"orders.Region": "EU", "orders.Total": 3}])
    typo = SHOP.replace("orders.Audit == true", 'orders.Regoin == "EU"')
    found = box.lint(typo, window=3600)
    kinds = {(f.subscription, f.kind) for f in found}
    assert ("bill-audit", UNKNOWN_PROPERTY) in kinds
    assert any("did you mean 'orders.Region'" in f.reason for f in found)
    assert ("ship-us", DEAD) in kinds
    assert ("ship-eu", DEAD) not in kinds
    # without a window: the names the newest stored messages carry are the known ones
    assert {(f.subscription, f.kind) for f in box.lint(SHOP)} == {
        ("bill", UNKNOWN_PROPERTY),  # orders.Free
        ("bill-audit", UNKNOWN_PROPERTY),
        ("flow", UNKNOWN_PROPERTY),
    }


def test_an_apply_racing_four_publishers_routes_each_message_by_one_version(
    box: MessageBox,
) -> None:
    old = (
        '[hosts.h]\n[[subscriptions]]\nname = "a"\nservice = "a"\nhost = "h"\nfilter = "t.x == 1"\n'
        '[[subscriptions]]\nname = "b"\nservice = "b"\nhost = "h"\nfilter = "t.x == 1"\n'
    )
    new = (
        '[hosts.h]\n[[subscriptions]]\nname = "a"\nservice = "a"\nhost = "h"\nfilter = "t.x == 2"\n'
        '[[subscriptions]]\nname = "c"\nservice = "c"\nhost = "h"\nfilter = "t.x == 1"\n'
        '[[subscriptions]]\nname = "d"\nservice = "d"\nhost = "h"\nfilter = "t.x == 1"\n'
    )
    box.apply(old)
    seen: list[tuple[int, ...]] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            while not stop.is_set():
                routed = box.publish([Message(b"m", promoted={"t.x": 1}) for _ in range(5)])
                with lock:
                    seen.extend(r.subscriptions for r in routed)
        except BaseException as exc:
            errors.append(exc)

    def published_at_least(n: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not errors:
            with lock:
                if len(seen) >= n:
                    return
            time.sleep(0.01)
        raise AssertionError(f"publishers stalled at {len(seen)} messages: {errors}")

    def pair() -> tuple[int, ...]:
        """The subscriptions a t.x == 1 message routes to under the live version."""
        return tuple(sorted(s.id for s in box.subscriptions() if s.filter.matches({"t.x": 1})))

    allowed = [pair()]
    threads = [threading.Thread(target=publisher) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for text in (new, old, new):
            published_at_least(len(seen) + 40)
            box.apply(text)
            allowed.append(pair())
        published_at_least(len(seen) + 40)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors
    assert len(set(allowed)) == 4
    assert all(len(p) == 2 for p in allowed)
    routed = [tuple(sorted(s)) for s in seen]
    mixed = [r for r in routed if r not in allowed]
    assert not mixed, f"{len(mixed)} message(s) routed by a mix of versions, e.g. {mixed[:3]}"
    assert set(routed) == set(allowed)  # every version routed some of them


def test_the_command_line_plans_applies_and_rolls_back(backend_url: str, tmp_path: Path) -> None:
    env = {"MESSAGEBOX_URL": backend_url}
    assert run_cli(["init"], env=env).returncode == 0
    path = tmp_path / "routing.toml"
    path.write_text(SHOP)
    dry = run_cli(["apply", "--dry-run", str(path)], env=env)
    assert dry.returncode == 4  # a change, as plan says
    assert "+ subscription ship-eu" in dry.stdout
    plan = run_cli(["plan", str(path)], env=env)
    assert plan.returncode == 4
    assert "+ subscription ship-eu" in plan.stdout
    applied = run_cli(["apply", str(path)], env=env)
    assert applied.returncode == 0
    assert "applied as version 1" in applied.stdout
    assert run_cli(["plan", str(path)], env=env).returncode == 0
    exported = run_cli(["export"], env=env)
    assert load(exported.stdout) == load(SHOP)
    listed = run_cli(["versions"], env=env)
    assert listed.returncode == 0
    assert "7 add" in listed.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[hosts.a]\n[[subscriptions]]\nservice = "x"\nhost = "a"\nfiltr = "a.b == 1"\n')
    refused = run_cli(["apply", str(bad)], env=env)
    assert refused.returncode == 2
    assert f"{bad}:5: subscriptions[0].filtr" in refused.stderr
    lint = run_cli(["lint", str(path), "--window", "1h"], env=env)
    assert lint.returncode == 0, lint.stderr  # no message stored: nothing to judge by
    rolled = run_cli(["rollback", "1"], env=env)
    assert rolled.returncode == 0
    assert "nothing to apply" in rolled.stdout
    with MessageBox(backend_url) as box:
        audit = [e.action for e in box.audit_log()]
    assert "apply" in audit


def test_a_bad_window_is_refused(box: MessageBox) -> None:
    with pytest.raises(ValidationError, match="window must be positive"):
        box.plan(SHOP, window=0)


def test_subscribe_warns_of_what_lint_finds(
    box: MessageBox, caplog: pytest.LogCaptureFixture
) -> None:
    box.create_host("h")
    box.subscribe("svc", host="h", filter=P("a.B") == 1, name="first")
    with caplog.at_level("WARNING", logger="messagebox.lint"):
        box.subscribe(
            "svc",
            host="h",
            filter=(P("a.B") == 1) | ((P("a.C") > 5) & (P("a.C") < 3)),
            name="again",
        )
    said = [r.getMessage() for r in caplog.records if r.name == "messagebox.lint"]
    assert any("again, group 2: unsatisfiable-group" in s for s in said), said
    assert any("again: duplicate: matches exactly the messages 'first' matches" in s for s in said)
    assert {f.kind for f in box.lint_subscriptions("again")} == {"unsatisfiable-group", "duplicate"}
    assert box.lint_subscriptions("first") == []  # the earlier one is not the duplicate


def test_the_console_shows_versions_and_the_diff_of_each(box: MessageBox) -> None:
    import warnings

    from messagebox.console import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    box.apply(SHOP)
    box.apply(
        SHOP.replace('orders.Region == "EU"', 'orders.Region == "DE"').replace(
            "dequeue_threads = 2", "dequeue_threads = 3"
        )
    )
    app = create_app(box, token="t", read_token="r")
    client = TestClient(app, base_url="http://127.0.0.1:8080", follow_redirects=False)
    auth = {"Authorization": "Bearer r"}  # a reader sees them
    listed = client.get("/versions", headers=auth)
    assert listed.status_code == 200
    assert 'href="/versions/2"' in listed.text
    assert "2 change" in listed.text
    shown = client.get("/versions/2", headers=auth)
    assert shown.status_code == 200
    assert "- orders.Region == &#34;EU&#34;" in shown.text
    assert "+ orders.Region == &#34;DE&#34;" in shown.text
    assert "dequeue_threads: 2 → 3" in shown.text
    assert "[[subscriptions]]" in shown.text  # the file as applied
    assert client.get("/versions/9", headers=auth).status_code == 404
    assert client.get("/versions/x", headers=auth).status_code == 404
    assert client.get("/versions").status_code in (302, 303)  # to the login form


def test_plan_counts_tracked_messages_the_spool_no_longer_holds(box: MessageBox) -> None:
    box.apply(SHOP)
    box.configure_tracking(True)
    _publish(box, [{"orders.Region": "EU"}, {"orders.Region": "XX"}])  # XX matches nothing
    [failure] = box.suspended()
    box.terminate(failure.id)
    box.cleanup()  # the unreferenced message is deleted; its tracked events stay
    traffic = box.plan(SHOP).traffic
    assert traffic is not None
    assert (traffic.messages, traffic.not_stored) == (1, 1)
    assert "1 tracked message(s) of the window are no longer stored" in "\n".join(
        traffic.describe()
    )


def test_a_priority_or_ordered_change_reaches_the_waiting_entries(box: MessageBox) -> None:
    box.apply(SHOP)
    _publish(box, [{"orders.Region": "EU"}])
    box.apply(SHOP.replace("priority = 5", "priority = 9\nordered = true"))
    import sqlalchemy as sa

    from messagebox.storage import schema

    with box.store.transaction() as conn:
        rows = conn.execute(sa.select(schema.queue.c.priority, schema.queue.c.ordered)).all()
    assert [tuple(r) for r in rows] == [(9, True)]


def test_plan_says_when_a_host_it_removes_is_not_empty(box: MessageBox) -> None:
    box.apply(SHOP)
    _publish(box, [{"orders.Region": "EU"}])  # waits on shipping's queue
    moved = SHOP.replace("[hosts.shipping]\ndequeue_threads = 2\n", "").replace(
        'host = "shipping"', 'host = "billing"'
    )
    plan = box.plan(moved, window=None)
    [blocker] = plan.blockers
    assert "host shipping cannot be removed yet (1 queued entries)" in blocker
    assert f"! {blocker}" in plan.describe()
    with pytest.raises(Conflict, match="moves off it count"):
        box.apply(moved)
    kept = moved + "\n[hosts.shipping]\n"  # one more apply with the host kept, then drop it
    assert not box.plan(kept, window=None).blockers
    box.apply(kept)
    assert {s.host for s in box.subscriptions() if s.service == "ship"} == {"billing"}


def test_a_config_given_as_an_object_is_checked_as_a_file_is(box: MessageBox) -> None:
    import dataclasses

    config = load(SHOP)
    bad = dataclasses.replace(config.subscriptions["bill"], priority=99_999)
    before = table_counts(box)
    with pytest.raises(RoutingFileError, match="priority"):
        box.apply(dataclasses.replace(config, subscriptions={**config.subscriptions, "bill": bad}))
    with pytest.raises(ValidationError, match=r"pass pathlib\.Path"):
        box.apply("routing.toml")
    with pytest.raises(RoutingFileError, match="host name '  ' must be a non-empty str"):
        box.apply('[hosts."  "]\n')
    assert table_counts(box) == before
    assert box.apply("[hosts.a]").version == 1  # a file's text, even without a newline
