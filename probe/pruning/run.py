"""``probe prune`` as a function: the experiment, the per-head statistics of the same corpus, the
run folder (report with the pruning section, heads.csv with importance, pruning.csv, run.json)
and, if asked, the pruned model's folder. The command line only parses and prints.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

from ..errors import InputError
from ..records import AnalysisResult
from ..report import claim_run_dir, write_run
from ..runs.analysis import analyze, merge_head_columns
from ..text.corpus import split_lines
from .experiment import PruneResult, prune
from .saving import claim_target, save_pruned


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


def prune_run(lm, texts: list[str], *, out=None, force: bool = False, save_pruned_to=None, labels=None,
              timings: dict | None = None, started: float | None = None, **kwargs) -> tuple[PruneResult, Path]:
    """Run :func:`~probe.pruning.experiment.prune`, measure every head on the same texts, write the
    run folder; save the pruned copy to ``save_pruned_to`` if given.

    Returns:
        ``(result, run folder)``.

    Raises:
        InputError: as ``prune``; ``out`` or ``save_pruned_to`` taken (claimed before the experiment).
    """
    with ExitStack() as held:  # both folders claimed before the experiment starts
        run_dir = held.enter_context(claim_run_dir(out, lm.name, force)).path
        if save_pruned_to is not None:
            held.enter_context(claim_target(Path(save_pruned_to), force))
        return _prune_and_write(lm, texts, run_dir, force, save_pruned_to, labels, timings, started, kwargs)


def _prune_and_write(lm, texts, out: Path, force: bool, save_pruned_to, labels, timings, started, kwargs):
    """The body of :func:`prune_run`, once its folders are claimed."""
    result, analysis = prune_analysis(lm, texts, labels=labels, **kwargs)
    path = write_run(analysis, lm.tokenizer, out, force=force, timings=timings, started=started)
    if save_pruned_to is not None:
        save_pruned(result.pruned_lm, save_pruned_to, force=force)
    return result, path


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
