"""The report section of ``probe why``: the head's row of attention, a bar per top key split by source
pair, a source x source heat map at the top key, the pairs table (why.csv beside ``index.html``) and
each source's share on the query and the key side, with the heads' labels.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it
shows a section when ``result.results["why"]`` holds a :class:`~probe.qk.run.WhyRun`.
"""

from __future__ import annotations

import math

import numpy as np

from ..report.sections import Section, render_fragment, section_builder
from ..util import formatted
from .table import REST, top_pairs

#: Heat-map values are drawn as integers of 1 / SCALE score units.
SCALE = 10000
#: Sources shown on each axis of the heat map (the others summed in one row and column).
SOURCES = 12
#: Pair series in the bar chart (the others summed in one series).
SERIES = 8
#: Colours of the pair series (the last one: the other pairs).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bbbbbb")

CAPTION = ("Why {head} attends where it does at query {query} ({token!r}): each score s_ij = scale * q_i . k_j is "
           "split into C_ij[a, b] = scale * q_(a,i) . k_(b,j) over the sources a of the query and b of the key "
           "(token and position embeddings, each earlier head's output z W_O, each earlier MLP, and 'bias': the "
           "output and projection biases and every norm's beta), every norm frozen at this run's statistics, "
           "rotary positions applied per source. Check: max_j |sum_ab C_ij[a, b] - s_ij| = {residual:.2g} "
           "(scores up to {smax:.3g}; tolerance {tol:.2g}).{cap} share = C / s_ij; dA_first: the first-order change "
           "of A_ij when the pair is removed (the softmax's Jacobian), dA_exact: the row's softmax recomputed "
           "without it; without query/key source: the writer removed from the query or the key altogether. "
           "'its label': the head's label in probe's analysis of its built-in sample texts (decoders: with the "
           "circuit probe on repeated random tokens), the same for every text, since a label describes what a "
           "head does over a corpus, not on one sentence; that analysis is the run below, and heads.csv.")


def _fmt(v, spec: str = ".4g") -> str:
    if isinstance(v, (float, np.floating)):
        return "" if not math.isfinite(v) else formatted(float(v), spec)
    return str(v)


def _key_label(w, j: int) -> str:
    return f"{j} {w.tokens[j]}"


def _row_figure(w) -> dict:
    return {"kind": "bars", "mode": "stack", "title": f"{w.name}: attention of query {w.query} to each key",
            "categories": [str(j) for j in range(len(w.tokens))],
            "series": [{"name": "A_ij", "color": COLORS[0], "values": [float(a) for a in w.pattern]}],
            "vmax": float(max(w.pattern.max(), 1e-9)), "xLabel": "key", "yLabel": "A", "unit": ""}


def _bars_figure(w, keys: list[int]) -> dict:
    pairs: list[tuple[int, int]] = []
    for j in keys:
        for p in top_pairs(w, j, SERIES):
            if p not in pairs:
                pairs.append(p)
    ranked = sorted(pairs, key=lambda p: -max(abs(w.contributions[p[0], p[1], j]) for j in keys))[:SERIES]
    series = [{"name": f"{w.sources[a]} x {w.sources[b]}", "color": COLORS[n],
               "values": [float(w.contributions[a, b, j]) for j in keys]} for n, (a, b) in enumerate(ranked)]
    rest = [float(w.contributions[:, :, j].sum() - sum(w.contributions[a, b, j] for a, b in ranked)) for j in keys]
    series.append({"name": "other pairs", "color": COLORS[-1], "values": rest})
    pos = [sum(max(0.0, s["values"][c]) for s in series) for c in range(len(keys))]
    neg = [sum(min(0.0, s["values"][c]) for s in series) for c in range(len(keys))]
    return {"kind": "bars", "mode": "stack", "title": "score of each top key by (query source x key source)",
            "categories": [_key_label(w, j) for j in keys], "series": series, "vmax": max(pos + [1e-9]),
            "vmin": min(neg + [0.0]), "xLabel": "key", "yLabel": "C", "unit": "(score units)"}


def _heat_figure(w, key: int) -> dict:
    return _heat(w.matrix(key), w.sources, f"C at key {_key_label(w, key)}: query source (rows) x key source (columns)")


def _heat(M: np.ndarray, sources: list[str], title: str) -> dict:
    rows = list(np.argsort(-np.abs(M).sum(1), kind="stable")[:SOURCES])
    cols = list(np.argsort(-np.abs(M).sum(0), kind="stable")[:SOURCES])
    r_rest = [a for a in range(M.shape[0]) if a not in rows]
    c_rest = [b for b in range(M.shape[1]) if b not in cols]
    R = [[a] for a in rows] + ([r_rest] if r_rest else [])
    Cs = [[b] for b in cols] + ([c_rest] if c_rest else [])
    grid = np.array([[M[np.ix_(ra, cb)].sum() for cb in Cs] for ra in R])
    span = float(np.abs(grid).max()) or 1.0
    return {"rows": len(R), "cols": len(Cs), "scale": SCALE, "vmin": -span, "vmax": span, "cmap": "rdbu",
            "title": title, "values": [int(round(v * SCALE)) for v in grid.ravel()],
            "rowLabels": [sources[a] for a in rows] + (["other"] if r_rest else []),
            "colLabels": [sources[b] for b in cols] + (["other"] if c_rest else []),
            "xLabel": "key source", "yLabel": "query source", "unit": "score units", "cellName": "C"}


