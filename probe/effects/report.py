"""The report section of an effects run: heatmaps of each ablation kind's effects beside the
primary-label grid (one row per site: a one-stack model's layers; an encoder-decoder model's
``enc``, ``dec`` and ``cross`` layers), the label -> effect table with its random baseline and what
that baseline was drawn from, the induction claim on decoders, and effects.csv / label_effects.csv
beside ``index.html``.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it shows a section
when ``result.results["effects"]`` holds an :class:`~probe.effects.measure.EffectsResult`.
"""

from __future__ import annotations

import numpy as np

from ..report.sections import Section, render_fragment, section_builder
from ..sites import site_prefix
from .ablation import DEFAULT_KINDS
from .induction import claim_lines

#: Figure scale: effects are drawn as integers of 1 / SCALE objective units.
SCALE = 100000


def site_rows(frame) -> list[tuple]:
    """(stack, kind, layer) of each site of effects.csv, in its row order."""
    keys = frame[["stack", "kind", "layer"]].itertuples(index=False, name=None)
    return list(dict.fromkeys(keys))


def row_labels(sites: list[tuple]) -> list[str]:
    """``"3"`` per layer of a one-stack model; ``"enc 3"``, ``"dec 3"``, ``"cross 3"`` for an encoder-decoder model."""
    several = len({(s, k) for s, k, _ in sites}) > 1
    return [f"{site_prefix(s, k)} {layer}" if several else str(layer) for s, k, layer in sites]


def _figure(frame, kind: str, unit: str) -> dict:
    sites, H = site_rows(frame), int(frame["head"].max()) + 1
    vals = frame[f"effect_{kind}"].to_numpy(dtype=float)
    finite = vals[np.isfinite(vals)]
    lo, hi = (min(0.0, float(finite.min())), float(finite.max())) if len(finite) else (0.0, 1.0)
    return {"rows": len(sites), "cols": H, "scale": SCALE, "vmin": lo, "vmax": hi if hi > lo else lo + 1.0,
            "cmap": "viridis", "title": f"{kind} ablation: objective change ({unit}; > 0 = worse)",
            "values": [None if not np.isfinite(v) else int(round(v * SCALE)) for v in vals],
            "rowLabels": row_labels(sites), "colLabels": [str(i) for i in range(H)],
            "xLabel": "head", "yLabel": "site" if len(row_labels(sites)[0].split()) > 1 else "layer", "unit": unit}


def _grid(heads, sites: list[tuple], n_heads: int) -> list[list[str]]:
    """Primary label per (site row, head) of the analysis's heads table."""
    row_of = {s: i for i, s in enumerate(sites)}
    grid = [[""] * n_heads for _ in sites]
    for row in heads.itertuples():
        key = (getattr(row, "stack", sites[0][0]), getattr(row, "kind", sites[0][1]), int(row.layer))
        if key in row_of:
            grid[row_of[key]][int(row.head)] = str(row.label)
    return grid


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)


#: The label -> effect table's columns on the page (label_effects.csv keeps one column per number).
TABLE_COLUMNS = ("label", "ablation", "n", "effect [95%]", "random mean +- sd [95% of the mean]", "verdict",
                 "random heads drawn from", "heads")


def _table_row(r: dict) -> list[str]:
    """One label_effects.csv row as the page shows it (intervals beside their values)."""
    return [str(r["label"]), str(r["ablation"]), str(r["n_heads"]),
            f"{_fmt(r['effect'])} [{_fmt(r['effect_low'])}, {_fmt(r['effect_high'])}]",
            f"{_fmt(r['random_mean'])} +- {_fmt(r['random_std'])} [{_fmt(r['random_low'])}, {_fmt(r['random_high'])}]",
            str(r["verdict"]), f"{r['pool_heads']} heads" + (f", {r['pool_top_share']:.0%} {r['pool_top']}"
                                                               if r["pool_top"] else ""), str(r["heads"])]


@section_builder
def section(result, tokenizer) -> Section | None:
    """The effects section, or None when the run has no effects result."""
    er = getattr(result, "results", {}).get("effects")
    if er is None:
        return None
    kinds = tuple(er.settings.get("kinds", DEFAULT_KINDS))
    sites, H = site_rows(er.heads), int(er.heads["head"].max()) + 1
    table = [_table_row(r) for r in er.labels.to_dict("records")]
    html = render_fragment("effects.html.j2", er=er, kinds=kinds, grid=_grid(result.heads, sites, H),
                           rows=row_labels(sites), columns=TABLE_COLUMNS, table=table,
                           claim=claim_lines(er.induction) if er.induction else [])
    labels_csv = er.labels.to_csv(index=False, float_format="%.6g")
    return Section(id="effects", title="Head ablation effects", html=html, order=43,
                   figures={f"effects-{k}": _figure(er.heads, k, er.unit) for k in kinds},
                   files={"effects.csv": er.heads.to_csv(index=False, float_format="%.6g"),
                          "label_effects.csv": labels_csv},
                   record=er.record())
