"""Line charts as inline SVG, drawn here so a report page needs no script, font or network to show them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 600, 280
LEFT, RIGHT, TOP, BOTTOM = (
    72,
    16,
    52,
    48,
)  # room for tick labels, the title, the y label above and the x label


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering [low, high]."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def number(value: float) -> str:
    """A tick label: thousands separators, decimals only where the value has them."""
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def line_chart(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    mean: float | None = None,
    unit: str = "",
    colour: str = "#1f6feb",
) -> str:
    """A polyline with a marker per point, labelled axes with round ticks and a dashed mean line.

    The y axis starts at zero (rates compared by eye must not be exaggerated)."""
    if not points:
        return f'<p class="empty">{escape(title)}: no data yet.</p>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks = nice_ticks(min(0.0, min(xs)), max(xs))
    y_ticks = nice_ticks(0.0, max(max(ys), mean or 0.0) or 1.0)
    box = _Box(x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1])
    coords = " ".join(f"{box.x(x):.1f},{box.y(y):.1f}" for x, y in points)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}"'
        ">",  # inline in HTML: no namespace needed
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="20" class="chart-title">{escape(title)}</text>',
        *_axes(box, x_ticks, y_ticks, x_label, y_label),
        f'<polyline class="series" points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>',
        *(
            f'<circle cx="{box.x(x):.1f}" cy="{box.y(y):.1f}" r="2.5" fill="{colour}">'
            f"<title>{escape(number(round(x, 2)))}: {escape(number(round(y, 1)))} {escape(unit)}</title></circle>"
            for x, y in points
        ),
    ]
    if mean is not None:
        y = box.y(mean)
        parts.append(
            f'<line class="mean" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"'
            ' stroke="#cf222e" stroke-dasharray="5 4"/>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{y - 6:.1f}" text-anchor="end" class="mean-label">'
            f"mean {escape(number(round(mean, 1)))} {escape(unit)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


class _Box:
    """Data coordinates to SVG coordinates inside the plot area."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1 if x1 > x0 else x0 + 1, y0, y1 if y1 > y0 else y0 + 1

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)


def _axes(box: _Box, x_ticks: list[float], y_ticks: list[float], x_label: str, y_label: str) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = []
    for tick in y_ticks:
        y = box.y(tick)
        parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eaeef2"/>')
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{number(tick)}</text>'
        )
    for tick in x_ticks:
        x = box.x(tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#57606a"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle" class="tick">{number(tick)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#57606a"/>'
    )
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#57606a"/>')
    middle_x = (LEFT + right) / 2
    parts.append(
        f'<text x="{middle_x:.1f}" y="{HEIGHT - 8}" text-anchor="middle" class="axis-label">{escape(x_label)}</text>'
    )
    parts.append(  # above the axis, level: a rotated label at the edge ran into wide tick labels
        f'<text x="{LEFT - 6}" y="{TOP - 12}" text-anchor="start" class="axis-label">{escape(y_label)}</text>'
    )
    return parts