@section_builder
def section(result, tokenizer) -> Section | None:
    """The why section, or None when the run has no why result."""
    run = getattr(result, "results", {}).get("why")
    if run is None:
        return None
    title, html, figures, files = _corpus_parts(run) if run.corpus is not None else _row_parts(run)
    model = getattr(result, "model", {}).get("name", "")
    head = run.corpus.name if run.corpus is not None else run.why.name
    return Section(id="why", title=title, html=html, figures=figures, files=files, record=run.record(), order=47,
                   lead=f"Why {head} of {model} attends where it does")


def _row_parts(run) -> tuple:
    """(title, html, figures, files) of one query row."""
    w, labels = run.why, run.labels
    keys = w.top_keys(run.top)
    cap = (f" Soft-capped head (cap {w.softcap:g}): the sum is the pre-cap score; the pattern reads cap tanh(s / cap)."
           if w.softcap else "")
    kept = w.scores[w.keep]
    caption = CAPTION.format(head=w.name, query=w.query, token=w.query_token, residual=w.residual,
                             smax=float(np.abs(kept).max()) if len(kept) else 0.0, tol=w.tolerance, cap=cap)
    figures = {"why-row": _row_figure(w), "why-bars": _bars_figure(w, keys), "why-heat": _heat_figure(w, keys[0])}
    fig_list = [{"id": k, "title": v["title"]} for k, v in figures.items()]

    def label(name: str) -> str:
        return labels.get(name, "")

    columns = ["key", "A_ij", "s_ij", "query source", "its label", "key source", "its label", "C", "share",
               "dA_first", "dA_exact", "dA without query source", "dA without key source"]
    rows = [[_key_label(w, int(r.key)), _fmt(r.attention, ".3f"), _fmt(r.score), r.query_source,
             label(r.query_source) if r.query_source != REST else "", r.key_source,
             label(r.key_source) if r.key_source != REST else "", _fmt(r.contribution), _fmt(r.share, ".3f"),
             _fmt(r.dA_first, ".3g"), _fmt(r.dA_exact, ".3g"), _fmt(r.dA_without_query_source, ".3g"),
             _fmt(r.dA_without_key_source, ".3g")] for r in run.frame.itertuples()]
    share_rows = [[r.source, label(r.source), _fmt(r.query_side), _fmt(r.key_side)]
                  for r in run.shares.head(2 * SOURCES).itertuples()]
    html = render_fragment("section_table.html.j2", caption=caption, figures=fig_list, columns=columns, rows=rows)
    html += render_fragment("section_table.html.j2", figures=[], caption=(
        f"Each source's part of the score at the top key {_key_label(w, keys[0])}: query side sum_b C[a, b], key "
        "side sum_a C[a, b] (each column adds up to s_ij)."), columns=["source", "its label", "query side",
                                                                        "key side"], rows=share_rows)
    files = {"why.csv": run.frame.to_csv(index=False, float_format="%.6g")}
    return f"Why {w.name} attends where it does", html, figures, files


def _corpus_parts(run) -> tuple:
    """(title, html, figures, files) of an average over a corpus."""
    c, labels = run.corpus, run.labels
    caption = (f"{c.sentence(labels)}. The contributions C_ij[a, b] (query source a, key source b; norms frozen at "
               f"each run) are averaged over the rows whose most attended key fits the label {c.label!r}; each "
               f"row's sum is checked against the model's score (largest difference {c.residual:.2g}, tolerance "
               f"{c.tolerance:.2g}). share = mean C / mean score.")
    figures = {}
    if c.rows:
        figures["why-corpus-heat"] = _heat(c.mean, c.sources, f"mean C over {c.rows} rows: query source (rows) x "
                                                              "key source (columns)")
    fig_list = [{"id": k, "title": v["title"]} for k, v in figures.items()]
    rows = [[r.query_source, labels.get(r.query_source, ""), r.key_source, labels.get(r.key_source, ""),
             _fmt(r.contribution), _fmt(r.share, ".3f")] for r in run.frame.itertuples()]
    html = render_fragment("section_table.html.j2", caption=caption, figures=fig_list, rows=rows,
                           columns=["query source", "its label", "key source", "its label", "mean C", "share"])
    share_rows = [[r.source, labels.get(r.source, ""), _fmt(r.query_side), _fmt(r.query_share, ".3f"),
                   _fmt(r.key_side), _fmt(r.key_share, ".3f")] for r in run.shares.head(2 * SOURCES).itertuples()]
    html += render_fragment("section_table.html.j2", figures=[], caption="Each source's part of the mean score.",
                            columns=["source", "its label", "query side", "share", "key side", "share"],
                            rows=share_rows)
    files = {"why_corpus.csv": run.frame.to_csv(index=False, float_format="%.6g"),
             "why_sources.csv": run.shares.to_csv(index=False, float_format="%.6g")}
    return f"Why {c.name} attends where it does, over a corpus", html, figures, files
