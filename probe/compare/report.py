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

from ..errors import InputError
from ..measures.stats import STATISTICS
from ..records import versions
from ..report import GROUP_SHORT, SITE_GROUPS, claim_run_dir
from ..report.page import CSP, json_for_script, static_text, template_environment
from ..report.portable import shorten_paths
from ..sites import head_name
from ..text.tokens import display_tokens
from .diff import (
    NOT_PROBABILITY,
    as_result,
    compare_runs,
    geometry,
    label_counts,
    layer_summary,
    most_changed,
    same_model,
)

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


def undefined_in(a, b, stat: str, site: tuple[str, str] | None = None) -> str:
    """Why no head has a difference of ``stat``: which run lacks it (all its heads NaN; among the
    heads of one (stack, kind) ``site`` of encoder-decoder runs), or that no head with a value is
    in both runs."""
    def heads(r):
        h = r.heads
        return h if site is None else h[(h["stack"] == site[0]) & (h["kind"] == site[1])]

    lacking = [f"run {tag} ({r.model.get('name', tag)})" for tag, r in (("A", a), ("B", b))
               if stat not in r.heads or heads(r)[stat].isna().all()]
    if len(lacking) == 2:
        return "not defined for either run"
    if lacking:
        return f"not defined for {lacking[0]}"
    return "no head has a value in both runs (removed, or a head only one model has)"


def names(row) -> tuple[str, str]:
    """(A's, B's) display name of a compared head (its site kind first for encoder-decoder runs)."""
    site = {"stack": row.get("stack"), "kind": row.get("kind")}
    return head_name({**site, "layer": row["layer"]}, row["head"]), head_name({**site, "layer": row["layer_b"]},
                                                                                row["head"])


def site_groups(df, a, b) -> list[dict]:
    """The page's groups: one for one-stack runs, one per site kind (stack, kind) for encoder-decoder
    runs, each with its rows, title, figure-id prefix, layers of A and row labels (A's layer -> B's)."""
    maps = df.attrs["layer_map"]
    if not isinstance(maps, dict):
        parts = [(None, "", df, maps)]
    else:
        parts = []
        for key, layer_map in maps.items():
            stack, kind = key.split(".")
            parts.append((SITE_GROUPS[(stack, kind)], f"{stack}-{kind}-",
                          df[(df["stack"] == stack) & (df["kind"] == kind)], layer_map))
    groups = []
    for title, prefix, rows, layer_map in parts:
        deeper = len(set(layer_map)) != len(layer_map) or max(layer_map) != len(layer_map) - 1
        labels = [f"{i}\u2192{j}" if deeper else str(i) for i, j in enumerate(layer_map)]
        groups.append({"title": title, "prefix": prefix, "rows": rows, "n_layers": len(layer_map), "labels": labels})
    return groups


def _delta_figures(df, n_layers: int, width: int, row_labels: list[str], a, b, prefix: str = "",
                   group: str | None = None) -> tuple[dict, list[dict]]:
    figures, blocks = {}, []
    for stat in df.attrs["statistics"]:
        grid = np.full((n_layers, width), np.nan)
        grid[df["layer"].to_numpy(), df["head"].to_numpy()] = df[f"delta_{stat}"].abs().to_numpy(dtype=float)
        title = f"|\u0394 {stat}|" if group is None else f"{group}: |\u0394 {stat}|"
        if np.isnan(grid).all():
            site = tuple(prefix.strip("-").split("-")) if prefix else None
            why = undefined_in(a, b, stat, site)
            if site is None or why != "not defined for either run":  # a site kind leaves out what it does not define
                blocks.append({"id": None, "title": f"{title}: {why}"})
            continue
        top = float(np.nanmax(grid))
        vmax = top if (stat in NOT_PROBABILITY or stat not in STATISTICS) and top > 0 else 1.0
        fid = f"delta-{prefix}{stat}"
        figures[fid] = {"rows": n_layers, "cols": width, "scale": 10000, "vmin": 0.0, "vmax": vmax, "cmap": "viridis",
                        "title": f"{title} (max {top:.3g})",
                        "values": [None if math.isnan(v) else int(round(v * 10000)) for v in grid.ravel()],
                        "rowLabels": row_labels, "colLabels": [str(h) for h in range(width)],
                        "xLabel": "head", "yLabel": "layer (A\u2192B)"}
        blocks.append({"id": fid, "title": title})
    return figures, blocks


def _site_map(ex, row, layer: int, tokenizer):
    """(the [heads, query, key] maps, query labels, key labels) of the compared head's site in an example."""
    source = _labels(ex, tokenizer)
    if row.get("stack") != "decoder":
        return ex.probs[layer], source, source
    t = ex.target or {}
    if not ex.decoder or not t:
        return None, None, None
    target = t.get("labels") or (display_tokens(tokenizer, t["text"], t["ids"], [tuple(o) for o in t["offsets"]],
                                                t["special"]) if tokenizer is not None else [str(i) for i in t["ids"]])
    return ex.decoder[f"decoder.{layer}.{row['kind']}"], target, source if row["kind"] == "cross" else target


