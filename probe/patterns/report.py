"""Report sections of the pattern analyses (each registers itself with :func:`probe.report.sections.section_builder`).

Each builder takes an :class:`~probe.records.AnalysisResult` and the tokenizer and returns a
:class:`~probe.report.sections.Section` (HTML fragment from its own template, canvas figure data,
files for the run folder, a run.json entry) or None when its analysis did not run. Figures are data
for the page's inline scripts (heatmaps: ``static/heatmap.js``; scatter and bars:
``static/charts.js``); nothing is rendered to an image.
"""

from __future__ import annotations

import io
import math

import numpy as np

from ..report.page import LABEL_COLORS, label_family
from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from .circuits import CIRCUIT_COLUMNS
from .groups import structure_note
from .health import EXPLAINING, HEALTH_RULES, MIN_ROWS, TITLES, describe, health_of
from .kovaleva import TYPES

#: Colours of the Kovaleva types (Okabe-Ito; heterogeneous in grey).
TYPE_COLORS = {"vertical+diagonal": "#009E73", "vertical": "#0072B2", "diagonal": "#E69F00",
               "block": "#CC79A7", "heterogeneous": "#BBBBBB"}
#: Categorical colours of groups (Paul Tol's muted scheme, then greys).
GROUP_COLORS = ["#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255",
                "#AA4499", "#DDDDDD", "#555555", "#000000"]
#: Heads listed per check / per score in the tables (all of them are in run.json).
SHOW = 12


def _num(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.{digits}f}"


def _clean(v):
    """JSON-safe value (NaN -> None, numpy -> Python)."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(float(v)) else float(v)
    return v


# --------------------------------------------------------------------------- health

@section_builder
def health_section(result, tokenizer) -> Section | None:
    """The attention health checks (docs/statistics.md): rule, threshold, flagged heads and values."""
    if result.results.get("health") is None:
        return None
    checks = health_of(result)
    rows = [{"title": TITLES[c.name], "rule": c.rule, "points": HEALTH_RULES[c.name][3], "status": c.status,
             "n": len(c.flagged), "explained": len(c.explained), "detail": describe(c, SHOW)} for c in checks]
    html = render_fragment("section_health.html.j2", rows=rows, n_heads=len(result.heads), min_rows=MIN_ROWS,
                           explaining=", ".join(EXPLAINING))
    record = {"checks": [_clean(c.as_dict()) for c in checks]}
    return Section("health", "Attention health checks", html, record=record, order=21)


# --------------------------------------------------------------------------- groups and map

def _scatter(xy, title, tips, *, colors=None, values=None, legend=None) -> dict:
    fig = {"kind": "scatter", "title": title, "xs": [round(float(v), 5) for v in xy[:, 0]],
           "ys": [round(float(v), 5) for v in xy[:, 1]], "tips": tips, "xLabel": "MDS 1 (bits)",
           "yLabel": "MDS 2 (bits)", "legend": legend or []}
    if colors is not None:
        fig["colors"] = colors
    else:
        fig["values"], fig["cmap"] = values, "viridis"
    return fig


#: matplotlib's viridis sampled at 0, 1/8, ..., 1 (the page's heatmap script uses the same stops).
VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]


def viridis(t: float) -> str:
    """The page's viridis colour of t in [0, 1] (linear between the stops), as hex."""
    x = min(1.0, max(0.0, t)) * (len(VIRIDIS) - 1)
    k = min(int(x), len(VIRIDIS) - 2)
    f = x - k
    a, b = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in VIRIDIS[k:k + 2])
    return "#" + "".join(f"{round(u * (1 - f) + v * f):02x}" for u, v in zip(a, b))


def _layer_legend(n_layers: int) -> list:
    """One legend entry per layer (``L0`` ... ``L{n-1}``) in the colour its heads get on the map."""
    return [[f"L{p}", viridis(p / max(1, n_layers - 1))] for p in range(n_layers)]


