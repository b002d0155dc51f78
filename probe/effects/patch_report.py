"""The report section of ``probe patch``: the patching heatmaps (all positions, last position), the
direct-logit-attribution heatmap and per-layer table, and, for each induction head (else the heads
with the largest patching effect), its strongest K-composition partners with their labels; files
patch.csv and composition.csv beside ``index.html``.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it shows a section
when ``result.results["patching"]`` holds a :class:`~probe.effects.patch_run.PatchRun`.
"""

from __future__ import annotations

import math

import numpy as np

from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from ..util import formatted
from .composition import top_partners
from .dla import dla_by_layer, head_grid
from .report import row_labels, site_rows

PARTNERS = 3
READERS = 5


def signed_figure(grid: np.ndarray, title: str, unit: str = "", rows: list[str] | None = None) -> dict:
    """A [layers, heads] heatmap on a symmetric diverging scale (0 white); ``rows``: row labels
    (default the layer numbers; an encoder-decoder model's sites ``enc 0`` ...)."""
    L, H = grid.shape
    finite = grid[np.isfinite(grid)]
    m = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    return {"rows": L, "cols": H, "scale": 10000, "vmin": -m, "vmax": m, "cmap": "rdbu", "title": title,
            "values": [None if not math.isfinite(v) else int(round(v * 10000)) for v in grid.ravel()],
            "rowLabels": rows or [str(i) for i in range(L)], "colLabels": [str(i) for i in range(H)],
            "xLabel": "head", "yLabel": "site" if rows and " " in rows[0] else "layer", "unit": unit}


def _name(p, r) -> str:
    """A patch.csv row's head name: ``L4H5``, with the site kind first when the table has several."""
    several = p[["stack", "kind"]].drop_duplicates().shape[0] > 1
    return head_name({"stack": r.stack, "kind": r.kind, "layer": r.layer} if several else int(r.layer), int(r.head))


def _labels(heads) -> dict:
    return {(int(r["layer"]), int(r["head"])): (str(r.get("labels") or r.get("label") or ""))
            for r in heads.to_dict("records")}


def _readers(pr, heads) -> tuple[list[tuple[int, int]], str]:
    """Heads whose K-composition partners are listed: the induction heads, else the top patched heads."""
    if "labels" in heads.columns:
        ind = heads[heads["labels"].fillna("").str.split(";").apply(lambda s: "induction" in s)]
        if len(ind):
            ind = ind.sort_values("induction", ascending=False) if "induction" in ind.columns else ind
            return [(int(r.layer), int(r.head)) for r in ind.head(2 * READERS).itertuples()], "induction heads"
    later = pr.patching[pr.patching["layer"] > 0]  # layer 0 reads nothing a head wrote
    top = later.reindex(later["effect"].abs().sort_values(ascending=False).index).head(READERS)
    return ([(int(r.layer), int(r.head)) for r in top.itertuples()],
            "no induction head: the heads after layer 0 with the largest patching effect")


def partner_rows(pr, heads) -> tuple[list[dict], str]:
    """Per listed reader, its strongest K-composition writers: name, score, z, label, prev score."""
    if pr.composition is None:
        return [], ""
    labels, readers_of = _labels(heads), _readers(pr, heads)
    prev = {(int(r["layer"]), int(r["head"])): r.get("prev") for r in heads.to_dict("records")}
    rows = []
    for layer, head in readers_of[0]:
        for r in top_partners(pr.composition, layer, head, "k", PARTNERS).itertuples():
            w = (int(r.writer_layer), int(r.writer_head))
            rows.append({"reader": head_name(layer, head), "reader_label": labels.get((layer, head), ""),
                         "writer": head_name(*w), "k": float(r.k), "k_z": float(r.k_z),
                         "writer_label": labels.get(w, ""), "writer_prev": prev.get(w)})
    return rows, readers_of[1]


