"""Failure groups on both backends, from real host instances: a service that fails in two
places with a different order id each time makes two groups, whatever the ids; each
group is found by its id, lists its entries, filters the suspended list and is resumed
or terminated whole, from Python, the console (its group page, one confirmation) and
the command line (``failures list|show|resume|terminate``, ``suspended list --error
--group``)."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from messagebox import Message, MessageBox
from messagebox.console import create_app, pages
from messagebox.errors import UnknownFailureGroup
from messagebox.hosts import Delivery, HostInstance
from messagebox.predicates import P
from tests.cli_support import run_cli
from tests.conftest import FAST_HOST, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "operator-secret"
ORDERS = ["A064109", "B7", "C12", "D999999", "E5", "F0042", "G1", "H77"]


def reserve(order: str) -> None:
    raise LookupError(f"no stock for order {order}")


def charge(order: str) -> None:
    raise LookupError(f"no stock for order {order}")  # the same text: another place


def ship(d: Delivery) -> None:
    order, n = str(d.properties["o.Id"]), d.properties["o.N"]
    assert isinstance(n, int)
    (reserve if n % 2 else charge)(order)


@pytest.fixture
def failed(box: MessageBox) -> MessageBox:
    """Eight orders, each with its own id, failed by the ship service: four in reserve,
    four in charge, each suspended after one attempt."""
    box.create_host("shop", **FAST_HOST, max_attempts=1)
    box.subscribe("ship", host="shop", filter=P("o.N") >= 0, name="ship-all")
    box.publish([Message(b"o", promoted={"o.N": i, "o.Id": o}) for i, o in enumerate(ORDERS)])
    with HostInstance(box, "shop", {"ship": ship}):
        wait_for(lambda: box.count_suspended() == len(ORDERS), "every order suspended")
    return box


def test_one_raise_site_is_one_group_whatever_the_ids(failed: MessageBox) -> None:
    groups = failed.failure_groups()
    assert sorted((g.count, g.where[-1].function) for g in groups) == [
        (4, "charge"),
        (4, "reserve"),
    ]
    for g in groups:
        assert (g.reason, g.service, g.exception) == ("delivery-failure", "ship", "LookupError")
        assert g.message == "no stock for order <id>"
        assert g.where[-2].function == "ship"
        assert g.where[-1].file == "test_failure_groups.py"
        assert g.example is not None
        assert re.fullmatch(r"LookupError: no stock for order \w+", g.example)
        assert failed.failure_group(g.id) == g  # found again by its id
    reserved = {e.id for e in failed.suspended() if ", in reserve\n" in (e.error or "")}
    assert {i for g in groups if g.where[-1].function == "reserve" for i in g.entry_ids} == (
        reserved
    )


def test_the_suspended_entries_filter_by_error_text_and_group(failed: MessageBox) -> None:
    [b7] = failed.suspended(error="order b7")  # any case
    assert "B7" in (b7.error or "")
    assert failed.count_suspended(error="NO STOCK") == len(ORDERS)
    assert failed.suspended(error="100%") == []  # a LIKE wildcard is text here
    group = next(g for g in failed.failure_groups() if b7.id in g.entry_ids)
    listed = failed.suspended(group=group.id, newest_first=True)
    assert {e.id for e in listed} == set(group.entry_ids)
    assert failed.suspended(group=group.id, error="B7") == [b7]
    assert failed.count_suspended(group=group.id) == 4
    with pytest.raises(UnknownFailureGroup, match="no failure group 0123456789abcdef"):
        failed.suspended(group="0123456789abcdef")


def test_a_group_is_resumed_and_terminated_whole(failed: MessageBox) -> None:
    first, second = failed.failure_groups()
    seen: list[tuple[int, int]] = []
    resumed = failed.resume(group=first.id, batch=3, progress=lambda d, t: seen.append((d, t)))
    assert sorted(resumed) == sorted(first.entry_ids)
    assert seen == [(3, 4), (4, 4)]
    assert failed.count_suspended() == 4
    assert sum(d.depth for d in failed.queue_depth("shop")) == 4
    assert failed.terminate(group=second.id) == sorted(second.entry_ids)
    assert failed.count_suspended() == 0
    with pytest.raises(UnknownFailureGroup):
        failed.resume(group=second.id)


# --- the console ----------------------------------------------------------------------


def browser(box: MessageBox) -> TestClient:
    return TestClient(
        create_app(box, token=TOKEN), base_url="http://127.0.0.1:8080", follow_redirects=False
    )


def shown_entries(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="entry-(\d+)">', html)]


def test_a_group_page_lists_its_entries_a_page_at_a_time(
    failed: MessageBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "LIST_LIMIT", 3)
    b = browser(failed)
    listing = b.get("/failures").text
    group = failed.failure_groups()[0]
    assert f'href="/failures/{group.id}"' in listing  # each row links to its group
    assert f"e.g. <code>{group.example}</code>" in listing  # the example, not a tooltip
    page = b.get(f"/failures/{group.id}")
    assert page.status_code == 200
    assert '<dd id="group-count">4</dd>' in page.text
    assert f"<code>{group.example}</code>" in page.text
    assert "<code>test_failure_groups.py</code> in <code>" in page.text
    newest = sorted(group.entry_ids, key=group.entry_ids.index)  # as grouped: newest first
    assert shown_entries(page.text) == newest[:3]
    second = b.get(f"/failures/{group.id}?page=2").text
    assert shown_entries(second) == newest[3:]
    assert 'id="previous"' in second
    assert b.get("/failures/0123456789abcdef").status_code == 404
    assert b.get("/failures/not-a-group").status_code == 400


def test_a_group_is_resumed_from_its_page_in_one_confirmation(failed: MessageBox) -> None:
    b = browser(failed)
    group = failed.failure_groups()[0]
    form = {"action": "resume", "group": group.id, "token": TOKEN}
    asked = b.post("/suspended/bulk", data={**form, "back": f"/failures/{group.id}"})
    assert '<p id="confirm-count"><strong>4</strong> entries' in asked.text
    assert failed.count_suspended() == 8
    done = b.post(
        "/suspended/bulk", data={**form, "confirm": "yes", "back": f"/failures/{group.id}"}
    )
    assert done.headers["location"] == f"/failures/{group.id}?done=resumed&n=4"
    assert failed.count_suspended() == 4
    after = b.get(done.headers["location"]).text
    assert "4 entries resumed." in after
    assert "No suspended entry is left in this group." in after
    [row, *_] = failed.audit_log()
    assert (row.action, row.target, row.count) == ("resume (bulk)", f"failure group {group.id}", 4)


def test_the_suspended_page_filters_by_error_and_group(failed: MessageBox) -> None:
    b = browser(failed)
    group = failed.failure_groups()[0]
    by_error = b.get("/suspended?error=b7").text
    assert len(shown_entries(by_error)) == 1
    assert "1 entry matching" in by_error
    by_group = b.get(f"/suspended?group={group.id}").text
    assert sorted(shown_entries(by_group)) == sorted(group.entry_ids)
    assert f'href="/failures/{group.id}"' in by_group
    # all matching both filters, terminated in one confirmation
    form = {"action": "terminate", "all": "1", "group": group.id, "error": "o", "token": TOKEN}
    asked = b.post("/suspended/bulk", data=form)
    assert "<strong>4</strong> entries" in asked.text
    assert f"all matching error &#39;o&#39;, group {group.id}" in asked.text
    done = b.post("/suspended/bulk", data={**form, "confirm": "yes"})
    assert done.status_code == 303
    assert failed.count_suspended() == 4
    assert b.get("/suspended?group=xyz").status_code == 400


# --- the command line -------------------------------------------------------------------


def cli(url: str, *args: str) -> tuple[int, str, str]:
    done = run_cli(["--url", url, *args])
    return done.returncode, done.stdout, done.stderr


def test_failures_from_the_command_line(failed: MessageBox, backend_url: str) -> None:
    groups = {g.id: g for g in failed.failure_groups()}
    failed.close()  # DuckDB: one process at a time, the command line's now
    code, out, err = cli(backend_url, "--json", "failures", "list")
    assert code == 0, err
    listed = json.loads(out)
    assert {g["id"]: g["count"] for g in listed} == dict.fromkeys(groups, 4)
    assert listed[0]["where"][-1]["file"] == "test_failure_groups.py"
    gid = listed[0]["id"]
    code, out, err = cli(backend_url, "failures", "show", gid, "--limit", "2")
    assert code == 0, err
    assert f"group        {gid}" in out
    assert "example      LookupError: no stock for order" in out
    assert "(the newest 2 of 4; --limit shows more)" in err
    code, out, err = cli(backend_url, "--json", "suspended", "list", "--group", gid, "--error", "O")
    assert code == 0, err
    assert sorted(e["id"] for e in json.loads(out)) == sorted(groups[gid].entry_ids)
    # a bulk change without a terminal needs --yes
    code, out, err = cli(backend_url, "failures", "terminate", gid)
    assert (code, out) == (2, "")
    assert "give --yes" in err
    code, out, err = cli(backend_url, "--json", "failures", "resume", gid, "--yes")
    assert code == 0, err
    assert json.loads(out)["count"] == 4
    # an unknown group is not found (3), a malformed id bad usage (2)
    assert cli(backend_url, "failures", "show", gid)[0] == 3
    assert cli(backend_url, "failures", "terminate", gid, "--yes")[0] == 3
    assert cli(backend_url, "failures", "show", "G1")[0] == 2
    assert cli(backend_url, "suspended", "list", "--group", "nope")[0] == 2
    with MessageBox(backend_url) as box:
        audited = [(row.action, row.count) for row in box.audit_log()]
        assert audited[:2] == [("failures terminate (failed)", None), ("failures resume", 4)]
        assert box.count_suspended() == 4
