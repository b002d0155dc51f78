"""Report writer: a run folder with ``index.html`` (self-contained, offline), ``heads.csv`` and ``run.json``.

The page carries its data inline (one JSON block) and draws every heatmap on a ``<canvas>`` with a
small inline script (``static/heatmap.js``): no image is rendered in Python, no library or font is
fetched, and a strict Content-Security-Policy (``default-src 'none'``; inline script and style
only) forbids any network request. Token labels are escaped wherever they appear.

A run folder is claimed before the run starts and written whole (:mod:`probe.runfolder`); it never
replaces an earlier one unless ``force`` is given, and then only probe's own files. The default
folder is a new ``reports/<model>-<timestamp>`` under the current directory.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..measures.classify import LABEL_RULES
from ..measures.stats import CROSS_STATISTICS, STATISTICS
from ..records import AnalysisResult, versions
from ..sites import head_name
from ..text.tokens import display_tokens
from .page import (  # re-exported: the page's shared pieces, imported from here by older code
    CSP,
    LABEL_COLORS,
    LABEL_SHORT,
    OPTIONAL_LABELS,
    OUTPUT_FILES,
    choose_heads,
    claim_run_dir,
    default_run_dir,
    ink,
    json_default,
    json_for_script,
    label_family,
    named_rows,
    static_text,
    template_environment,
)
from .portable import shorten_paths
from .sections import BUILDERS, build_sections

__all__ = [
    "BUILDERS", "CSP", "LABEL_COLORS", "LABEL_SHORT", "MAX_HEATMAP_TOKENS", "OPTIONAL_LABELS", "OUTPUT_FILES",
    "SITE_GROUPS", "UNITS", "build_sections", "choose_heads", "default_run_dir", "label_family", "claim_run_dir",
    "render_html", "run_record", "site_groups", "static_text", "write_run",
]



#: Attention heatmaps show at most this many tokens of an example (labels stay readable).
MAX_HEATMAP_TOKENS = 64

#: The "Attention of selected heads" section draws (and lists) this many of the kept examples.
EXAMPLES_DRAWN = 2

#: Units of the statistics shown in titles.
UNITS = {"entropy": "nats", "distance": "tokens"}

def _example_view(tokenizer, ex) -> dict:
    """Text of an example as analysed (the decoded tokens when truncation cut it)."""
    if not ex.truncated:
        return {"text": ex.text, "n_tokens": ex.n_tokens, "truncated": False}
    end = max((e for (s, e), sp in zip(ex.offsets, ex.special) if not sp), default=0)
    return {"text": ex.text[:end] + " [...]", "n_tokens": ex.n_tokens, "truncated": True}


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
        # two counts, named for what they count: each head under its primary label (they add up to
        # the heads), and every head holding a label (a head with several counts for each)
        "primary_label_counts": result.label_counts("primary"),
        "heads_with_label": result.label_counts("all"),
        "timings_s": result.timings,
        "versions": versions(),
        "notes": result.notes,
        "statistics": list(STATISTICS),
    }
    rec.update(extra or {})
    return rec


def _holding_family(result: AnalysisResult) -> dict[str, int]:
    """Label family -> heads holding at least one label of that family (primary or not)."""
    out: dict[str, int] = {}
    for labels in result.heads["labels"].astype(str):
        for family in {label_family(lab) for lab in labels.split(";") if lab}:
            out[family] = out.get(family, 0) + 1
    return out


#: Site kinds of an encoder-decoder model, in page order, with their titles.
SITE_GROUPS = {("encoder", "self"): "encoder self-attention", ("decoder", "self"): "decoder self-attention",
               ("decoder", "cross"): "cross-attention (decoder queries, encoder keys)"}

#: Short names of the site kinds in figure titles.
GROUP_SHORT = {title: short for title, short in zip(SITE_GROUPS.values(), ("enc self", "dec self", "cross"))}


def site_groups(heads) -> list[tuple[str | None, str, object]]:
    """(title, id, rows) per kind of site: one group (title None) for a one-stack model, else one
    per (stack, kind) of :data:`SITE_GROUPS` (an encoder-decoder model's ``heads`` has ``stack``
    and ``kind`` columns)."""
    if "stack" not in heads:
        return [(None, "", heads)]
    out = []
    for (stack, kind), title in SITE_GROUPS.items():
        rows = heads[(heads["stack"] == stack) & (heads["kind"] == kind)]
        if not rows.empty:
            out.append((title, f"{stack}-{kind}-", rows))
    return out


def _stat_figures(heads) -> tuple[dict, list[dict]]:
    """One layer x head heatmap per statistic and kind of site (data for the page's canvas renderer);
    an encoder-decoder model's groups leave out what their kind does not define."""
    figures, blocks = {}, []
    for group, prefix, rows in site_groups(heads):
        for stat in [s for s in (*STATISTICS, *CROSS_STATISTICS) if s in rows]:
            fig = _stat_figure(rows, stat, group)
            if fig is None:
                if group is None:
                    blocks.append({"id": None, "title": f"{stat} ({UNITS[stat]})" if stat in UNITS else stat})
                continue
            figures[f"stat-{prefix}{stat}"] = fig
            blocks.append({"id": f"stat-{prefix}{stat}", "title": fig["title"]})
    return figures, blocks


def _stat_figure(heads, stat: str, group: str | None) -> dict | None:
    """The layer x head heatmap of one statistic, or None where no head has a value."""
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    grid = heads.pivot(index="layer", columns="head", values=stat).to_numpy(dtype=float)
    title = f"{stat} ({UNITS[stat]})" if stat in UNITS else stat
    if group is not None:  # short: the title must fit a small grid's canvas
        title = f"{GROUP_SHORT.get(group, group)}: {title}"
    if np.isnan(grid).all():
        return None
    vmax = float(np.nanmax(grid)) if stat in UNITS else 1.0
    return {
        "rows": n_layers, "cols": n_heads, "scale": 10000, "vmin": 0.0, "vmax": vmax or 1.0,
        "cmap": "viridis", "title": title, "unit": UNITS.get(stat, ""),
        "values": [None if math.isnan(v) else int(round(v * 10000)) for v in grid.ravel()],
        "rowLabels": [str(i) for i in range(n_layers)], "colLabels": [str(i) for i in range(n_heads)],
        "xLabel": "head", "yLabel": "layer",
    }


def _label_grid(heads, n_heads: int) -> list[list[dict | None]]:
    """[layer][head] cells of the primary-label grid (colour, short label, statistics as a tip)."""
    grid = [[None] * n_heads for _ in range(int(heads["layer"].max()) + 1)]
    stats = [s for s in (*STATISTICS, *CROSS_STATISTICS) if s in heads]
    for row in heads.to_dict("records"):
        tip = "; ".join(f"{s}={_fmt(row[s])}" for s in stats if _fmt(row[s]))
        grid[int(row["layer"])][int(row["head"])] = {
            "label": row["label"], "labels": row["labels"],
            "color": LABEL_COLORS.get(label_family(row["label"]), "#ffffff"),
            "ink": ink(LABEL_COLORS.get(label_family(row["label"]), "#ffffff")),
            "short": LABEL_SHORT.get(label_family(row["label"]), ""),
            "tip": f"{head_name(row, row['head'])}: {row['labels']} | {tip}",
        }
    return grid


def _attention_figures(result: AnalysisResult, tokenizer) -> tuple[dict, list[dict]]:
    """Heatmaps of the chosen heads on the first two examples (data for the canvas renderer)."""
    figures, blocks = {}, []
    labels = {}
    for i, ex in enumerate(result.examples[:EXAMPLES_DRAWN]):
        labels[i] = getattr(ex, "labels", None) or display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special)
    seq2seq = "stack" in result.heads  # the examples' maps drawn here are the encoder's
    for layer, head, label, reason in choose_heads(result):
        name = head_name({"stack": "encoder", "kind": "self", "layer": layer} if seq2seq else layer, head)
        for i, ex in enumerate(result.examples[:EXAMPLES_DRAWN]):
            n = min(ex.probs.shape[-1], MAX_HEATMAP_TOKENS)
            crop = f", first {n} of {ex.n_tokens} tokens" if n < ex.n_tokens else ""
            fid = f"attn-{layer}-{head}-{i}"
            tokens = labels[i][:n]
            values = np.rint(ex.probs[layer, head, :n, :n] * 1000).astype(int).ravel().tolist()
            figures[fid] = {
                "rows": n, "cols": n, "scale": 1000, "vmin": 0.0, "vmax": 1.0, "cmap": "blues",
                "title": f"{name} ({label}), example {i + 1}{crop}", "values": values,
                "rowLabels": tokens, "colLabels": tokens, "xLabel": "key (attended to)", "yLabel": "query (attending)",
            }
            blocks.append({"id": fid, "layer": layer, "head": head, "name": name, "label": label, "reason": reason,
                           "example": i + 1, "crop": crop + repeat_note(label, ex.ids[:n], ex.special[:n])})
    return figures, blocks


