"""The report section of ``probe circuit``: the circuit drawn as a layered graph and the faithfulness
curve, both inline SVG drawn from the data in Python (nothing fetched: the page's Content-Security-Policy
holds), the strongest edges and nodes, and edges.csv, nodes.csv, circuit.csv and faithfulness.csv
beside ``index.html``.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it
shows a section when ``result.results["circuit"]`` holds a :class:`~probe.circuits.run.CircuitRun`.
"""

from __future__ import annotations

import math

import numpy as np
from markupsafe import Markup, escape

from ..report import LABEL_COLORS, label_family
from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from .graph import prune

#: Edges drawn at most (the strongest of the circuit; the table and circuit.csv have them all).
MAX_DRAWN = 400
#: Edge colours by sign of the score (Okabe-Ito): positive helps the clean answer.
SIGN_COLOR = {True: "#0072B2", False: "#D55E00"}
COL, ROW, PAD = 64, 26, 40


def _labels(heads) -> dict:
    if heads is None or "label" not in heads.columns:
        return {}
    return {head_name(int(r["layer"]), int(r["head"])): str(r.get("labels") or r.get("label") or "")
            for r in heads.to_dict("records")}


def _positions(graph) -> dict:
    """Node name -> (x, y): one row per layer (the embeddings at the bottom, the logits at the top), the
    heads then the MLP along it; a key/value input's point is the middle of its group's heads (drawn as a
    bar under the group, its key and value edges ending side by side on it)."""
    width = graph.heads + 1
    height = graph.layers + 2

    def at(col, row):
        return PAD + col * COL + (COL / 2 if row in (0, height - 1) else 0), PAD + (height - 1 - row) * ROW

    pos = {"input": at(width / 2 - 0.5, 0), "logits": at(width / 2 - 0.5, height - 1)}
    rep = graph.heads // graph.kv_heads
    for layer in range(graph.layers):
        for h in range(graph.heads):
            pos[head_name(layer, h)] = at(h, layer + 1)
        for g in range(graph.kv_heads):
            pos[f"L{layer}KV{g}"] = at(g * rep + (rep - 1) / 2, layer + 1)
        pos[f"MLP{layer}"] = at(graph.heads, layer + 1)
    return pos


def circuit_svg(run, heads=None) -> Markup:
    """The circuit as a layered graph: every node's place (faint outside the circuit), the circuit's
    nodes coloured by their probe label, its strongest :data:`MAX_DRAWN` edges with width by |score|
    and colour by sign."""
    g, frame = run.graph, run.edges_frame()
    pos, labels, inside = _positions(g), _labels(heads), run.circuit_nodes()
    chosen = frame[frame["in_circuit"]]
    drawn = chosen.reindex(chosen["score"].abs().sort_values(ascending=False).index).head(MAX_DRAWN)
    top = float(drawn["score"].abs().max()) if len(drawn) else 1.0
    W = 2 * PAD + (g.heads + 1) * COL
    H = 2 * PAD + (g.layers + 1) * ROW
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
           f'style="max-width:{W}px" aria-label="circuit graph" class="circuit-graph" font-size="9" '
           'font-family="sans-serif">']  # scales down to its panel (SmolLM2's graph is wider than one)
    rep = g.heads // g.kv_heads
    for name in sorted({d for d in drawn["downstream"] if "KV" in d}):  # a key/value head: a bar under its group
        layer, group = (int(x) for x in name[1:].split("KV"))
        first, last = head_name(layer, group * rep), head_name(layer, (group + 1) * rep - 1)
        (xa, y), (xb, _) = pos[first], pos[last]
        out.append(f'<line x1="{xa - 6:.1f}" y1="{y + 9:.1f}" x2="{xb + 6:.1f}" y2="{y + 9:.1f}" stroke="#333" '
                   f'stroke-width="2"><title>{escape(name)}: the key/value head read by {escape(first)}-{escape(last)}'
                   '</title></line>')
    for r in drawn.itertuples():
        (x1, y1), (x2, y2) = pos[r.upstream], pos[r.downstream]
        if "KV" in r.downstream:  # key and value inputs of one group side by side, on its bar
            x2, y2 = x2 + (-4 if r.input == "k" else 4), y2 + 4
        width = 0.4 + 3.6 * abs(r.score) / (top or 1.0)
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2 + 5:.1f}" '
                   f'stroke="{SIGN_COLOR[r.score >= 0]}" stroke-width="{width:.2f}" stroke-opacity="0.55">'
                   f'<title>{escape(r.upstream)} &#8594; '
                   f'{escape(r.downstream)} ({escape(r.input)}): {r.score:.3g}</title></line>')
    for name in g.upstream_names + ["logits"]:
        x, y = pos[name]
        label = labels.get(name, "")
        fill = LABEL_COLORS.get(label_family(label.split(";")[0]), "#ffffff") if label else "#ffffff"
        on = name in inside or name in ("input", "logits")
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{7 if on else 3}" fill="{fill if on else "#eee"}" '
                   f'stroke="{"#333" if on else "#ccc"}"><title>{escape(name)}{": " + escape(label) if label else ""}'
                   '</title></circle>')
        if on:
            out.append(f'<text x="{x:.1f}" y="{y - 9:.1f}" text-anchor="middle">{escape(name)}</text>')
    out.append("</svg>")
    return Markup("".join(out))