def component_rows(frame) -> list[dict]:
    """Per component of a components.csv frame: its unit kind, unit count, the unit with the largest
    |effect| (all positions) and that effect, and (with attribution) the correlations of attribution
    against activation patching over its units (None where one of them is constant, so undefined)."""
    correlations = frame.attrs.get("correlations", {})
    rows = []
    for name, part in frame.groupby("component", sort=False):
        top = part.loc[part["effect"].abs().idxmax()]
        unit = str(top["unit"])
        layer, index = int(top["layer"]), int(top["head"])
        where = (f"L{layer}" if unit == "layer" else f"L{layer}KV{index}" if unit == "kv_head"
                 else head_name(layer, index))
        corr = {k: v if math.isfinite(v) else None for k, v in correlations.get(name, {}).items()}
        rows.append({"component": name, "unit": unit, "units": len(part), "top": where,
                     "top_effect": float(top["effect"]), **corr})
    return rows


def _fmt(v, spec=".3g") -> str:
    return "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else formatted(v, spec)


@section_builder
def section(result, tokenizer) -> Section | None:
    """The patching / DLA / composition section, or None when the run has no patching result."""
    pr = getattr(result, "results", {}).get("patching")
    if pr is None:
        return None
    p = pr.patching
    H = int(p["head"].max()) + 1
    L = len(p) // H  # rows: layers, or an encoder-decoder model's sites
    rows = row_labels(site_rows(p))
    unit = "share of LD_c - LD_x" if p.attrs["normalized"] else "logits"
    figures = {"patch-all": signed_figure(p["effect"].to_numpy().reshape(L, H), "patching effect, all positions", unit,
                                          rows),
               "patch-last": signed_figure(p["effect_last"].to_numpy().reshape(L, H),
                                           "patching effect, last position", unit, rows)}
    attribution = p.attrs.get("attribution")
    if attribution is not None:
        figures["patch-attribution"] = signed_figure(p["attribution"].to_numpy().reshape(L, H),
                                                     "attribution patching, all positions", unit, rows)
    top = p.reindex(p["effect"].abs().sort_values(ascending=False).index).head(10)
    top_rows = [[_name(p, r), _fmt(r.effect), _fmt(r.effect_last)] for r in top.itertuples()]
    layer_rows, dla_attrs = [], None
    if pr.dla is not None:
        figures["dla-heads"] = signed_figure(head_grid(pr.dla, L, H), "direct logit attribution per head", "logits")
        layer_rows = [[int(r.layer), _fmt(r.heads), _fmt(r.b_O), _fmt(r.mlp), head_name(int(r.layer), int(r.top_head)),
                       _fmt(r.top_dla)] for r in dla_by_layer(pr.dla).itertuples()]
        dla_attrs = pr.dla.attrs
    partners, why = partner_rows(pr, result.heads)
    base = pr.composition.attrs["baseline"] if pr.composition is not None else None
    record = {"pairs": len(pr.pairs), "source": pr.source, "direction": p.attrs["direction"],
              "metric_at": pr.metric_at,
              "ld_clean": p.attrs["ld_clean"], "ld_corrupted": p.attrs["ld_corrupted"],
              "normalized": p.attrs["normalized"], "seconds": {k: round(v, 3) for k, v in pr.seconds.items()},
              "top": [{"head": r[0], "effect": float(t.effect), "effect_last": float(t.effect_last)}
                      for r, t in zip(top_rows, top.itertuples())],
              "dla": dla_attrs, "composition_baseline": base,
              "rope": pr.composition.attrs["rope"] if pr.composition is not None else None,
              "k_partners": partners, "partners_of": why, "notes": pr.notes}
    if attribution is not None:
        record["attribution"] = attribution
    if pr.components is not None:
        record["components"] = component_rows(pr.components)
    html = render_fragment("patching.html.j2", r=record, top_rows=top_rows, layer_rows=layer_rows,
                           partners=partners, fmt=_fmt)
    extra = ["attribution", "attribution_last", "attribution_raw", "attribution_raw_last"] if attribution else []
    files = {"patch.csv": p[["stack", "kind", "layer", "head", "effect", "effect_last", "raw", "raw_last", *extra]]
             .to_csv(index=False, float_format="%.6g")}
    if pr.components is not None:
        files["components.csv"] = pr.components.to_csv(index=False, float_format="%.6g")
    if pr.composition is not None:
        files["composition.csv"] = pr.composition[["writer_layer", "writer_head", "reader_layer", "reader_head",
                                                   "q", "k", "v"]].to_csv(index=False, float_format="%.5g")
    return Section(id="patching", title="Activation patching, direct logit attribution, composition", html=html,
                   figures=figures, files=files, record=record, order=42)