#: Labels given on repeated random tokens (the decoder circuit probe): what such a head does shows only
#: where a token repeats.
REPEAT_LABELS = ("induction", "duplicate-token")


def repeat_note(label: str, ids, special) -> str:
    """The caption's note for a head labelled on repeated random tokens drawn on tokens where none
    repeats ('' otherwise): what the map shows there is not the pattern the label was given for.

    Args:
        label: the head's primary label.
        ids: the drawn tokens' ids.
        special: per drawn token, whether the tokenizer added it (not counted as a repeat).
    """
    if label_family(label) not in REPEAT_LABELS:
        return ""
    seen = [i for i, sp in zip(ids, special) if not sp]
    if len(set(seen)) < len(seen):
        return ""
    return (f"; labelled {label} on repeated random tokens, and no token repeats in this text: there is nothing "
            "for the head to copy or match, so this map is not the pattern it was labelled for")


def audio_run(result: AnalysisResult) -> bool:
    """Whether ``result`` read audio clips (``--audio``, a speech or waveform model's run): its sequences
    are clips and its tokens encoder frames, as the page's run table and the command's summary say."""
    return result.settings.get("input") == "--audio" or any(k in result.results for k in ("speech", "frames"))


def render_html(result: AnalysisResult, tokenizer, record: dict, verification: dict | None = None,
                sections: list | None = None) -> str:
    """The self-contained report page (data inline, heatmaps drawn by inline script, input escaped).

    Args:
        sections: extra :class:`~probe.report.sections.Section` objects (default: those the
            builders make from ``result``).
    """
    sections = build_sections(result, tokenizer) if sections is None else sections
    heads = result.heads
    grids = [{"title": title, "rows": _label_grid(rows, result.model["heads"])}
             for title, _, rows in site_groups(heads)]
    families: dict[str, int] = {}
    for label, n in result.label_counts("primary").items():
        families[label_family(label)] = families.get(label_family(label), 0) + n
    holding = _holding_family(result)
    stat_figs, stat_blocks = _stat_figures(heads)
    attn_figs, attn_blocks = _attention_figures(result, tokenizer)
    table_cols, table = named_rows(heads, _fmt)  # head (L4H5), labels, statistics, added columns, cluster
    return template_environment().get_template("report.html.j2").render(
        result=result, record=record, grids=grids, csp=CSP,
        colors={k: v for k, v in LABEL_COLORS.items() if k not in OPTIONAL_LABELS or families.get(k)},
        label_counts=families, holding=holding, stat_blocks=stat_blocks, attn_blocks=attn_blocks,
        table_cols=table_cols, table=table, verification=verification,
        examples=[_example_view(tokenizer, ex) for ex in result.examples[:EXAMPLES_DRAWN]],
        kept=len(result.examples),
        audio=audio_run(result),
        sections=sections,
        data_json=json_for_script({"figures": {**stat_figs, **attn_figs,
                                                **{k: v for sec in sections for k, v in sec.figures.items()}}}),
        script=static_text("charts.js") + "\n" + static_text("heatmap.js"),
    )