def _side_by_side(top, pair, tokenizers) -> tuple[dict, list[dict]]:
    figures, blocks = {}, []
    if pair is None:
        return figures, blocks
    ea, eb = pair
    for _, row in top.iterrows():
        layer, layer_b, head = int(row["layer"]), int(row["layer_b"]), int(row["head"])
        name_a, name_b = names(row)
        pair_figs, prefix = [], "" if "stack" not in row else f"{row['stack']}-{row['kind']}-"
        for side, ex, lay, tok, name in (("A", ea, layer, tokenizers[0], name_a), ("B", eb, layer_b, tokenizers[1],
                                                                                   name_b)):
            maps, queries, keys = _site_map(ex, row, lay, tok)
            if maps is None:
                continue
            nq, nk = min(maps.shape[-2], MAX_TOKENS), min(maps.shape[-1], MAX_TOKENS)
            fid = f"pair-{prefix}{layer}-{head}-{side}"
            values = np.rint(maps[head, :nq, :nk] * 1000)
            figures[fid] = {"rows": nq, "cols": nk, "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
                            "title": f"{side}: {name} ({row[f'label_{side.lower()}']})",
                            "values": [None if math.isnan(v) else int(v) for v in values.ravel()],
                            "rowLabels": queries[:nq], "colLabels": keys[:nk],
                            "xLabel": "key (attended to)", "yLabel": "query (attending)"}
            pair_figs.append(fid)
        blocks.append({"ids": pair_figs, "layer": layer, "layer_b": layer_b, "head": head,
                       "name_a": name_a, "name_b": name_b,
                       "change": row["change"], "label_a": row["label_a"], "label_b": row["label_b"]})
    return figures, blocks


def _status_grid(df, n_layers: int, width: int) -> list[list[dict]]:
    grid = [[None] * width for _ in range(n_layers)]
    for row in df.to_dict("records"):
        st = row["status"]
        kind = ("changed" if row["label_changed"] else "same") if st == "both" else st
        text = {"same": "", "changed": "\u2260"}.get(kind, "\u00d7" if kind.startswith("removed") else "\u2013")
        change = "" if math.isnan(row["change"]) else f" | change {row['change']:.3f}"
        name_a, name_b = names(row)
        tip = f"A {name_a}: {row['label_a'] or '-'} | B {name_b}: {row['label_b'] or '-'} | {st}{change}"
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
    with claim_run_dir(out, compare_name(a, b), force, kind="compare") as folder:
        return _write(a, b, folder, top, tokenizers)


#: The default folder name's stem of a comparison of models A and B.
COMPARE_STEM = "compare-{}-vs-{}"


def compare_name(a, b) -> str:
    """The default folder name's stem of comparing runs ``a`` and ``b``: ``compare-<A>-vs-<B>``."""
    return COMPARE_STEM.format(*(Path(str(r.model.get("name", tag))).name for r, tag in ((a, "A"), (b, "B"))))


def _write(a, b, folder, top: int, tokenizers) -> Path:
    """The comparison folder's files, written through the claimed ``folder``."""
    path = folder.path
    df = compare_runs(a, b)
    width = max(geometry(a)[1], geometry(b)[1])
    groups, delta_figs = site_groups(df, a, b), {}
    for g in groups:
        figs, g["deltas"] = _delta_figures(g["rows"], g["n_layers"], width, g["labels"], a, b, g["prefix"],
                                           GROUP_SHORT.get(g["title"]) if g["title"] else None)
        g["grid"] = _status_grid(g["rows"], g["n_layers"], width)
        delta_figs.update(figs)
    pair = shared_example(a, b)
    notes = list(df.attrs["notes"])
    no_pair = None if pair is not None else (
        "The runs kept no example of the same text (their first examples: "
        f"{_first_text(a)!r} and {_first_text(b)!r}), so attention is not shown side by side; "
        + ("analyse the same text in both runs to see it." if same_model(a, b) else
           "analyse the same corpus with both models (probe compare --model A --model B) to see it."))
    if no_pair:
        notes.append(no_pair)
    top_rows = most_changed(df, top)
    pair_figs, pair_blocks = _side_by_side(top_rows, pair, tokenizers)
    layers_df = layer_summary(a, b, df)
    stats = df.attrs["statistics"]
    changed = df[df["label_changed"]]
    layer_cols = [c for c in ("stack", "kind") if c in layers_df] + ["layer", "layer_b"] + [f"delta_{s}" for s in stats]
    record = {
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "a": shorten_paths(_run_info(a, "A"), path), "b": shorten_paths(_run_info(b, "B"), path),
        "layer_map": df.attrs["layer_map"], "statistics": stats, "notes": notes,
        "counts": {"rows": len(df), **{s: int((df["status"] == s).sum()) for s in df["status"].unique()},
                   "label_changed": int(df["label_changed"].sum())},
        "max_abs_delta": {s: (None if df[f"delta_{s}"].isna().all() else float(df[f"delta_{s}"].abs().max()))
                          for s in stats},
        "shared_example": None if pair is None else pair[0].text, "versions": versions(),
    }
    notes = record["notes"] = shorten_paths(notes, path)
    page = template_environment().get_template("compare.html.j2").render(
        a=record["a"], b=record["b"], notes=notes, record=record, csp=CSP,
        label_counts=label_counts(a, b).to_dict("records"), groups=groups,
        width=width, colors=STATUS_COLORS, pair_blocks=pair_blocks,
        shared=None if pair is None else pair[0].text, no_pair=no_pair,
        layer_cols=layer_cols, layer_rows=[[_fmt(r[c]) if c.startswith("delta_") else str(r[c]) for c in layer_cols]
                                           for r in layers_df.to_dict("records")],
        changed=[[*names(r), r["label_a"], r["label_b"], _fmt(r["change"])] for r in changed.to_dict("records")],
        data_json=json_for_script({"figures": {**delta_figs, **pair_figs}}), script=static_text("heatmap.js"))
    record["output"] = {name: name for name in OUTPUT_FILES}  # relative to the comparison folder
    with folder.staging() as tmp:
        try:
            df.to_csv(tmp / "compare.csv", index=False, float_format="%.6g")
            (tmp / "index.html").write_text(page, encoding="utf-8")
            (tmp / "compare.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write the comparison folder {path}: {exc.strerror or exc}") from None
    return path


def _first_text(result) -> str:
    return result.examples[0].text[:60] if result.examples else "(none kept)"