@section_builder
def groups_section(result, tokenizer) -> Section | None:
    """Head map (MDS) coloured by layer, label and group; groups table; clusters.csv and the distances."""
    acc_result = result.results.get("distances")
    if acc_result is None or acc_result.groups is None or "group" not in result.heads.columns:
        return None
    heads = result.heads
    groups = acc_result.groups
    layers, hs = heads["layer"].to_numpy(), heads["head"].to_numpy()
    labels, group = heads["label"].tolist(), heads["group"].to_numpy()
    n_layers = int(layers.max()) + 1
    on_map = np.flatnonzero(group >= 0)  # heads removed by pruning (group -1) have no attention to place
    xy = groups.xy[on_map]
    tips = [f"{head_name(layers[i], hs[i])}: {labels[i]}, group {group[i]}" for i in on_map]
    families = [label_family(labels[i]) for i in on_map]  # "syntactic:nsubj" is drawn as "syntactic"
    present = [lab for lab in LABEL_COLORS if lab in set(families)]
    figures = {
        "map-layer": _scatter(xy, "heads by layer", tips, legend=_layer_legend(n_layers),
                              values=[float(layers[i]) / max(1, n_layers - 1) for i in on_map]),
        "map-label": _scatter(xy, "heads by primary label", tips,
                              colors=[LABEL_COLORS.get(lab, "#ffffff") for lab in families],
                              legend=[[lab, LABEL_COLORS[lab]] for lab in present]),
        "map-group": _scatter(xy, f"heads by group ({groups.k})", tips,
                              colors=[GROUP_COLORS[group[i] % len(GROUP_COLORS)] for i in on_map],
                              legend=[[f"group {g}", GROUP_COLORS[g % len(GROUP_COLORS)]] for g in range(groups.k)]),
    }
    d = acc_result.model
    table = []
    for g in range(groups.k):
        idx = np.flatnonzero(group == g)
        inner = d[np.ix_(idx, idx)][np.triu_indices(len(idx), 1)] if len(idx) > 1 else np.array([])
        common = heads.iloc[idx]["label"].value_counts()
        spread = _num(float(inner.mean())) if inner.size else ""
        members = ", ".join(head_name(layers[i], hs[i]) for i in idx[:SHOW]) + (" ..." if len(idx) > SHOW else "")
        span = f"{layers[idx].min()}-{layers[idx].max()}"
        table.append([g, len(idx), span, f"{common.index[0]} ({common.iloc[0]})", spread, members])
    csv = io.StringIO()
    frame = heads[["layer", "head", "group"]].copy()
    frame["x"], frame["y"] = groups.xy[:, 0], groups.xy[:, 1]
    frame.to_csv(csv, index=False, float_format="%.6g")
    files = {"clusters.csv": csv.getvalue(), "head_distance.npy": _npy(d),
             "head_distance_layers.npy": _npy(acc_result.layer)}
    record = _clean({"k": groups.k, "criterion": groups.criterion, "silhouette": groups.silhouette,
                     "stress": groups.stress, "map_sequences": acc_result.map_sequences,
                     "map_rows": acc_result.map_rows, "map_sequences_seen": acc_result.map_seen,
                     "map_query_rows": acc_result.model_rows, "layer_query_rows": acc_result.layer_rows.tolist(),
                     **_sample_record(acc_result),
                     "files": sorted(files)})
    sil = groups.silhouette.get(groups.k)
    record["note"] = structure_note(sil, [int((group == g).sum()) for g in range(groups.k)])
    html = render_fragment("section_groups.html.j2", r=record, table=table,
                           blocks=[{"id": k, "title": v["title"]} for k, v in figures.items()])
    return Section("groups", "Head groups and map", html, figures=figures, files=files, record=record, order=30)


def _sample_record(acc_result) -> dict:
    """The row sample behind the distances and the largest standard error (bits) of each matrix."""
    def largest(se):
        return None if se is None or not np.isfinite(se).any() else float(np.nanmax(se))
    return {"sample_rows_per_sequence": getattr(acc_result, "sample_rows", None),
            "map_sample_rows_per_sequence": getattr(acc_result, "map_sample_rows", None),
            "layer_distance_se_max": largest(getattr(acc_result, "layer_se", None)),
            "map_distance_se_max": largest(getattr(acc_result, "model_se", None))}


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, dtype=np.float64), allow_pickle=False)
    return buf.getvalue()


