"""Per-key order as users meet it, on both backends: a host instance delivers each key in
publish order, one at a time, and a failure holds only its key (on_failure="stop")
until the suspended message is resumed; the console and the command line show the held
key and why; bad ``ordered_by`` input is refused naming it, storing nothing; a routing
file declares ``ordered_by`` (export, plan, apply: a change replaces the subscription)."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import pytest

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.errors import ValidationError
from messagebox.hosts import HostApp, HostInstance
from messagebox.predicates import P
from tests.cli_support import run_cli
from tests.conftest import FAST_HOST, table_counts, wait_for
from tests.integration.keyed_support import KeyRecorder

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

KEYS = "abcdefgh"
PER_KEY = 10


@pytest.fixture
def keyed(box: MessageBox) -> MessageBox:
    box.create_host("h", **{**FAST_HOST, "max_attempts": 1})
    box.subscribe(
        "svc", host="h", filter=P("t.N") >= 0, name="by-key", ordered_by="t.K", on_failure="stop"
    )
    for n in range(PER_KEY):
        box.publish([Message(b"x", promoted={"t.K": k, "t.N": n}) for k in KEYS])
    return box


def test_a_host_delivers_each_key_in_order_and_a_failure_holds_only_its_key(
    keyed: MessageBox, backend_url: str
) -> None:
    service = KeyRecorder(fail=("c", 3))
    inst = HostInstance(keyed, "h", {"svc": service}, settings={"dequeue_threads": 4})
    inst.start()
    try:
        wait_for(lambda: service.count() == len(KEYS) * PER_KEY - 7, what="all but c's rest")
        wait_for(lambda: keyed.held_keys(), what="the held key")
        # every other key whole and in order; c up to its failure
        assert service.seen == {k: list(range(PER_KEY)) if k != "c" else [0, 1, 2] for k in KEYS}
        assert service.overlaps == 0
        [held] = keyed.held_keys()
        assert (held.shown, held.waiting) == ("'c'", 6)
        assert held.error == "RuntimeError: cannot take c 3"
        assert keyed.subscription("by-key").state == "started"  # the others went on
        [stats] = keyed.queue_stats()
        assert (stats.depth, stats.blocked) == (6, 6)
        # the console shows which key is held, by which entry, and why
        page = TestClient(create_app(keyed), base_url="http://127.0.0.1:8080").get("/")
        assert 'id="held-keys"' in page.text
        assert f"suspended entry {held.entry}" in page.text
        assert "RuntimeError: cannot take c 3" in page.text
        queue = TestClient(create_app(keyed), base_url="http://127.0.0.1:8080").get(
            "/queue?host=h&state=blocked"
        )
        assert "blocked: its key is held by" in queue.text
        assert "key <code>&#39;c&#39;</code>" in queue.text
        # and so does the command line
        done = run_cli(["--url", backend_url, "queues", "--held-keys"])
        assert done.returncode == 0, done.stderr
        assert "'c'" in done.stdout
        assert f"suspended entry {held.entry}" in done.stdout
        done = run_cli(["--url", backend_url, "--json", "queues", "--held-keys"])
        [shown] = json.loads(done.stdout)
        assert (shown["shown"], shown["entry"], shown["waiting"]) == ("'c'", held.entry, 6)
        # resumed once its cause is fixed: c goes on from its failed message, in order
        service.fail = None
        keyed.resume(held.entry)
        wait_for(lambda: service.count() == len(KEYS) * PER_KEY, what="c's rest")
    finally:
        inst.stop(5)
    assert service.seen["c"] == list(range(PER_KEY))
    assert keyed.held_keys() == []
    done = run_cli(["--url", backend_url, "queues", "--held-keys"])
    assert "no key is held" in done.stdout + done.stderr


def test_on_failure_suspend_lets_the_key_go_on(box: MessageBox) -> None:
    box.create_host("h", **{**FAST_HOST, "max_attempts": 1})
    box.subscribe("svc", host="h", filter=P("t.N") >= 0, name="by-key", ordered_by="t.K")
    box.publish([Message(b"x", promoted={"t.K": "a", "t.N": n}) for n in range(5)])
    service = KeyRecorder(fail=("a", 1))
    inst = HostInstance(box, "h", {"svc": service})
    inst.start()
    try:
        wait_for(lambda: service.count() == 4, what="the key's other messages")
    finally:
        inst.stop(5)
    assert service.seen == {"a": [0, 2, 3, 4]}
    assert [e.reason for e in box.suspended()] == ["delivery-failure"]
    assert box.held_keys() == []


BAD: list[tuple[dict[str, Any], str]] = [
    ({"ordered_by": "CustomerId"}, "ordered_by: property name 'CustomerId' is not of the form"),
    ({"ordered_by": 7}, "ordered_by: property name must be a str, not int"),
    ({"ordered_by": "t.K", "ordered": True}, "ordered_by 't.K' cannot go with ordered=True"),
    (
        {"ordered_by": "t.K", "correlation": ["t.C"]},
        "ordered_by 't.K' cannot go with a correlation",
    ),
    (
        {"ordered_by": "t.K", "kind": "instance", "instance_id": "i-1"},
        "ordered_by 't.K' cannot go with an instance subscription",
    ),
    (
        {
            "ordered_by": "t.K",
            "filter": P("t.K").not_exists() | (P("t.N") > 3) & P("t.K").not_exists(),
        },
        "ordered_by 't.K': no message its filter matches carries it",
    ),
]


@pytest.mark.parametrize(("given", "said"), BAD, ids=[s.split(":")[0][:30] for _, s in BAD])
def test_a_bad_ordered_by_is_refused_naming_it_and_nothing_is_stored(
    box: MessageBox, given: dict[str, Any], said: str
) -> None:
    box.create_host("h")
    before = table_counts(box)
    spec = {"filter": P("t.N") >= 0, **given}
    with pytest.raises(ValidationError, match=re.escape(said)):
        box.subscribe("svc", host="h", **spec)
    assert table_counts(box) == before
    with pytest.raises(ValidationError, match="subscription 'x'"):  # refused at declaration
        HostApp("h").subscribe("svc", name="x", **spec)


def test_a_routing_file_declares_ordered_by_and_a_change_replaces_the_subscription(
    box: MessageBox,
) -> None:
    text = (
        "[hosts.h]\n"
        '[[subscriptions]]\nname = "by-key"\nservice = "svc"\nhost = "h"\n'
        'filter = \'t.N >= 0\'\nordered_by = "t.K"\non_failure = "stop"\n'
    )
    box.apply(text)
    made = box.subscription("by-key")
    assert (made.ordered_by, made.on_failure) == ("t.K", "stop")
    exported = box.export_config().text()
    assert "ordered_by = 't.K'" in exported
    assert box.plan(exported, window=None).diff.changed is False
    box.publish([Message(b"x", promoted={"t.N": 1, "t.K": "a", "t.C": 9})])
    # ordering by another property replaces it: its waiting entries are suspended, and a
    # reroute queues them with the new subscription's keys
    changed = text.replace('ordered_by = "t.K"', 'ordered_by = "t.C"')
    plan = box.plan(changed, window=None)
    [change] = plan.diff.subscriptions
    assert (change.action, change.fields) == ("replace", ("ordered_by",))
    assert "ordered_by: t.K -> t.C" in "\n".join(plan.diff.describe())
    box.apply(changed)
    assert box.subscription("by-key").ordered_by == "t.C"
    [waiting] = box.suspended()
    assert waiting.reason == "subscription-removed"
    box.reroute(waiting.id)
    claims, _ = box.consumer("h", "o").claim(
        5, 30.0, ordered=False, instances=False, keyed=5, keyed_only=True
    )
    assert [c.key for c in claims] == ["n9"]
    with pytest.raises(ValidationError, match=r"ordered_by 't\.K' cannot go with ordered=True"):
        box.plan(text.replace("ordered_by", "ordered = true\nordered_by"), window=None)


def test_the_command_line_subscribes_ordered_by_a_property(
    box: MessageBox, backend_url: str
) -> None:
    box.create_host("h")
    done = run_cli(
        ["--url", backend_url, "subscriptions", "add", "svc", "--host", "h",
         "--filter", "t.N >= 0", "--ordered-by", "t.K", "--on-failure", "stop"]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert box.subscription("svc").ordered_by == "t.K"
    done = run_cli(["--url", backend_url, "subscriptions", "list"])
    assert "by t.K" in done.stdout
    done = run_cli(["--url", backend_url, "--json", "subscriptions", "list"])
    assert json.loads(done.stdout)[0]["ordered_by"] == "t.K"
    done = run_cli(
        ["--url", backend_url, "subscriptions", "add", "bad", "--host", "h",
         "--filter", "t.N >= 0", "--ordered-by", "NoNamespace"]
    )  # fmt: skip
    assert done.returncode != 0
    assert "ordered_by: property name 'NoNamespace'" in done.stderr


def test_a_send_port_and_a_batch_with_a_message_stored_suspended_order_by_a_property(
    box: MessageBox,
) -> None:
    """A send port declares ``ordered_by``; in a batch where a message is stored
    suspended (a receive pipeline refused it, here routed as an error report too), the
    others' entries still get their own keys."""
    from messagebox.models import Suspension

    app = HostApp("h")
    app.send_port("out", transport="file:///tmp/never", filter=P("t.N") >= 0, ordered_by="t.K")
    app.setup(box)
    assert box.subscription("out").ordered_by == "t.K"
    box.messages.publish(
        [Message(b"x", promoted={"t.N": i, "t.K": f"k{i}"}) for i in range(3)],
        policy="suspend",
        trusted=False,
        block=True,
        timeout=5.0,
        suspend={1: Suspension("receive-failure", "refused", route=True)},
        given=(),
    )
    claims, _ = box.consumer("h", "o").claim(
        5, 30.0, ordered=False, instances=False, keyed=5, keyed_only=True
    )
    assert sorted(c.key or "" for c in claims) == ["sk0", "sk1", "sk2"]
