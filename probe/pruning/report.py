"""The report section of a pruning run: the curves as one inline SVG plot (drawn from the data in
Python: no image library, nothing fetched, so the page's strict Content-Security-Policy holds),
the curve table, the importance heatmap (canvas, like every heatmap of the page), the pruned copy's
size and speed, and ``pruning.csv`` beside ``index.html``.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it shows a
section when ``result.results["pruning"]`` holds a :class:`~probe.pruning.experiment.PruneResult`.
"""

from __future__ import annotations

import math

import numpy as np
from markupsafe import Markup, escape

from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from .experiment import curves_csv

#: Colours of the curves (Okabe-Ito, colour-blind safe) and their dash patterns.
STYLE = {"importance": ("#0072B2", ""), "redundancy": ("#D55E00", "6 3"), "random": ("#555555", "2 3")}
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 720, 340, 64, 190, 28, 46


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 2.5, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def curve_svg(curves, objective: str, unit: str) -> Markup:
    """One plot of every order's curve: value (y) against the fraction of heads pruned (x); the
    random order as its mean with a band of +-1 standard deviation.

    Args:
        curves: the rows of :attr:`~probe.pruning.experiment.PruneResult.curves`.
    """
    x_max = float(curves["fraction"].max()) or 1.0
    lows = curves["value"] - curves["std"].fillna(0)
    highs = curves["value"] + curves["std"].fillna(0)
    y_lo, y_hi = float(lows.min()), float(highs.max())
    pad = (y_hi - y_lo) * 0.05 or abs(y_hi) * 0.05 or 1.0
    y_lo, y_hi = y_lo - pad, y_hi + pad
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def X(v):
        return LEFT + v / x_max * pw

    def Y(v):
        return TOP + (y_hi - v) / (y_hi - y_lo) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
           f'height="{HEIGHT}" role="img" aria-label="pruning curves" class="prune-plot" font-size="11" '
           'font-family="sans-serif">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for t in _ticks(0, x_max):
        out.append(f'<line x1="{X(t):.1f}" y1="{TOP + ph}" x2="{X(t):.1f}" y2="{TOP + ph + 4}" stroke="#999"/>'
                   f'<text x="{X(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{100 * t:.0f}%</text>')
    for t in _ticks(y_lo, y_hi):
        out.append(f'<line x1="{LEFT - 4}" y1="{Y(t):.1f}" x2="{LEFT + pw}" y2="{Y(t):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:.4g}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
               'heads pruned (share of all heads)</text>')
    out.append(f'<text transform="translate(14 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(objective)} ({escape(unit)}), held-out text</text>')
    legend_y = TOP + 6
    for order, rows in curves.groupby("order", sort=False):
        color, dash = STYLE.get(order, ("#000", ""))
        pts = [(X(f), Y(v)) for f, v in zip(rows["fraction"], rows["value"])]
        if order == "random":
            upper = [(X(f), Y(v + s)) for f, v, s in zip(rows["fraction"], rows["value"], rows["std"])]
            lower = [(X(f), Y(v - s)) for f, v, s in zip(rows["fraction"], rows["value"], rows["std"])]
            band = " ".join(f"{a:.1f},{b:.1f}" for a, b in upper + lower[::-1])
            out.append(f'<polygon points="{band}" fill="{color}" fill-opacity="0.15" stroke="none" '
                       'data-band="random"/>')
        line = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2" '
                   f'stroke-dasharray="{dash}" data-order="{escape(order)}"/>')
        out.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>' for a, b in pts)
        label = "random (mean \u00b1 1 sd)" if order == "random" else order
        lx = LEFT + pw + 10
        out.append(f'<line x1="{lx}" y1="{legend_y}" x2="{lx + 22}" y2="{legend_y}" stroke="{color}" '
                   f'stroke-width="2" stroke-dasharray="{dash}"/><text x="{lx + 27}" y="{legend_y + 4}">'
                   f'{escape(label)}</text>')
        legend_y += 18
    out.append("</svg>")
    return Markup("".join(out))


def _importance_figure(pr) -> dict:
    L, H = pr.importance.shape
    vals = pr.importance.ravel()
    return {
        "rows": L, "cols": H, "scale": 10000, "vmin": 0.0, "vmax": float(np.nanmax(vals)) if np.isfinite(vals).any()
        else 1.0, "cmap": "viridis", "title": "head importance (normalized per layer; grey: removed)",
        "values": [None if not np.isfinite(v) else int(round(v * 10000)) for v in vals],
        "rowLabels": [str(i) for i in range(L)], "colLabels": [str(i) for i in range(H)],
        "xLabel": "head", "yLabel": "layer", "unit": "",
    }


@section_builder
def section(result, tokenizer) -> Section | None:
    """The pruning section, or None when the run has no pruning result."""
    pr = getattr(result, "results", {}).get("pruning")
    if pr is None:
        return None
    table = [[r.order, r.step, f"{100 * r.fraction:.1f}%", r.n_pruned, f"{r.value:.6g}",
              "" if not np.isfinite(r.std) else f"{r.std:.3g}", ", ".join(head_name(a, b) for a, b in r.heads)]
             for r in pr.curves.itertuples()]
    html = render_fragment("pruning.html.j2", pr=pr, svg=curve_svg(pr.curves, pr.objective, pr.unit), table=table,
                           columns=["order", "step", "pruned", "heads", "value", "std", "heads pruned at this step"])
    return Section(id="pruning", title="Head pruning", html=html, order=41,
                   figures={"prune-importance": _importance_figure(pr)},
                   files={"pruning.csv": curves_csv(pr.curves)},
                   record=pr.record())
