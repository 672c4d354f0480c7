"""The model card's pictures, drawn with matplotlib and embedded as PNG data URIs.

A markdown image ``![alt](data:image/png;base64,...)`` shows inline in the Prefect UI: the v2
UI's markdown renderer (the default in Prefect 3.9) explicitly lets ``data:image/`` sources
through its URL filter and sanitiser, and the v1 UI renders image tokens as plain ``<img>`` tags.
The card thus needs no file server and no access to the store from the browser.
"""

from __future__ import annotations

import base64
import io

from tasks.ml.metrics import LiftGroup, ReliabilityBin

COLOURS = {"model": "#1f77b4", "model (raw)": "#aec7e8", "baseline": "#ff7f0e"}
FIGSIZE = (4.6, 3.4)
DPI = 90


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def reliability_png(curves: dict[str, list[ReliabilityBin]], title: str) -> bytes:
    """Observed rate against mean score per bin, one line per model, with the diagonal a
    perfectly calibrated model lies on."""
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1, label="perfect")
    for name, bins in curves.items():
        filled = [b for b in bins if b.mean_score is not None and b.observed_rate is not None]
        ax.plot(
            [b.mean_score for b in filled],
            [b.observed_rate for b in filled],
            marker="o",
            markersize=4,
            color=COLOURS.get(name),
            label=name,
        )
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean predicted probability", ylabel="observed rate")
    return _png(fig, ax, title)


def lift_png(curves: dict[str, list[LiftGroup]], title: str) -> bytes:
    """Lift over the base rate per score decile (1 = highest scores), grouped bars per model."""
    fig, ax = _figure()
    width = 0.8 / max(len(curves), 1)
    for i, (name, groups) in enumerate(curves.items()):
        ax.bar(
            [g.decile + (i - (len(curves) - 1) / 2) * width for g in groups],
            [g.lift for g in groups],
            width=width,
            color=COLOURS.get(name),
            label=name,
        )
    ax.axhline(1.0, color="#999999", linestyle="--", linewidth=1)
    ax.set(xticks=range(1, 11), xlabel="score decile (1 = highest)", ylabel="lift over base rate")
    return _png(fig, ax, title)


def _figure():
    from matplotlib.figure import Figure  # imported when a card is drawn, not with the stage

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    return fig, fig.subplots()


def _png(fig, ax, title: str) -> bytes:
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
