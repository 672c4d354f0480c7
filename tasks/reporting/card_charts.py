"""The model card's pictures, written as SVG and embedded as data URIs.

A markdown image ``![alt](data:image/svg+xml;base64,...)`` shows inline in the Prefect UI: the v2
UI's markdown renderer (the default in Prefect 3.9) lets every ``data:image/`` source of an
``img`` through its URL filter and sanitiser, and the v1 UI renders image tokens as plain
``<img>`` tags (an SVG in an ``img`` runs no script). The card thus needs no file server and no
access to the store from the browser. Two small charts need no plotting library: writing them
takes about a millisecond where matplotlib took 0.6 s per card (and 0.5 s to import).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from tasks.ml.metrics import LiftGroup, ReliabilityBin

COLOURS = {"model": "#1f77b4", "model (raw)": "#aec7e8", "baseline": "#ff7f0e"}
REFERENCE = "#999999"
DASHED = ' stroke-dasharray="4 3"'
WIDTH, HEIGHT = 420, 310
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 30, 44  # the plot area's margins


def svg_data_uri(svg: str) -> str:
    """``data:image/svg+xml;base64,...`` for an SVG document."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


@dataclass(frozen=True)
class _Plot:
    """The plot area's mapping from data to pixels."""

    x_min: float
    x_max: float
    y_min: float
    y_max: float

    def x(self, value: float) -> float:
        span = WIDTH - LEFT - RIGHT
        return LEFT + (value - self.x_min) / (self.x_max - self.x_min) * span

    def y(self, value: float) -> float:
        span = HEIGHT - TOP - BOTTOM
        return HEIGHT - BOTTOM - (value - self.y_min) / (self.y_max - self.y_min) * span


def reliability_svg(curves: dict[str, list[ReliabilityBin]], title: str) -> str:
    """Observed rate against mean score per bin, one line per model, with the diagonal a
    perfectly calibrated model lies on."""
    plot = _Plot(0.0, 1.0, 0.0, 1.0)
    ticks = _ticks(1.0)
    parts = _axes(plot, ticks, ticks, "mean predicted probability", "observed rate")
    parts.append(_line([(0.0, 0.0), (1.0, 1.0)], plot, REFERENCE, dashed=True))
    legend = [("perfect", REFERENCE, True)]
    for name, bins in curves.items():
        points = [
            (b.mean_score, b.observed_rate)
            for b in bins
            if b.mean_score is not None and b.observed_rate is not None
        ]
        colour = COLOURS.get(name, "#333333")
        parts.append(_line(points, plot, colour, name=name))
        parts += [
            f'<circle cx="{plot.x(x):.1f}" cy="{plot.y(y):.1f}" r="2.5" fill="{colour}"/>'
            for x, y in points
        ]
        legend.append((name, colour, False))
    return _document(title, parts + _legend(legend))