def write_run(result: AnalysisResult, tokenizer, out: str | Path | None = None, *, force: bool = False,
              verification: dict | None = None, timings: dict | None = None,
              started: float | None = None) -> Path:
    """Write ``index.html``, ``heads.csv`` and ``run.json`` to a run folder; return the folder.

    The folder is claimed and written through :mod:`probe.runfolder`: it appears complete or not
    at all, and only probe's own files are replaced. Paths in the page and in run.json are
    shortened (:mod:`probe.report.portable`): nothing of the author's file system travels with them.

    Args:
        result: what :func:`probe.runs.analysis.analyze` returned.
        tokenizer: the model's tokenizer (for readable token labels).
        out: the folder (default: a new ``reports/<model>-<timestamp>``).
        force: replace probe's files in an existing folder probe wrote (other files are kept).
        verification: optional ``probe.verify`` JSON record, shown as a section of the report.
        timings: the caller's phase timings in seconds (start-up, model load ...), merged into
            ``result.timings``; with ``started`` (a ``time.perf_counter()`` value), ``total_s`` and
            ``other_s`` (the rest of the wall time) are added so the phases add up to the total.

    Raises:
        InputError: ``out`` is taken (see :func:`claim_run_dir`) or cannot be written.
    """
    start = time.perf_counter()
    with claim_run_dir(out, result.model["name"], force) as folder, folder.staging() as tmp:
        try:
            _write_files(result, tokenizer, folder.path, tmp, verification, timings, started, start)
        except OSError as exc:
            raise InputError(f"cannot write the run folder {folder.path}: {exc.strerror or exc}") from None
    return folder.path


