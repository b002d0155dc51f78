"""``probe prune`` as a function: the experiment and the per-head statistics of the same corpus, the analysis
a run folder is written from (report with the pruning section, heads.csv with importance, pruning.csv,
run.json: :func:`probe.entries.ablation.run_prune` and its ``save``; the pruned model's folder:
:func:`probe.entries.ablation.save_pruned_copy`).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import InputError
from ..records import AnalysisResult
from ..runs.analysis import analyze, merge_head_columns
from ..text.corpus import split_lines
from .experiment import PruneResult, prune


def read_labels(path: str | Path, n: int) -> list[str]:
    """Classification labels: one per line (blank lines skipped), aligned with the ``n`` corpus
    sequences in order (a ``--limit`` keeps the first ``n`` labels too).

    Raises:
        InputError: unreadable file, or fewer labels than sequences.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read labels file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    labels = [ln.strip() for ln in split_lines(text) if ln.strip()]
    if len(labels) < n:
        raise InputError(f"labels file {path} has {len(labels)} labels for {n} sequences: give one label per line, "
                         "in corpus order")
    return labels[:n]


def prune_analysis(lm, texts: list[str], *, labels=None, **kwargs) -> tuple[PruneResult, AnalysisResult]:
    """Run :func:`~probe.pruning.experiment.prune` (``kwargs`` its options; the pruned copy built) and measure
    every head on the same texts: ``(result, the analysis the run folder is written from)``, no folder written
    (:func:`probe.pruning.saving.save_pruned` writes ``result.pruned_lm``).

    Raises:
        InputError: as ``prune``.
    """
    t = time.perf_counter()
    result = prune(lm, texts, labels=labels, physical=True, **kwargs)
    prune_s = time.perf_counter() - t
    analysis = analyze(lm, texts, batch_size=kwargs.get("batch_size", 16), max_length=kwargs.get("max_length"),
                       progress=kwargs.get("progress", False))
    analysis.heads = merge_head_columns(analysis.heads, result.heads_frame())
    analysis.results["pruning"] = result
    analysis.notes += [n for n in result.notes if n not in analysis.notes]
    analysis.timings["prune_s"] = round(prune_s, 4)
    return result, analysis
