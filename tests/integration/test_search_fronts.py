"""Search from the command line (``messagebox search``) and the console (``/search``),
on both backends: a filter with a range and an equality, each message's state, the
cursor to go on; bad input is a clear error (exit 2 naming it; a 400 page that shows
it), never a traceback."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.predicates import P
from tests.cli_support import run_cli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


@pytest.fixture
def shop(box: MessageBox) -> MessageBox:
    """Orders 1 to 6 (a total of 1,000 each more), each published alone; the US ones
    routed nowhere (suspended routing failures)."""
    box.create_host("h")
    box.subscribe("ship", host="h", filter=P("orders.Region") == "EU", name="ship")
    for n in range(1, 7):
        region = "EU" if n % 3 else "US"
        promoted = {"orders.Id": f"A{n}", "orders.Total": n * 1000, "orders.Region": region}
        box.publish([Message(b"<o/>", promoted=promoted)])
    return box


def cli(box: MessageBox, *args: str) -> tuple[int, str, str]:
    url = box.url.render_as_string(hide_password=False)
    done = run_cli(["--url", url, *args])
    return done.returncode, done.stdout, done.stderr


def test_search_from_the_command_line(shop: MessageBox) -> None:
    # When the operator searches for the EU orders above 2,000
    code, out, err = cli(shop, "search", 'orders.Total > 2000 and orders.Region == "EU"')
    # Then they come newest first, with their state and properties (the filter's first)
    assert code == 0, err
    rows = out.splitlines()
    assert rows[0].split() == [
        "MESSAGE",
        "PUBLISHED",
        "STATE",
        "ENTRIES",
        "PUBLISHER",
        "PROPERTIES",
    ]
    assert [r[r.index("orders.") :] for r in rows[1:]] == [
        'orders.Region="EU", orders.Total=5000, orders.Id="A5"',
        'orders.Region="EU", orders.Total=4000, orders.Id="A4"',
    ]
    assert all(" queued  1 queued " in r for r in rows[1:])
    assert "(searched all 6 messages published since " in err
    # When it asks for one at a time, the cursor goes on
    code, out, err = cli(shop, "--json", "search", "orders.Total>2000", "--limit", "1")
    first = json.loads(out)
    assert [m["promoted"]["orders.Id"] for m in first["found"]] == ["A6"]
    assert first["found"][0]["state"] == "suspended"  # a US order: a routing failure
    code, out, err = cli(shop, "--json", "search", "orders.Total>2000", "--after", first["next"])
    assert [m["promoted"]["orders.Id"] for m in json.loads(out)["found"]] == ["A5", "A4", "A3"]
    # and with no filter it lists every message of the window, every property shown
    code, out, err = cli(shop, "search", "--since", "1h", "--scan", "2")
    assert code == 0
    assert len(out.splitlines()) == 3
    assert 'orders.Id="A6", orders.Total=6000, orders.Region="US"' in out
    assert "went through 2 messages" in err
    assert "the most one search goes through: --after " in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["orders.Total >> 5000"], "filter text, column 15: expected a value after '>'"),
        (["orders.Total > 1e999"], "not finite"),
        (["(" * 150 + "a.B == 1" + ")" * 150], "nest"),
        (["a.B == 1", "--since", "yesterday"], "--since 'yesterday': expected an age"),
        (["a.B == 1", "--until", "2024-05-01T10:00:00"], "--until '2024-05-01T10:00:00'"),
        (["a.B == 1", "--since", "1h", "--until", "2h"], "the window is empty"),
        (["a.B == 1", "--since", "999999999w"], "--since '999999999w': too long an age"),
        (["a.B == 1", "--since", "0001-01-01T00:00:00+01:00"], "outside the years 1 to 9999"),
        (["a.B == 1", "--limit", "5000"], "limit must be an int from 1 to 1,000"),
        (["a.B == 1", "--scan", "0"], "--scan: 0 is not positive"),
        (["a.B == 1", "--after", "nope"], "cursor 'nope' is not one a search gave"),
        (["@/no/such/file"], "cannot read"),
    ],
)
def test_bad_searches_exit_2_naming_the_problem(
    shop: MessageBox, args: list[str], says: str
) -> None:
    code, out, err = cli(shop, "search", *args)
    assert (code, out) == (2, "")
    assert says in err
    assert "Traceback" not in err


def browser(box: MessageBox) -> TestClient:
    return TestClient(create_app(box), base_url="http://127.0.0.1:8080", follow_redirects=False)


def found_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="found-([0-9a-f-]+)">', html)


def test_search_from_the_console(shop: MessageBox) -> None:
    b = browser(shop)
    ids = {m.promoted["orders.Id"]: str(m.id) for m in shop.search(None).found}
    # An empty form searches nothing yet
    empty = b.get("/search")
    assert empty.status_code == 200
    assert 'id="found"' not in empty.text
    # A range and an equality: newest first, with the states, the properties named
    page = b.get("/search", params={"q": 'orders.Total >= 2000 and orders.Region == "EU"'})
    assert found_ids(page.text) == [ids["A5"], ids["A4"], ids["A2"]]
    assert '<td class="state-queued">queued</td>' in page.text
    assert "<code>orders.Total=5000</code>" in page.text
    assert "Searched all 6 messages" in page.text
    # A limit, and the link to the older matches
    one = b.get("/search", params={"q": "orders.Total > 0", "limit": "2", "since": "2h"})
    assert found_ids(one.text) == [ids["A6"], ids["A5"]]
    assert '<td class="state-suspended">suspended</td>' in one.text
    more = re.search(r'<a href="([^"]+)" id="more">Older matches</a>', one.text)
    assert more is not None
    older = b.get("/search" + more.group(1).replace("&amp;", "&"))
    assert found_ids(older.text) == [ids["A4"], ids["A3"]]
    # NAME=VALUE, typed as on the command line, is an equality
    assert found_ids(b.get("/search", params={"q": "orders.Id=A3"}).text) == [ids["A3"]]
    nothing = b.get("/search", params={"q": "orders.Total > 99999"})
    assert 'id="not-found"' in nothing.text


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"q": "orders.Total >> 5000"}, "expected a value after"),
        ({"q": "orders.Total > 1e999"}, "not finite"),
        ({"q": "a.B == 1 or " * 3000 + "a.B == 2"}, "a search takes at most 20,000"),
        ({"q": "a.B == 1", "since": "last week"}, "since &#39;last week&#39;: expected an age"),
        ({"q": "a.B == 1", "until": "999999999w"}, "too long an age"),
        ({"q": "a.B == 1", "since": "0001-01-01T00:30:00+01:00"}, "outside the years 1 to 9999"),
        ({"q": "a.B == 1", "limit": "0"}, "limit must be an int from 1 to 1,000"),
        ({"q": "a.B == 1", "limit": "-3"}, "limit &#39;-3&#39; is not a whole number"),
        ({"q": "a.B == 1", "after": "x"}, "cursor &#39;x&#39; is not one a search gave"),
        ({"q": "orders.Zip:blob=1"}, "NAME=VALUE"),
    ],
)
def test_bad_searches_in_the_console_are_a_400_page_saying_why(
    shop: MessageBox, params: dict[str, str], says: str
) -> None:
    page = browser(shop).get("/search", params=params)
    assert page.status_code == 400
    error = re.search(r'<p class="error" id="search-error">(.*?)</p>', page.text, re.S)
    assert error is not None
    assert says in error.group(1)
    assert 'id="search"' in page.text  # the form, to correct it