# --------------------------------------------------------------------------- Kovaleva types

@section_builder
def types_section(result, tokenizer) -> Section | None:
    """Kovaleva pattern types: share of each type per layer (stacked bars) and per head (heads.csv)."""
    types = result.results.get("pattern_types")
    if types is None:
        return None
    per_layer = types.per_layer
    cats = [str(int(v)) for v in per_layer["layer"]]
    series = [{"name": t, "color": TYPE_COLORS[t], "values": [_clean(float(v)) for v in per_layer[t]]} for t in TYPES]
    fig = {"kind": "bars", "mode": "stack", "title": "Kovaleva pattern types per layer (mean share over heads)",
           "categories": cats, "series": series, "vmax": 1.0, "xLabel": "layer", "yLabel": "share of sequences"}
    table = [[c] + [_num(float(per_layer[t].iloc[i]), 2) for t in TYPES] for i, c in enumerate(cats)]
    record = {"per_layer": _clean(per_layer.to_dict("records")), "pairs": types.pairs, "sequences": types.sequences}
    html = render_fragment("section_types.html.j2", types=TYPES, table=table, pairs=types.pairs,
                           sequences=types.sequences)
    return Section("pattern-types", "Pattern types (Kovaleva et al. 2019)", html, figures={"types-per-layer": fig},
                   record=record, order=40)


# --------------------------------------------------------------------------- decoder circuits

def _grid(scores, column: str, title: str) -> dict:
    grid = scores.pivot(index="layer", columns="head", values=column).to_numpy(dtype=float)
    L, H = grid.shape
    return {"rows": L, "cols": H, "scale": 10000, "vmin": 0.0, "vmax": 1.0, "cmap": "viridis", "title": title,
            "values": [None if math.isnan(v) else int(round(v * 10000)) for v in grid.ravel()],
            "rowLabels": [str(i) for i in range(L)], "colLabels": [str(i) for i in range(H)],
            "xLabel": "head", "yLabel": "layer"}


@section_builder
def circuits_section(result, tokenizer) -> Section | None:
    """Induction / duplicate-token / previous-token scores (heatmaps, top heads) and attention sinks."""
    probe = result.results.get("circuits")
    if probe is None:
        return None
    scores, sinks, st = probe.scores, probe.sinks, probe.settings
    figures = {f"circuit-{c}": _grid(scores, c, c)
               for c in ("induction", "duplicate", "prev_random")}
    figures["sinks"] = {
        "kind": "bars", "mode": "group", "title": "attention to position 0 per layer (mean over heads, rows i >= 1)",
        "categories": [str(int(v)) for v in sinks["layer"]], "vmax": 1.0, "xLabel": "layer", "yLabel": "A[i, 0]",
        "series": [{"name": "with BOS", "color": "#0072B2", "values": _clean(sinks["with_bos"].tolist())},
                   {"name": "without BOS", "color": "#E69F00", "values": _clean(sinks["without_bos"].tolist())}]}
    tops = {}
    for column in ("induction", "duplicate"):
        top = scores.sort_values(column, ascending=False).head(10)
        tops[column] = [{"layer": int(r.layer), "head": int(r.head),
                         **{c: float(getattr(r, c)) for c in CIRCUIT_COLUMNS}} for r in top.itertuples()]
    thr = {k: result.thresholds.get(k) for k in ("induction", "duplicate-token")}
    held, primary = result.label_counts("all"), result.label_counts("primary")
    labels = ("induction", "duplicate-token")
    record = _clean({"settings": st, "seconds": probe.seconds, "thresholds": thr, "top": tops,
                     "sinks": sinks.to_dict("records"),
                     "labelled": {lab: int(held.get(lab, 0)) for lab in labels},  # every head holding it
                     "primary": {lab: int(primary.get(lab, 0)) for lab in labels}})  # as its primary label
    html = render_fragment("section_circuits.html.j2", r=record, tops=tops, fmt=_num)
    return Section("circuits", "Decoder circuits: induction, duplicate-token, attention sinks", html,
                   figures=figures, record=record, order=45)
