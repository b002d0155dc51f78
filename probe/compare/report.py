"""The comparison folder: ``index.html`` (offline, the report's heatmap script), ``compare.csv``,
``compare.json``.

The page shows both runs, how they were aligned, label counts, a layer x head grid of label
changes and removed heads, one layer x head heatmap of |B - A| per statistic, per-layer mean
differences, the heads whose label changed, and the most changed heads' attention side by side on
the same sentence (when both runs kept an example of the same text).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path

import numpy as np

from ..analysis import versions
from ..errors import InputError
from ..report.page import CSP, _environment, _json_for_script, prepare_run_dir, static_text
from ..stats import STATISTICS
from ..tokens import display_tokens
from .diff import NOT_PROBABILITY, as_result, compare_runs, geometry, label_counts, layer_summary, most_changed

#: Tokens per side of the side-by-side attention heatmaps.
MAX_TOKENS = 64

#: Cell colours of the label-change grid.
STATUS_COLORS = {"same": "#e8f3e8", "changed": "#ffd27f", "removed in A": "#bdbdbd", "removed in B": "#bdbdbd",
                 "removed in both": "#9e9e9e", "only in A": "#f4f4f4", "only in B": "#f4f4f4"}

OUTPUT_FILES = ("index.html", "compare.csv", "compare.json")


def shared_example(a, b):
    """The first pair of kept examples with the same text: ``(example_a, example_b)``, or None."""
    for ea in a.examples:
        for eb in b.examples:
            if ea.text == eb.text:
                return ea, eb
    return None


def _labels(ex, tokenizer) -> list[str]:
    if ex.labels is not None:
        return list(ex.labels)
    if tokenizer is not None:
        return display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special)
    return [str(i) for i in ex.ids]


def _delta_figures(df, n_layers: int, width: int, row_labels: list[str]) -> tuple[dict, list[dict]]:
    figures, blocks = {}, []
    for stat in df.attrs["statistics"]:
        grid = np.full((n_layers, width), np.nan)
        grid[df["layer"].to_numpy(), df["head"].to_numpy()] = df[f"delta_{stat}"].abs().to_numpy(dtype=float)
        title = f"|\u0394 {stat}|"
        if np.isnan(grid).all():
            blocks.append({"id": None, "title": f"{title}: not defined for both runs"})
            continue
        top = float(np.nanmax(grid))
        vmax = top if (stat in NOT_PROBABILITY or stat not in STATISTICS) and top > 0 else 1.0
        fid = f"delta-{stat}"
        figures[fid] = {"rows": n_layers, "cols": width, "scale": 10000, "vmin": 0.0, "vmax": vmax, "cmap": "viridis",
                        "title": f"{title} (max {top:.3g})",
                        "values": [None if math.isnan(v) else int(round(v * 10000)) for v in grid.ravel()],
                        "rowLabels": row_labels, "colLabels": [str(h) for h in range(width)],
                        "xLabel": "head", "yLabel": "layer (A\u2192B)"}
        blocks.append({"id": fid, "title": title})
    return figures, blocks


def _side_by_side(top, pair, tokenizers) -> tuple[dict, list[dict]]:
    figures, blocks = {}, []
    if pair is None:
        return figures, blocks
    ea, eb = pair
    labels = [_labels(ea, tokenizers[0]), _labels(eb, tokenizers[1])]
    for _, row in top.iterrows():
        layer, layer_b, head = int(row["layer"]), int(row["layer_b"]), int(row["head"])
        pair_figs = []
        for side, ex, lay, labs in (("A", ea, layer, labels[0]), ("B", eb, layer_b, labels[1])):
            n = min(ex.probs.shape[-1], MAX_TOKENS)
            fid = f"pair-{layer}-{head}-{side}"
            values = np.rint(ex.probs[lay, head, :n, :n] * 1000)
            figures[fid] = {"rows": n, "cols": n, "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
                            "title": f"{side}: layer {lay} head {head} ({row[f'label_{side.lower()}']})",
                            "values": [None if math.isnan(v) else int(v) for v in values.ravel()],
                            "rowLabels": labs[:n], "colLabels": labs[:n],
                            "xLabel": "key (attended to)", "yLabel": "query (attending)"}
            pair_figs.append(fid)
        blocks.append({"ids": pair_figs, "layer": layer, "layer_b": layer_b, "head": head,
                       "change": row["change"], "label_a": row["label_a"], "label_b": row["label_b"]})
    return figures, blocks


def _status_grid(df, n_layers: int, width: int) -> list[list[dict]]:
    grid = [[None] * width for _ in range(n_layers)]
    for row in df.to_dict("records"):
        st = row["status"]
        kind = ("changed" if row["label_changed"] else "same") if st == "both" else st
        text = {"same": "", "changed": "\u2260"}.get(kind, "\u00d7" if kind.startswith("removed") else "\u2013")
        change = "" if math.isnan(row["change"]) else f" | change {row['change']:.3f}"
        tip = (f"A L{row['layer']} H{row['head']}: {row['label_a'] or '-'} | B L{row['layer_b']} H{row['head']}: "
               f"{row['label_b'] or '-'} | {st}{change}")
        grid[row["layer"]][row["head"]] = {"color": STATUS_COLORS[kind], "text": text, "tip": tip}
    return grid


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else ""
    if isinstance(v, (float, np.floating)):
        return "" if math.isnan(v) else f"{v:+.3f}" if abs(v) < 100 else f"{v:+.1f}"
    return str(v)


def _run_info(result, tag: str) -> dict:
    m, c = result.model, result.counts
    layers, heads = geometry(result)
    return {"tag": tag, "name": m.get("name", "?"), "source": m.get("source", ""), "type": m.get("model_type", ""),
            "geometry": f"{layers} x {heads}", "sequences": c.get("sequences", "?"), "tokens": c.get("tokens", "?"),
            "folder": result.settings.get("run_folder", "(in memory)"), "removed": m.get("removed_heads", 0)}


def write_compare(a, b, out: str | Path | None = None, *, force: bool = False, top: int = 4,
                  tokenizers=(None, None)) -> Path:
    """Compare two runs and write the comparison folder; return it.

    Args:
        a, b: analysis results or run folders.
        out: the folder (default: a new ``reports/compare-<A>-vs-<B>-<time>``).
        force: overwrite probe's files in an existing, non-empty ``out``.
        top: how many of the most changed heads to draw side by side.
        tokenizers: (A's, B's) tokenizer, for token labels of in-memory results.

    Raises:
        InputError: a folder that is not a run folder, or ``out`` taken (without ``force``).
    """
    a, b = as_result(a), as_result(b)
    name_a, name_b = a.model.get("name", "A"), b.model.get("name", "B")
    path = prepare_run_dir(out, f"compare-{Path(str(name_a)).name}-vs-{Path(str(name_b)).name}", force)
    df = compare_runs(a, b)
    (layers_a, heads_a), (layers_b, heads_b) = geometry(a), geometry(b)
    width = max(heads_a, heads_b)
    row_labels = [f"{i}\u2192{j}" if layers_a != layers_b else str(i) for i, j in enumerate(df.attrs["layer_map"])]
    delta_figs, delta_blocks = _delta_figures(df, layers_a, width, row_labels)
    pair = shared_example(a, b)
    notes = list(df.attrs["notes"])
    if pair is None:
        notes.append("the runs kept no example of the same text (their first examples: "
                     f"{_first_text(a)!r} and {_first_text(b)!r}), so attention is not shown side by side")
    top_rows = most_changed(df, top)
    pair_figs, pair_blocks = _side_by_side(top_rows, pair, tokenizers)
    layers_df = layer_summary(a, b, df)
    stats = df.attrs["statistics"]
    changed = df[df["label_changed"]]
    record = {
        "created": _dt.datetime.now().isoformat(timespec="seconds"), "a": _run_info(a, "A"), "b": _run_info(b, "B"),
        "layer_map": df.attrs["layer_map"], "statistics": stats, "notes": notes,
        "counts": {"rows": len(df), **{s: int((df["status"] == s).sum()) for s in df["status"].unique()},
                   "label_changed": int(df["label_changed"].sum())},
        "max_abs_delta": {s: (None if df[f"delta_{s}"].isna().all() else float(df[f"delta_{s}"].abs().max()))
                          for s in stats},
        "shared_example": None if pair is None else pair[0].text, "versions": versions(),
    }
    page = _environment().get_template("compare.html.j2").render(
        a=record["a"], b=record["b"], notes=notes, record=record, csp=CSP,
        label_counts=label_counts(a, b).to_dict("records"), grid=_status_grid(df, layers_a, width),
        row_labels=row_labels, width=width, colors=STATUS_COLORS, delta_blocks=delta_blocks, pair_blocks=pair_blocks,
        shared=None if pair is None else pair[0].text,
        layer_cols=["layer", "layer_b"] + [f"delta_{s}" for s in stats],
        layer_rows=[[_fmt(r[c]) if c.startswith("delta_") else str(r[c]) for c in ["layer", "layer_b"] +
                     [f"delta_{s}" for s in stats]] for r in layers_df.to_dict("records")],
        changed=[[r["layer"], r["layer_b"], r["head"], r["label_a"], r["label_b"], _fmt(r["change"])]
                 for r in changed.to_dict("records")],
        data_json=_json_for_script({"figures": {**delta_figs, **pair_figs}}), script=static_text("heatmap.js"))
    try:
        path.mkdir(parents=True, exist_ok=True)
        df.to_csv(path / "compare.csv", index=False, float_format="%.6g")
        (path / "index.html").write_text(page, encoding="utf-8")
        record["output"] = {name: str(path / name) for name in OUTPUT_FILES}
        (path / "compare.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the comparison folder {path}: {exc.strerror or exc}") from None
    return path


def _first_text(result) -> str:
    return result.examples[0].text[:60] if result.examples else "(none kept)"