def heads_csv(result):
    """The table written as ``heads.csv``: ``result.heads`` with a last column ``dtype``, the dtype of
    the model's parameters the numbers were measured in (``run.json``'s ``model.dtype``), where the
    model record has one and the table does not."""
    dtype = result.model.get("dtype")
    if dtype is None or "dtype" in result.heads.columns:
        return result.heads
    return result.heads.assign(dtype=dtype)


def _write_files(result, tokenizer, path: Path, tmp: Path, verification, timings, started, start) -> None:
    """The files of :func:`write_run`, written into ``tmp`` (``path``: where they will be)."""
    result.timings.update({k: round(v, 4) for k, v in (timings or {}).items()})
    shown = dataclasses.replace(result, model=shorten_paths(result.model, path),
                                settings=shorten_paths(result.settings, path), notes=shorten_paths(result.notes, path),
                                results=shorten_paths(result.results, path))  # a circuit run's pairs file ...
    sections = build_sections(shown, tokenizer)
    extra = {"verification": verification} if verification else {}
    extra.update({sec.id: sec.record for sec in sections if sec.record is not None})
    record = shorten_paths(run_record(shown, extra), path)
    html = render_html(shown, tokenizer, record, shorten_paths(verification, path), sections)
    names = list(OUTPUT_FILES) + [name for sec in sections for name in sec.files]
    record["output"] = {name: name for name in names}  # relative to the run folder
    heads_csv(result).to_csv(tmp / "heads.csv", index=False, float_format="%.6g")
    for sec in sections:
        for name, content in sec.files.items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content, encoding="utf-8")
    (tmp / "index.html").write_text(html, encoding="utf-8")
    now = time.perf_counter()
    result.timings["report_s"] = round(now - start, 4)
    if started is not None:
        result.timings["total_s"] = round(now - started, 4)
        phases = ("startup_s", "input_s", "model_load_s", "circuits_s", "analyze_s", "verify_s", "rollout_s",
                  "report_s", "patch_s", "dla_s", "composition_s", "edges_s", "faithfulness_s",
                  "attribution_s")
        result.timings["other_s"] = round(max(0.0, result.timings["total_s"] - sum(
            result.timings.get(k, 0.0) for k in phases)), 4)
    record["timings_s"] = result.timings
    (tmp / "run.json").write_text(json.dumps(record, indent=2, default=json_default) + "\n", encoding="utf-8")

