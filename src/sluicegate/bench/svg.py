"""Line charts as inline SVG: readable in any browser, no plotting library to install.

A missing value (NaN, or None as JSON writes NaN) breaks a line rather than drawing it
down to zero, so a chart can be drawn again from a saved summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 860, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 300, 28, 40
LEGEND_CHARS = 44
PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
MAX_LINES = len(PALETTE)
_DASHED = ' stroke-dasharray="5,4"'
Points = Sequence[tuple[float, float | None]]
Spot = tuple[float, float]
"""A point in the SVG's own coordinates."""


def line_chart(
    title: str,
    lines: Mapping[str, Points],
    *,
    x_label: str = "seconds since start",
    y_label: str = "",
    marks: Mapping[str, float] | None = None,
) -> str:
    """At most MAX_LINES lines, each with its legend entry; `marks` are dashed levels."""
    shown = dict(list(lines.items())[:MAX_LINES])
    marks = marks or {}
    xs = [x for points in shown.values() for x, _ in points]
    ys = [y for points in shown.values() for _, y in points if y is not None and not math.isnan(y)]
    x_top = _nice_top(max(xs, default=1.0))
    y_top = _nice_top(max([*ys, *marks.values()], default=1.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> Spot:
        return LEFT + plot_w * x / x_top, TOP + plot_h * (1 - y / y_top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
        *_axes(x_top, y_top, plot_w, plot_h, x_label, y_label),
    ]
    for index, (name, points) in enumerate(shown.items()):
        colour = PALETTE[index]
        parts.append(f'<path d="{_path(points, at)}" fill="none" stroke="{colour}"/>')
        parts.append(_dots(points, at, colour))
        parts.append(_legend(index, name, colour))
    for index, (name, level) in enumerate(marks.items()):
        colour = PALETTE[(len(shown) + index) % MAX_LINES]
        (x1, y1), (x2, y2) = at(0, level), at(x_top, level)
        parts.append(_line(x1, y1, x2, y2, colour, _DASHED))
        parts.append(_legend(len(shown) + index, name, colour, dashed=True))
    parts.append("</svg>")
    return "\n".join(parts)


def _path(points: Points, at: Callable[[float, float], Spot]) -> str:
    commands: list[str] = []
    pen_down = False
    for x, y in points:
        if y is None or math.isnan(y):
            pen_down = False
            continue
        spot_x, spot_y = at(x, y)
        commands.append(f"{'L' if pen_down else 'M'}{spot_x:.1f},{spot_y:.1f}")
        pen_down = True
    return " ".join(commands)


def _dots(points: Points, at: Callable[[float, float], Spot], colour: str) -> str:
    """A dot per value, so a value between two missing ones still shows."""
    spots = [at(x, y) for x, y in points if y is not None and not math.isnan(y)]
    dots = "".join(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="1.5"/>' for cx, cy in spots)
    return f'<g fill="{colour}">{dots}</g>'


def _axes(
    x_top: float, y_top: float, plot_w: float, plot_h: float, x_label: str, y_label: str
) -> list[str]:
    bottom = TOP + plot_h
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/>',
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
        f"{escape(x_label)}</text>",
        f'<text x="12" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2})">{escape(y_label)}</text>',
    ]
    for tick in _ticks(x_top):
        x = LEFT + plot_w * tick / x_top
        parts.append(_line(x, bottom, x, bottom + 4, "#999"))
        parts.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{tick:g}</text>')
    for tick in _ticks(y_top):
        y = TOP + plot_h * (1 - tick / y_top)
        parts.append(_line(LEFT, y, LEFT + plot_w, y, "#eee"))
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
    return parts


def _line(x1: float, y1: float, x2: float, y2: float, colour: str, extra: str = "") -> str:
    ends = f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"'
    return f'<line {ends} stroke="{colour}"{extra}/>'


def _legend(index: int, name: str, colour: str, *, dashed: bool = False) -> str:
    x, y = WIDTH - RIGHT + 12, TOP + 8 + 16 * index
    extra = ' stroke-width="2"' + (_DASHED if dashed else "")
    return _line(x, y, x + 18, y, colour, extra) + (
        f'<text x="{x + 24}" y="{y + 4}">{escape(name[:LEGEND_CHARS])}</text>'
    )


def _step(top: float) -> float:
    """1, 2 or 5 times a power of ten, giving four to eight ticks up to `top`."""
    raw = top / 8
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _nice_top(value: float) -> float:
    if not value > 0 or math.isinf(value):
        return 1.0
    step = _step(value)
    return step * math.ceil(value / step)


def _ticks(top: float) -> list[float]:
    step = _step(top)
    return [round(step * index, 10) for index in range(round(top / step) + 1)]
