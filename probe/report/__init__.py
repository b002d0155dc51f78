"""Report writer: a run folder with ``index.html`` (self-contained, offline), ``heads.csv`` and ``run.json``.

A run folder never overwrites an earlier one unless ``force`` is given; the default folder is a
new ``reports/<model>-<timestamp>`` under the current directory.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np
from jinja2 import Environment, PackageLoader, select_autoescape

from ..analysis import AnalysisResult, versions
from ..classify import LABEL_RULES, MIXED
from ..errors import InputError
from ..stats import STATISTICS, token_surface
from . import plots

#: Colors of the primary labels in the layer x head grid (colour-blind-safe Okabe-Ito palette + greys).
LABEL_COLORS = {
    "previous-token": "#E69F00", "next-token": "#56B4E9", "self": "#009E73", "first-token": "#0072B2",
    "sep": "#D55E00", "punctuation": "#CC79A7", "broad": "#F0E442", "long-range": "#999999",
    MIXED: "#FFFFFF",
}

#: Short texts of the primary labels inside the grid cells.
LABEL_SHORT = {
    "previous-token": "prev", "next-token": "next", "self": "self", "first-token": "1st", "sep": "sep",
    "punctuation": "punc", "broad": "brd", "long-range": "long", MIXED: "",
}

OUTPUT_FILES = ("index.html", "heads.csv", "run.json")

#: Attention heatmaps of longer examples show their first this many tokens (labels stay readable).
MAX_HEATMAP_TOKENS = 64


def default_run_dir(model_name: str, root: str | Path = "reports") -> Path:
    """A new folder ``root/<model>-<YYYYmmdd-HHMMSS>`` (suffixed -2, -3 ... if taken)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name or model_name).strip("-") or "model"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{slug}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def prepare_run_dir(out: str | Path | None, model_name: str, force: bool = False) -> Path:
    """Check (without creating) that a run folder may be written.

    Raises:
        InputError: ``out`` exists and is not empty and ``force`` is False, or ``out`` is a file.
    """
    path = default_run_dir(model_name) if out is None else Path(out)
    for parent in path.parents:  # the nearest existing ancestor must be a writable folder
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"cannot create output folder {path}: {parent} is a file")
            if not os.access(parent, os.W_OK):
                raise InputError(f"cannot create output folder {path}: {parent} is not writable")
            break
    if out is None:
        return path
    if path.exists() and not path.is_dir():
        raise InputError(f"output path exists and is not a folder: {out}")
    if path.exists() and any(path.iterdir()) and not force:
        raise InputError(f"output folder {out} already exists and is not empty; use --force to overwrite")
    return path


def display_token(tokenizer, token: str) -> str:
    """A readable label for a token string: byte-level BPE decoded, sentencepiece marker dropped."""
    if token in getattr(tokenizer, "all_special_tokens", []):
        return token
    text = token_surface(tokenizer, token).replace("\n", "\\n").strip()
    return text or repr(token)


def choose_heads(result: AnalysisResult, per_label: int = 1, limit: int = 8) -> list[tuple[int, int, str, str]]:
    """Heads to draw: the strongest head of each primary label (statistic / threshold), then the
    most focused ``mixed`` head. Returns (layer, head, label, reason) tuples."""
    heads = result.heads
    chosen = []
    for label, (stat, _) in LABEL_RULES.items():
        rows = heads[heads["label"] == label]
        if rows.empty:
            continue
        for _, row in rows.sort_values(stat, ascending=False).head(per_label).iterrows():
            chosen.append((int(row["layer"]), int(row["head"]), label, f"{stat} = {row[stat]:.2f}"))
    mixed = heads[heads["label"] == MIXED]
    if not mixed.empty:
        row = mixed.sort_values("max_weight", ascending=False).iloc[0]
        chosen.append((int(row["layer"]), int(row["head"]), MIXED, f"max_weight = {row['max_weight']:.2f}"))
    return chosen[:limit]


