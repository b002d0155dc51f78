"""The report section of ``probe path``: the path-patching effect of each sender on each receiver (and of
all together), with the senders' labels, and path.csv beside ``index.html``.

The builder (:func:`section`) registers itself with :func:`probe.report.sections.section_builder`; it
shows a section when ``result.results["path"]`` holds a :class:`~probe.circuits.path_run.PathRun`.
"""

from __future__ import annotations

import math

from ..report.sections import Section, render_fragment, section_builder
from ..sites import head_name
from ..util import formatted

CAPTION = ("Path patching (Wang et al. 2022) on {pairs} prompt pairs ({source}): the clean run with the senders' "
           "outputs taken from the corrupted run and every other head's output frozen at its clean value (MLPs "
           "recomputed); only the receivers then read that stream, each through its own norm recomputed from the "
           "patched stream (no frozen-norm shortcut). Effect = M(path-patched) - M(clean), M = logit(answer) - "
           "logit(wrong) at {metric_at}, mean over pairs (clean {clean:.4g}, corrupted {corrupted:.4g}); share "
           "= effect / (M(corrupted) - M(clean)), 1: the path alone moves M as far as the corrupted run. A receiver "
           "at or below a sender's layer reads nothing it writes (effect 0).")


def _fmt(v: float, spec: str = ".4g") -> str:
    return "" if not math.isfinite(v) else formatted(v, spec)


def _labels(heads) -> dict:
    if heads is None or "layer" not in getattr(heads, "columns", ()):
        return {}
    return {head_name(int(r["layer"]), int(r["head"])): str(r.get("labels") or r.get("label") or "")
            for r in heads.to_dict("records")}


@section_builder
def section(result, tokenizer) -> Section | None:
    """The path-patching section, or None when the run has no path result."""
    run = getattr(result, "results", {}).get("path")
    if run is None:
        return None
    labels = _labels(getattr(result, "heads", None))
    f = run.frame
    rows = [[r.senders, "; ".join(x for x in (labels.get(s, "") for s in r.senders.split("+")) if x), r.receivers,
             _fmt(r.effect), _fmt(r.share, ".3f")] for r in f.itertuples()]
    caption = CAPTION.format(pairs=len(run.pairs), source=run.source, clean=run.ld_clean, corrupted=run.ld_corrupted,
                             metric_at=run.metric_at)
    html = render_fragment("section_table.html.j2", caption=caption, figures=[],
                           columns=["senders", "their labels", "receivers", "effect (logits)", "share"], rows=rows)
    record = {"pairs": len(run.pairs), "source": run.source, "metric_at": run.metric_at, "ld_clean": run.ld_clean,
              "ld_corrupted": run.ld_corrupted, "norms": "recomputed from the patched stream",
              "paths": [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()}
                        for r in f.to_dict("records")], "seconds": {k: round(v, 3) for k, v in run.seconds.items()},
              "notes": run.notes}
    return Section(id="path", title="Path patching", html=html, files={"path.csv": f.to_csv(index=False,
                   float_format="%.6g")}, record=record, order=46)