#: Legend text width per character at font-size 11 (sans-serif; an upper estimate, so the legend fits).
CHAR_WIDTH = 7.0


def faithfulness_svg(frame, greedy: dict | None = None) -> Markup:
    """Faithfulness (y) against the circuit's share of edges (x, log scale): the top-k circuits and the
    random circuits' mean with a band of +-1 standard deviation; ``greedy`` (``edges``, ``share``,
    ``faithfulness``): the greedy circuit's point. The legend sits right of the panel in a margin
    sized to its longest line."""
    legend = [("faithfulness", "#0072B2", "", "top-k edges"),
              ("random_mean", "#555555", "2 3", "random (mean \u00b1 1 sd)")]
    names = [e[3] for e in legend] + (["greedy circuit"] if greedy else [])
    W, H, L, T, B = 640, 300, 56, 20, 42
    R = 10 + 22 + 5 + math.ceil(CHAR_WIDTH * max(len(n) for n in names)) + 8
    pw, ph = W - L - R, H - T - B
    xs = np.log10(frame["share"].to_numpy())
    x_lo, x_hi = float(xs.min()), float(xs.max()) if xs.max() > xs.min() else float(xs.min()) + 1
    vals = np.concatenate([frame["faithfulness"], frame["random_mean"] - frame["random_std"],
                           frame["random_mean"] + frame["random_std"], [0.0, 1.0],
                           [greedy["faithfulness"]] if greedy else []])
    y_lo, y_hi = float(np.nanmin(vals)) - 0.05, float(np.nanmax(vals)) + 0.05

    def X(v):
        return L + (v - x_lo) / (x_hi - x_lo) * pw

    def Y(v):
        return T + (y_hi - v) / (y_hi - y_lo) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
           f'style="max-width:{W}px" aria-label="faithfulness curve" class="faith-plot" font-size="11" '
           'font-family="sans-serif">',
           f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for level in (0.0, 1.0):
        out.append(f'<line x1="{L}" y1="{Y(level):.1f}" x2="{L + pw}" y2="{Y(level):.1f}" stroke="#bbb" '
                   f'stroke-dasharray="3 3"/><text x="{L - 6}" y="{Y(level) + 4:.1f}" text-anchor="end">'
                   f'{level:g}</text>')
    for e in range(math.floor(x_lo), math.ceil(x_hi) + 1):
        if x_lo - 1e-9 <= e <= x_hi + 1e-9:
            out.append(f'<text x="{X(e):.1f}" y="{T + ph + 16}" text-anchor="middle">{100 * 10 ** e:g}%</text>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">circuit size (share of all edges, log '
               'scale)</text>')
    upper = [(X(x), Y(m + s)) for x, m, s in zip(xs, frame["random_mean"], frame["random_std"])]
    lower = [(X(x), Y(m - s)) for x, m, s in zip(xs, frame["random_mean"], frame["random_std"])]
    out.append('<polygon points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in upper + lower[::-1])
               + '" fill="#555" fill-opacity="0.15" stroke="none"/>')
    for row, (column, color, dash, name) in enumerate(legend):
        pts = [(X(x), Y(v)) for x, v in zip(xs, frame[column])]
        out.append('<polyline points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + f'" fill="none" '
                   f'stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" data-curve="{column}"/>')
        out.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}"/>' for a, b in pts)
        out.append(_legend_line(L + pw + 10, T + 8 + 18 * row, color, dash, name))
    if greedy:
        gx, gy = X(math.log10(greedy["share"])), Y(greedy["faithfulness"])
        out.append(_diamond(gx, gy, 6, ' data-point="greedy"', f'<title>greedy circuit: {greedy["edges"]} edges, '
                            f'faithfulness {greedy["faithfulness"]:.3f}</title>'))
        ly = T + 8 + 18 * len(legend)
        out.append(_diamond(L + pw + 21, ly, 5) + f'<text x="{L + pw + 37}" y="{ly + 4}">greedy circuit</text>')
    out.append("</svg>")
    return Markup("".join(out))


