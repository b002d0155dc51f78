"""Report sections of the coreference and syntax analyses (registered in
:func:`probe.report.sections.section_builder`): HTML fragment, canvas figures, coref.csv / syntax.csv and
a run.json entry. Each builder returns None when its analysis did not run.
"""

from __future__ import annotations

import math

import numpy as np

from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from ..util import plural
from .coref import SKIPS, CorefResult, CorefView
from .syntax import ALL, DIRECTIONS, SyntaxResult
from .words import REASONS

#: Words shown around the mentions in the coreference example figure.
CONTEXT_WORDS = 3
MAX_EXAMPLE_WORDS = 40


def _pct(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _num(value) -> float | None:
    """A JSON-ready number (None for NaN)."""
    return None if value is None or math.isnan(float(value)) else float(value)


def _interval(low, high) -> str:
    return f"[{_pct(low)}, {_pct(high)}]"


def _span(low, high) -> str:
    return f"{_pct(low)}-{_pct(high)}%"


#: What each coreference baseline answers, in the command line's summary.
BASELINE_NAMES = {"nearest": "the nearer name", "first": "the first name"}


def _grid(frame, title: str, fid: str) -> dict:
    """A layer x head accuracy heatmap (figure data for the page's canvas renderer)."""
    grid = frame.pivot(index="layer", columns="head", values="accuracy").sort_index()
    values = grid.to_numpy(dtype=float)
    return {fid: {
        "rows": values.shape[0], "cols": values.shape[1], "scale": 10000, "vmin": 0.0, "vmax": 1.0,
        "cmap": "viridis", "title": title, "unit": "accuracy",
        "values": [None if math.isnan(v) else int(round(v * 10000)) for v in values.ravel()],
        "rowLabels": [str(int(i)) for i in grid.index], "colLabels": [str(int(c)) for c in grid.columns],
        "xLabel": "head", "yLabel": "layer",
    }}


def _reasons(counts: dict) -> list[str]:
    out = [f"{n} not aligned: {why} ({REASONS.get(why, why)})" for why, n in counts.get("unaligned", {}).items()]
    out += [f"{n} left out: {why} ({SKIPS.get(why, why)})" for why, n in counts.get("skipped", {}).items()]
    return out


def choose_view(res: CorefResult, site: int, head: int) -> CorefView | None:
    """The example to draw for a head: one it answers correctly where ``nearest`` is wrong, else
    one it answers correctly, else the first kept example."""
    if not res.views:
        return None
    right = [v for v in res.views if bool(v.answers_a()[site, head]) == v.truth_a]
    harder = [v for v in right if v.baselines["nearest"] != v.truth_a]
    return (harder or right or res.views)[0]


def _example_figure(view: CorefView, site: int, layer: int, head: int) -> tuple[dict, dict]:
    marks = {i: "P" for i in view.pronoun} | {i: "A" for i in view.a} | {i: "B" for i in view.b}
    lo = max(0, min(marks) - CONTEXT_WORDS)
    hi = min(len(view.words), max(marks) + CONTEXT_WORDS + 1, lo + MAX_EXAMPLE_WORDS)
    row = view.rows[site, head, lo:hi]
    labels = [f"{w} ({marks[i]})" if i in marks else w for i, w in enumerate(view.words[lo:hi], start=lo)]
    answer = "A" if bool(view.answers_a()[site, head]) else "B"
    fid = "coref-example"
    fig = {fid: {
        "rows": 1, "cols": len(labels), "scale": 1000, "vmin": 0.0, "vmax": float(max(row.max(), 1e-6)),
        "cmap": "blues", "title": head_name(layer, head),
        "values": np.rint(row * 1000).astype(int).tolist(), "rowLabels": [view.words[view.pronoun[0]]],
        "colLabels": labels, "xLabel": "word (attended to)", "yLabel": "",
    }}
    att_a, att_b = float(view.rows[site, head, view.a].sum()), float(view.rows[site, head, view.b].sum())
    info = {"id": fid, "example": view.id, "text": view.text, "words": f"words {lo + 1}-{hi} of {len(view.words)}",
            "a": " ".join(view.words[i] for i in view.a), "b": " ".join(view.words[i] for i in view.b),
            "pronoun": " ".join(view.words[i] for i in view.pronoun), "truth": "A" if view.truth_a else "B",
            "answer": answer, "att_a": f"{att_a:.3f}", "att_b": f"{att_b:.3f}",
            "nearest": "A" if view.baselines["nearest"] else "B",
            "words_share": f"{float(view.rows[site, head].sum()):.3f}"}
    return fig, info


@section_builder
def coref_section(result, tokenizer) -> Section | None:
    """The coreference section: accuracy heatmap, best heads next to the baselines, an example."""
    res: CorefResult | None = result.results.get("coreference")
    if res is None:
        return None
    heads = res.heads
    n_heads = int(heads["head"].max()) + 1 if len(heads) else 0
    figures = _grid(heads, "coreference accuracy", "coref-accuracy") if res.counts["scored"] else {}
    best = res.best(5) if res.counts["scored"] else res.heads.iloc[:0]
    rows = [[head_name(r.layer, r.head), r.n, _pct(r.accuracy), _interval(r.ci_low, r.ci_high)]
            for r in best.itertuples()]
    rows += [[f"baseline: {kind}", r.n, _pct(r.accuracy), _interval(r.ci_low, r.ci_high)]
             for kind, r in res.baselines.iterrows()]
    example = None
    if len(best) and res.counts["scored"]:
        top = best.iloc[0]
        pos = int(best.index[0])  # head rows are site-major: position = site * heads + head
        view = choose_view(res, pos // n_heads, int(top["head"]))
        if view is not None:
            fig, example = _example_figure(view, pos // n_heads, int(top["layer"]), int(top["head"]))
            figures.update(fig)
    labelled = [head_name(r.layer, r.head) for r in res.labelled().itertuples()]
    html = render_fragment(
        "coref.html.j2", counts=res.counts, reasons=_reasons(res.counts), rows=rows, labelled=labelled,
        preceding_only=res.preceding_only, best_baseline=_pct(res.best_baseline()), example=example,
        has_grid="coref-accuracy" in figures)
    record = {"counts": res.counts, "preceding_only": res.preceding_only,
              "baselines": {k: {"accuracy": _num(r.accuracy), "ci_low": _num(r.ci_low), "ci_high": _num(r.ci_high)}
                            for k, r in res.baselines.iterrows()},
              "best_heads": [{"layer": int(r.layer), "head": int(r.head), "accuracy": _num(r.accuracy),
                              "ci_low": _num(r.ci_low), "ci_high": _num(r.ci_high)} for r in best.itertuples()],
              "labelled": labelled, "multi_word_names": "sum over the name's words"}
    return Section("coreference", "Coreference heads", html, figures,
                   {"coref.csv": res.table.to_csv(index=False, float_format="%.6g")}, record, order=60)


def _table1(res: SyntaxResult) -> list[dict]:
    """One row per relation: for each direction, the best head, its accuracy and interval, the
    baseline (offset) and whether the head earns the label."""
    rows = []
    for rel, part in res.best.groupby("relation", sort=False):
        row = {"relation": rel, "n": int(part["n"].iloc[0]), "cells": []}
        for direction in DIRECTIONS:
            r = part[part["direction"] == direction].iloc[0]
            row["cells"].append({
                "head": head_name(r["layer"], r["head"]), "accuracy": _pct(r["accuracy"]),
                "interval": _interval(r["ci_low"], r["ci_high"]),
                "baseline": f"{_pct(r['baseline'])} ({int(r['baseline_offset']):+d})",
                "label": rel != ALL and r["gain"] >= res.margin - 1e-9,
                "reachable": _pct(res.reachable.get(rel, {}).get(direction))})
        rows.append(row)
    return rows


@section_builder
def syntax_section(result, tokenizer) -> Section | None:
    """The syntax section: Clark et al.'s Table 1 (both directions), counts, an accuracy heatmap."""
    res: SyntaxResult | None = result.results.get("syntax")
    if res is None:
        return None
    t = res.table
    pooled = t[(t["relation"] == ALL) & (t["direction"] == DIRECTIONS[0]) & (t["kind"] == "head")]
    figures = _grid(pooled, "all relations, dep->head", "syntax-all") \
        if len(pooled) else {}
    labelled = sorted({f"{r['relation']}" for _, r in res.best.iterrows()
                       if r["relation"] != ALL and r["gain"] >= res.margin - 1e-9})
    html = render_fragment(
        "syntax.html.j2", counts=res.counts, rows=_table1(res), causal=bool(result.model.get("causal")),
        unaligned=[f"{n} {why} ({REASONS.get(why, 'the forms of the sentence are not found in its # text line')})"
                   for why, n in res.counts["unaligned"].items()],
        margin=_pct(res.margin), labelled=labelled, has_grid=bool(figures))
    record = {"counts": res.counts, "margin": res.margin,
              "best": res.best.astype(object).where(res.best.notna(), None).to_dict("records")}
    return Section("syntax", "Syntactic heads", html, figures,
                   {"syntax.csv": res.table.to_csv(index=False, float_format="%.6g")}, record, order=61)


def summary_lines(result) -> list[str]:
    """One line per analysis that ran, for the command line: counts, best head vs baselines."""
    lines = []
    res = result.results.get("coreference")
    if res is not None:
        c = res.counts
        left = c["examples"] - c["scored"]
        why = ", ".join(f"{n} {k}" for k, n in {**c["unaligned"], **c["skipped"]}.items())
        parts = [f"coreference: {c['scored']} of {plural(c['examples'], 'example')} scored"
                 + (f" ({left} left out: {why})" if left else "")]
        if c["scored"]:
            top = res.best(1).iloc[0]
            parts.append(f"best head {head_name(top['layer'], top['head'])} right on {_pct(top['accuracy'])}% of them "
                         f"(95% interval {_span(top['ci_low'], top['ci_high'])})")
            parts.append("baselines on the same examples: " + ", ".join(
                f"{BASELINE_NAMES.get(kind, kind)} {_pct(r.accuracy)}% ({_span(r.ci_low, r.ci_high)})"
                for kind, r in res.baselines.iterrows()))
            parts.append(f"heads labelled coreference: {len(res.labelled())} of {len(res.heads)}")
        lines.append("; ".join(parts))
    res = result.results.get("syntax")
    if res is not None:
        c = res.counts
        why = ", ".join(f"{n} {k}" for k, n in c["unaligned"].items())
        parts = [f"syntax: {c['aligned']} of {c['sentences']} sentences aligned" + (f" ({why})" if why else ""),
                 f"{c['dependencies']} dependencies"]
        pooled = res.best[(res.best["relation"] == ALL) & (res.best["direction"] == DIRECTIONS[0])]
        if len(pooled):
            r = pooled.iloc[0]
            parts.append(f"all relations dep->head: best head {head_name(r['layer'], r['head'])} "
                         f"{_pct(r['accuracy'])}% {_interval(r['ci_low'], r['ci_high'])} vs baseline "
                         f"{_pct(r['baseline'])}% (offset {int(r['baseline_offset']):+d})")
        won = sorted({r for r, g in zip(res.best["relation"], res.best["gain"]) if r != ALL and g >= res.margin - 1e-9})
        parts.append(f"relations with a syntactic head: {', '.join(won) if won else 'none'}")
        lines.append("; ".join(parts))
    return lines