def _example_view(tokenizer, ex) -> dict:
    """Text of an example as analysed (the decoded tokens when truncation cut it)."""
    if not ex.truncated:
        return {"text": ex.text, "n_tokens": len(ex.tokens), "truncated": False}
    analysed = tokenizer.convert_tokens_to_string(
        [t for t in ex.tokens if t not in getattr(tokenizer, "all_special_tokens", [])]).strip()
    return {"text": analysed + " [...]", "n_tokens": len(ex.tokens), "truncated": True}


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def run_record(result: AnalysisResult, extra: dict | None = None) -> dict:
    """The JSON record of a run (model, settings, thresholds, counts, versions, timings, notes)."""
    rec = {
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "model": result.model,
        "settings": result.settings,
        "thresholds": {label: {"statistic": LABEL_RULES[label][0], "threshold": thr}
                       for label, thr in result.thresholds.items()},
        "counts": result.counts,
        "label_counts": result.label_counts(),
        "timings_s": result.timings,
        "versions": versions(),
        "notes": result.notes,
        "statistics": list(STATISTICS),
    }
    rec.update(extra or {})
    return rec


def render_html(result: AnalysisResult, tokenizer, record: dict, verification: dict | None = None) -> str:
    """The self-contained report page (all figures inline, no external resources, input escaped)."""
    env = Environment(loader=PackageLoader("probe", "report/templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    heads = result.heads
    n_layers, n_heads = result.model["layers"], result.model["heads"]
    grid = [[None] * n_heads for _ in range(n_layers)]
    for _, row in heads.iterrows():
        tip = "; ".join(f"{s}={_fmt(row[s])}" for s in STATISTICS if _fmt(row[s]))
        grid[int(row["layer"])][int(row["head"])] = {
            "label": row["label"], "labels": row["labels"], "color": LABEL_COLORS.get(row["label"], "#fff"),
            "short": LABEL_SHORT.get(row["label"], ""),
            "tip": f"L{int(row['layer'])} H{int(row['head'])}: {row['labels']} | {tip}",
        }
    figures = []
    for layer, head, label, reason in choose_heads(result):
        for i, ex in enumerate(result.examples[:2]):
            n = min(len(ex.tokens), MAX_HEATMAP_TOKENS)
            tokens = [display_token(tokenizer, t) for t in ex.tokens[:n]]
            crop = f", first {n} of {len(ex.tokens)} tokens" if n < len(ex.tokens) else ""
            figures.append({
                "layer": layer, "head": head, "label": label, "reason": reason, "example": i + 1, "crop": crop,
                "img": plots.attention_heatmap(ex.attentions[layer, head, :n, :n], tokens,
                                               f"layer {layer} head {head} ({label}), example {i + 1}{crop}"),
            })
    table_cols = ["layer", "head", "label", "labels", *STATISTICS, "cluster"]
    table = [[_fmt(row[c]) for c in table_cols] for _, row in heads.iterrows()]
    return env.get_template("report.html.j2").render(
        result=result, record=record, grid=grid, colors=LABEL_COLORS,
        label_counts=result.label_counts(), stat_figs=plots.statistic_heatmaps(heads),
        figures=figures, table_cols=table_cols, table=table, verification=verification,
        examples=[_example_view(tokenizer, ex) for ex in result.examples],
    )


def write_run(result: AnalysisResult, tokenizer, out: str | Path | None = None, *, force: bool = False,
              verification: dict | None = None) -> Path:
    """Write ``index.html``, ``heads.csv`` and ``run.json`` to a run folder; return the folder.

    Args:
        result: what :func:`probe.analysis.analyze` returned.
        tokenizer: the model's tokenizer (for readable token labels).
        out: the folder (default: a new ``reports/<model>-<timestamp>``).
        force: overwrite probe's files in an existing, non-empty ``out`` (other files are kept).
        verification: optional ``probe.verify`` JSON record, shown as a section of the report.

    Raises:
        InputError: ``out`` exists and is not empty and ``force`` is False.
    """
    path = prepare_run_dir(out, result.model["name"], force)
    record = run_record(result, {"verification": verification} if verification else None)
    start = time.perf_counter()
    html = render_html(result, tokenizer, record, verification)
    record["timings_s"] = {**record["timings_s"], "report_s": round(time.perf_counter() - start, 4)}
    try:
        path.mkdir(parents=True, exist_ok=True)
        record["output"] = {name: str(path / name) for name in OUTPUT_FILES}
        result.heads.to_csv(path / "heads.csv", index=False, float_format="%.6g")
        (path / "run.json").write_text(json.dumps(record, indent=2, default=_json_default) + "\n", encoding="utf-8")
        (path / "index.html").write_text(html, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the run folder {path}: {exc.strerror or exc}") from None
    return path


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
