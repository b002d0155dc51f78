"""The report section of an effects run: heatmaps of the mean- and zero-ablation effects beside the
primary-label grid, the label -> effect table with its random baseline, the induction claim on
decoders, and effects.csv / label_effects.csv beside ``index.html``.

The builder (:func:`section`) is listed in :data:`probe.report.builders.BUILDERS`; it shows a section
when ``result.results["effects"]`` holds an :class:`~probe.effects.measure.EffectsResult`.
"""

from __future__ import annotations

import numpy as np

from ..report.sections import Section, render_fragment
from .ablation import KINDS
from .induction import claim_lines
from .measure import LABEL_COLUMNS

#: Figure scale: effects are drawn as integers of 1 / SCALE objective units.
SCALE = 100000


def _figure(frame, kind: str, unit: str) -> dict:
    L, H = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    vals = frame[f"effect_{kind}"].to_numpy(dtype=float)
    finite = vals[np.isfinite(vals)]
    lo, hi = (min(0.0, float(finite.min())), float(finite.max())) if len(finite) else (0.0, 1.0)
    return {"rows": L, "cols": H, "scale": SCALE, "vmin": lo, "vmax": hi if hi > lo else lo + 1.0, "cmap": "viridis",
            "title": f"{kind} ablation: objective change ({unit}; > 0 = worse)",
            "values": [None if not np.isfinite(v) else int(round(v * SCALE)) for v in vals],
            "rowLabels": [str(i) for i in range(L)], "colLabels": [str(i) for i in range(H)],
            "xLabel": "head", "yLabel": "layer", "unit": unit}


def _grid(heads, n_layers: int, n_heads: int) -> list[list[str]]:
    grid = [[""] * n_heads for _ in range(n_layers)]
    for row in heads.itertuples():
        grid[int(row.layer)][int(row.head)] = str(row.label)
    return grid


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)


def section(result, tokenizer) -> Section | None:
    """The effects section, or None when the run has no effects result."""
    er = getattr(result, "results", {}).get("effects")
    if er is None:
        return None
    L, H = int(er.heads["layer"].max()) + 1, int(er.heads["head"].max()) + 1
    table = [[_fmt(r[c]) for c in LABEL_COLUMNS] for r in er.labels.to_dict("records")]
    html = render_fragment("effects.html.j2", er=er, kinds=KINDS, grid=_grid(result.heads, L, H), columns=LABEL_COLUMNS,
                           table=table, claim=claim_lines(er.induction) if er.induction else [])
    labels_csv = er.labels.to_csv(index=False, float_format="%.6g")
    return Section(id="effects", title="Head ablation effects", html=html, order=42,
                   figures={f"effects-{k}": _figure(er.heads, k, er.unit) for k in KINDS},
                   files={"effects.csv": er.heads.to_csv(index=False, float_format="%.6g"),
                          "label_effects.csv": labels_csv},
                   record=er.record())