def _diamond(x: float, y: float, r: float, attrs: str = "", inner: str = "") -> str:
    return (f'<path d="M{x:.1f},{y - r:.1f} L{x + r:.1f},{y:.1f} L{x:.1f},{y + r:.1f} L{x - r:.1f},{y:.1f} Z" '
            f'fill="#009E73"{attrs}>{inner}</path>')


def _legend_line(x: float, y: float, color: str, dash: str, name: str) -> str:
    return (f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{color}" stroke-width="2" '
            f'stroke-dasharray="{dash}"/><text x="{x + 27}" y="{y + 4}">{escape(name)}</text>')


def record(run) -> dict:
    """The run.json entry: graph, method, the circuit's size and faithfulness, the curve, timings."""
    f = run.faithfulness.frame
    k = int(run.circuit.sum())
    row = f[f["k"] == k].iloc[0]
    greedy = None if run.greedy is None else {**run.greedy.record(), "top_k_faithfulness": float(row["faithfulness"])}
    return {"select": "top-k" if greedy is None else "greedy", "greedy": greedy, "metric_at": run.metric_at,
            "pairs": len(run.pairs), "source": run.source, "method": run.method, "steps": run.steps,
            "points": run.points,
            "edges": run.graph.n_edges, "parallel": run.graph.parallel, "circuit_edges": k,
            "circuit_edges_on_paths": int(prune(run.graph, run.circuit).sum()),
            "circuit_faithfulness": run.circuit_faithfulness, "ld_clean": run.ld_clean,
            "ld_corrupted": run.ld_corrupted, "m_full": run.faithfulness.m_full, "m_empty": run.faithfulness.m_empty,
            "curve": f[["k", "share", "faithfulness", "random_mean", "random_std"]].to_dict("records"),
            "passes": run.passes, "seeds": run.seeds, "seconds": {k: round(v, 3) for k, v in run.seconds.items()},
            "notes": run.notes}


def _greedy_point(run) -> dict | None:
    if run.greedy is None:
        return None
    k = int(run.greedy.circuit.sum())
    return {"edges": k, "share": max(k, 1) / run.graph.n_edges, "faithfulness": run.greedy.faithfulness}


@section_builder
def section(result, tokenizer) -> Section | None:
    """The circuit section, or None when the run has no circuit result."""
    run = getattr(result, "results", {}).get("circuit")
    if run is None:
        return None
    heads = getattr(result, "heads", None)
    labels, edges, nodes = _labels(heads), run.edges_frame(), run.nodes_frame()
    chosen = edges[edges["in_circuit"]]
    top_edges = chosen.reindex(chosen["score"].abs().sort_values(ascending=False).index).head(15)
    top_nodes = nodes.reindex(nodes["score"].abs().sort_values(ascending=False).index).head(15)
    rec = record(run)
    html = render_fragment("circuit.html.j2", r=rec, graph_svg=circuit_svg(run, heads),
                           curve_svg=faithfulness_svg(run.faithfulness.frame, _greedy_point(run)), top_edges=top_edges,
                           top_nodes=top_nodes, labels=labels, drawn=min(MAX_DRAWN, len(chosen)))
    f = run.faithfulness.frame
    files = {"edges.csv": edges[["upstream", "downstream", "input", "score"]].to_csv(index=False, float_format="%.6g"),
             "nodes.csv": nodes.to_csv(index=False, float_format="%.6g"),
             "circuit.csv": chosen[["upstream", "downstream", "input", "score", "on_path"]].to_csv(
                 index=False, float_format="%.6g"),
             "faithfulness.csv": f[["k", "faithfulness", "random_mean", "random_std"]].to_csv(index=False,
                                                                                              float_format="%.6g")}
    return Section(id="circuit", title="Circuit: edge attribution and faithfulness", html=html, files=files,
                   record=rec, order=44)
