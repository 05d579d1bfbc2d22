"""The overview's charts over a window of 1, 6 or 24 hours (a point a minute, 5 or 15
minutes), their time labels inside the drawing, and tracked events shown to the
millisecond, on both backends."""

from __future__ import annotations

import json
import re
import warnings
from datetime import UTC, datetime, timedelta

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from messagebox import Message, MessageBox
from messagebox.console import create_app
from messagebox.console.charts import RIGHT, WIDTH, line_chart, peaks, summed
from messagebox.predicates import P

with warnings.catch_warnings():  # starlette 1.x prefers httpx2, and warns with httpx
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient


@pytest.fixture
def busy(box: MessageBox) -> MessageBox:
    """Four messages published and counted, and the host's depth sampled."""
    box.create_host("h")
    box.subscribe("s", host="h", filter=P("t.N") >= 0)
    box.publish([Message(b"x", promoted={"t.N": i}) for i in range(4)])
    box.store.write_tally()
    box.operations.sample_depth("h", "test")
    return box


def _page(box: MessageBox, query: str = "") -> str:
    answer = TestClient(create_app(box), base_url="http://127.0.0.1:8080").get("/" + query)
    assert answer.status_code == 200, answer.text
    return answer.text


def _chart(html: str, chart_id: str) -> tuple[dict[str, int], int]:
    """A chart's totals and how many points its first line has."""
    svg = re.search(rf'<svg[^>]*id="{chart_id}".*?</svg>', html, re.S)
    assert svg, html
    totals = re.search(r"data-totals='([^']*)'", svg.group(0))
    assert totals
    line = re.search(r'<polyline[^>]*points="([^"]*)"', svg.group(0))
    assert line
    return json.loads(totals.group(1).replace("&#34;", '"')), len(line.group(1).split())


@pytest.mark.parametrize(
    ("query", "title", "points"),
    [
        ("", "Last hour", 60),
        ("?window=6h", "Last 6 hours", 72),
        ("?window=24h", "Last 24 hours", 96),
    ],
)
def test_the_overview_charts_the_window_asked_for(
    busy: MessageBox, query: str, title: str, points: int
) -> None:
    html = _page(busy, query)
    assert f"<h2>{title}</h2>" in html
    totals, drawn = _chart(html, "chart-rates")
    assert drawn == points
    assert totals == {
        "published": 4,
        "routed": 4,
        "delivered": 0,
        "failed": 0,
        "suspended": 0,
        "expired": 0,
    }
    depth, _ = _chart(html, "chart-depth")
    assert depth == {"h": 4}  # the one sample, in one point whatever the window
    links = re.search(r'<p class="windows" id="chart-windows">(.*?)</p>', html, re.S)
    assert links
    assert links.group(1).count("<a ") == 2  # the other two windows


def test_an_unknown_window_is_refused(busy: MessageBox) -> None:
    answer = TestClient(create_app(busy), base_url="http://127.0.0.1:8080").get("/?window=2d")
    assert answer.status_code == 400
    assert "1h, 6h, 24h" in answer.text


def test_counts_are_summed_and_depths_peak_per_point() -> None:
    assert summed([1, 2, 3, 4, 5, 6], 3) == [6, 15]
    assert peaks([None, 2, 1, None, None, None], 3) == [2, None]


def test_the_first_and_last_time_labels_stay_inside_the_drawing() -> None:
    start = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    minutes = [start + timedelta(minutes=i) for i in range(60)]
    svg = str(line_chart("c", "t", minutes, {"a": list(range(60))}, "per min"))
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)"[^>]*>(\d\d:\d\d)<', svg)
    assert [(anchor, text) for _, anchor, text in labels] == [
        ("start", "10:00"),
        ("middle", "10:30"),
        ("end", "10:59"),
    ]
    assert float(labels[-1][0]) <= WIDTH - RIGHT  # its text ends at the plot's edge


def test_tracked_events_are_shown_to_the_millisecond(busy: MessageBox) -> None:
    busy.configure_tracking(True)
    [routed] = busy.publish([Message(b"y", promoted={"t.N": 9})])
    client = TestClient(create_app(busy), base_url="http://127.0.0.1:8080")
    for page in (f"/tracking?message={routed.message_id}", f"/messages/{routed.message_id}"):
        html = client.get(page).text
        cells = re.findall(r"<td>(\d{4}-\d\d-\d\dT[\d:.]+\+00:00)</td>", html)
        assert cells, page
        assert all(re.fullmatch(r".*T\d\d:\d\d:\d\d\.\d{3}\+00:00", c) for c in cells), cells