def lift_svg(curves: dict[str, list[LiftGroup]], title: str) -> str:
    """Lift over the base rate per score decile (1 = highest scores), grouped bars per model."""
    highest = max([g.lift for gs in curves.values() for g in gs if math.isfinite(g.lift)] + [1.0])
    plot = _Plot(0.5, 10.5, 0.0, _nice_ceiling(highest * 1.05))
    y_ticks = _ticks(plot.y_max)
    parts = _axes(plot, list(range(1, 11)), y_ticks, "score decile (1 = highest)", "lift")
    width = 0.8 / max(len(curves), 1)
    legend = []
    for i, (name, groups) in enumerate(curves.items()):
        colour = COLOURS.get(name, "#333333")
        for g in (g for g in groups if math.isfinite(g.lift)):
            left = g.decile - 0.4 + i * width
            top = plot.y(max(g.lift, 0.0))
            parts.append(
                f'<rect class="bar" data-model={quoteattr(name)} x="{plot.x(left):.1f}" '
                f'y="{top:.1f}" width="{plot.x(left + width) - plot.x(left):.1f}" '
                f'height="{plot.y(0.0) - top:.1f}" fill="{colour}"/>'
            )
        legend.append((name, colour, False))
    parts.append(_line([(0.5, 1.0), (10.5, 1.0)], plot, REFERENCE, dashed=True))
    return _document(title, parts + _legend(legend, right=True))  # the tall bars are left


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value``."""
    power = 10 ** math.floor(math.log10(value))
    return next(f * power for f in (1, 2, 2.5, 5, 10) if f * power >= value)


def _ticks(top: float) -> list[float]:
    return [top * i / 5 for i in range(6)]


def _label(value: float) -> str:
    return f"{value:g}"


def _axes(
    plot: _Plot, x_ticks: Iterable[float], y_ticks: Iterable[float], x_title: str, y_title: str
) -> list[str]:
    """Grid lines, tick labels and axis titles."""
    bottom, left = HEIGHT - BOTTOM, LEFT
    parts = [
        f'<rect x="{left}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
        f'height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#333333"/>'
    ]
    for t in x_ticks:
        x = plot.x(t)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{_label(t)}</text>')
    for t in y_ticks:
        y = plot.y(t)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{_label(t)}</text>')
    parts.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" '
        f'text-anchor="middle">{escape(x_title)}</text>'
    )
    middle = (TOP + HEIGHT - BOTTOM) / 2
    parts.append(
        f'<text x="14" y="{middle}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle})">{escape(y_title)}</text>'
    )
    return parts


def _line(
    points: list[tuple[float, float]],
    plot: _Plot,
    colour: str,
    *,
    dashed: bool = False,
    name: str | None = None,
) -> str:
    coordinates = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in points)
    dash = DASHED if dashed else ""
    model = f" data-model={quoteattr(name)}" if name is not None else ""
    return (
        f'<polyline{model} points="{coordinates}" fill="none" stroke="{colour}" '
        f'stroke-width="{1 if dashed else 1.6}"{dash}/>'
    )


def _legend(entries: list[tuple[str, str, bool]], *, right: bool = False) -> list[str]:
    """A key in the plot's top-left (or top-right) corner."""
    x = WIDTH - RIGHT - 100 if right else LEFT + 8
    parts = []
    for i, (name, colour, dashed) in enumerate(entries):
        y = TOP + 12 + i * 14
        dash = DASHED if dashed else ""
        parts.append(
            f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" '
            f'stroke="{colour}" stroke-width="3"{dash}/>'
        )
        parts.append(f'<text x="{x + 20}" y="{y}">{escape(name)}</text>')
    return parts


def _document(title: str, parts: list[str]) -> str:
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="10">\n'
        "<style>.grid{stroke:#dddddd;stroke-width:0.6}</style>\n"
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>\n'
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="12">'
        f"{escape(title)}</text>\n{body}\n</svg>\n"
    )


def leaderboard_svg(losses: dict[str, float], floor: float | None, title: str) -> str:
    """One bar per contender: its calibrated log loss (lower is better; the champion, listed
    first, in the model colour), and the RFM baseline's as a dashed line when known."""
    top = max([*losses.values(), floor or 0.0, 1e-3])
    plot = _Plot(0.0, _nice_ceiling(top * 1.05), 0.0, float(max(len(losses), 1)))
    parts = _axes(plot, _ticks(plot.x_max), [], "log loss (lower is better)", "")
    height = 0.6
    for i, (name, loss) in enumerate(losses.items()):
        y_top, y_bottom = plot.y(plot.y_max - i - 0.2), plot.y(plot.y_max - i - 0.2 - height)
        colour = COLOURS["model"] if i == 0 else COLOURS["model (raw)"]
        parts.append(
            f'<rect class="bar" data-model={quoteattr(name)} x="{plot.x(0.0):.1f}" '
            f'y="{y_top:.1f}" width="{plot.x(loss) - plot.x(0.0):.1f}" '
            f'height="{y_bottom - y_top:.1f}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{plot.x(0.0) + 4:.1f}" y="{(y_top + y_bottom) / 2 + 4:.1f}">'
            f"{escape(name)} {loss:.4f}</text>"
        )
    legend = [("champion", COLOURS["model"], False), ("contender", COLOURS["model (raw)"], False)]
    if floor is not None:
        parts.append(
            _line([(floor, 0.0), (floor, plot.y_max)], plot, COLOURS["baseline"], dashed=True)
        )
        legend.append(("RFM baseline", COLOURS["baseline"], True))
    return _document(title, parts + _legend(legend, right=True))
