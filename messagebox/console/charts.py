"""Line charts drawn on the server as inline SVG: the console sends no script (its
Content-Security-Policy allows none), so a chart is markup, and a page that refreshes
itself redraws it. Each chart carries its numbers too: a ``<title>`` and ``<desc>`` for
screen readers and a ``data-totals`` attribute (each series' sum) for tests and scripts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from markupsafe import Markup, escape

if TYPE_CHECKING:
    from messagebox.storage.rollup import Rates

WIDTH = 640
HEIGHT = 170
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 40
COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#17becf")


@dataclass(frozen=True)
class Window:
    """A span of time a chart shows: ``minutes`` of them, ``per`` minutes a point."""

    name: str
    """As the overview's ``?window=`` gives it: ``1h``, ``6h``, ``24h``."""
    title: str
    span: str
    """Its length, for people: ``60 minutes``."""
    minutes: int
    per: int

    @property
    def step(self) -> str:
        """A point's span, for people: ``minute``, ``5 minutes``."""
        return "minute" if self.per == 1 else f"{self.per} minutes"


WINDOWS = {
    w.name: w
    for w in (
        Window("1h", "Last hour", "60 minutes", 60, 1),
        Window("6h", "Last 6 hours", "6 hours", 360, 5),
        Window("24h", "Last 24 hours", "24 hours", 1440, 15),
    )
}
"""The overview's chart windows (the per-minute rates are kept a day)."""


def summed(values: Sequence[int], per: int) -> list[int]:
    """Per-minute counts as counts per ``per`` minutes."""
    return [sum(values[i : i + per]) for i in range(0, len(values), per)]


def peaks(values: Sequence[int | None], per: int) -> list[int | None]:
    """Per-minute samples as the highest of each ``per`` minutes (None: none taken)."""
    out: list[int | None] = []
    for i in range(0, len(values), per):
        taken = [v for v in values[i : i + per] if v is not None]
        out.append(max(taken) if taken else None)
    return out


def overview(rates: Rates, window: Window, events: Sequence[str]) -> list[Markup]:
    """The overview's charts of ``rates`` over ``window``: the ``events`` per point of
    it, and each host's queue depth (the highest sample of a point's minutes)."""
    points = rates.minutes[:: window.per]
    per_point = "per min" if window.per == 1 else f"per {window.per} min"
    highest = "" if window.per == 1 else f"; the highest of each {window.step}"
    return [
        line_chart(
            "chart-rates",
            f"Messages per {window.step}, last {window.span}",
            points,
            {e: summed(rates.totals(e), window.per) for e in events},
            per_point,
            window.span,
        ),
        line_chart(
            "chart-depth",
            f"Queue depth by host (sampled{highest})",
            points,
            {h: peaks(v, window.per) for h, v in sorted(rates.depths.items())},
            "entries",
            window.span,
        ),
    ]


def _nice(top: float) -> int:
    """A round number at or above ``top`` for the axis (1, 2, 5 × 10^k)."""
    if top <= 1:
        return 1
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= top:
                return m * step
        step *= 10


def line_chart(
    chart_id: str,
    title: str,
    minutes: Sequence[datetime],
    series: Mapping[str, Sequence[int | None]],
    unit: str,
    span: str | None = None,
) -> Markup:
    """An SVG chart of ``series`` (label → one value per point of ``minutes``; None: no
    sample), over ``span`` (said in its description; ``N minutes`` by default). The
    first and last times are labelled from the plot's edges inwards, so neither is cut
    off."""
    n = len(minutes)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = _nice(max([v for vs in series.values() for v in vs if v is not None] or [0]))
    totals = {label: sum(v or 0 for v in values) for label, values in series.items()}

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (n - 1) if n > 1 else 0)

    def y(v: int) -> float:
        return TOP + plot_h - plot_h * v / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-title" '
        f"data-totals='{escape(json.dumps(totals))}'>",
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        "<desc>"
        + escape(
            "; ".join(
                f"{label}: {totals[label]} in {span or f'{n} minutes'}, last {_last(vs)}"
                for label, vs in series.items()
            )
            or "no data"
        )
        + "</desc>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{WIDTH - RIGHT}" y2="{TOP}" stroke="#eee"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" font-size="10">{top}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" font-size="10">0</text>',
        f'<text x="4" y="{TOP + plot_h / 2}" font-size="10">{escape(unit)}</text>',
    ]
    for i in sorted({0, n // 2, n - 1}) if n else ():
        anchor = "start" if i == 0 else "end" if i == n - 1 else "middle"
        parts.append(
            f'<text x="{x(i):.1f}" y="{TOP + plot_h + 12}" text-anchor="{anchor}" '
            f'font-size="10">{minutes[i]:%H:%M}</text>'
        )
    for k, (label, values) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values) if v is not None)
        if points:
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'
            )
        lx = LEFT + 110 * k
        parts.append(
            f'<rect x="{lx}" y="{HEIGHT - 14}" width="10" height="3" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{HEIGHT - 10}" font-size="10">{escape(label)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _last(values: Sequence[int | None]) -> str:
    for v in reversed(values):
        if v is not None:
            return str(v)
    return "none"
