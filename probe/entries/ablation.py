"""The run kinds that take heads out of a model on a corpus, as library calls: ``probe effects``
(:func:`run_effects`: zero, mean and resample ablation of every head and label group, the induction claim)
and ``probe prune`` (:func:`run_prune`: pruning curves by importance, redundancy and random order, the
pruned copy). Each reads its corpus (or takes texts), loads the model with the head its objective needs
(or takes a loaded one), measures and returns a :class:`~probe.entries.result.RunResult`: no folder is
written until ``save`` (and :func:`save_pruned_copy` for the pruned model).

Example::

    from probe.settings import EffectsSettings, PruneSettings
    run = probe.run_effects(lm, EffectsSettings(ablation="zero", seeds=5))
    run = probe.run_prune(lm, PruneSettings(steps=4, orders="importance,random"))
"""

from __future__ import annotations

from pathlib import Path

from ..effects.run import effects_analysis
from ..errors import InputError
from ..loading.seq2seq import as_targets
from ..pruning.removal import removal_unsupported
from ..pruning.run import prune_analysis, read_labels
from ..pruning.saving import save_pruned
from ..settings import EffectsSettings, PruneSettings
from ..text.corpus import corpus_input
from ..util import plural
from .result import Console, RunResult, folder_result, run_model


def run_effects(model, settings: EffectsSettings | None = None, *, texts=None, source: str | None = None,
                console: Console | None = None, device=None, dtype=None) -> RunResult:
    """``probe effects`` as one call: every head ablated (zero and mean at the output projection's input;
    resample where asked) and the change of the model's objective on held-out text, each label's heads
    together against random heads, on decoders the induction claim (no folder written).

    Args:
        model: a model name (loaded with its masked-LM head for ``objective="mlm"``) or a loaded model.
        settings: :class:`~probe.settings.EffectsSettings` (corpus or pairs file, objective, ablations, seeds ...).
        texts: the sequences instead of the settings' corpus (an encoder-decoder model's: Texts with
            targets); source: where they come from (``run.json``'s input; default ``texts``).
        console: progress bars, the start line (``announce``), the folder claim before the model loads.
        device, dtype: where and how a named model loads.

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads`` (with the effect columns) and
        ``labels`` (label groups against random heads); ``measured`` the
        :class:`~probe.effects.measure.EffectsResult`.

    Raises:
        InputError: an unreadable corpus, an encoder-decoder model without pairs; UnsupportedAnalysisError:
            as :func:`probe.effects.measure.head_effects`.
    """
    s = EffectsSettings() if settings is None else settings
    console = Console() if console is None else console
    if texts is None:
        texts, source = corpus_input(s.corpus, s.pairs, s.limit)
    source = source or "texts"
    lm = run_model(model, console, head={"mlm": "mlm"}.get(s.objective, "auto"), dtype=dtype, device=device)
    if lm.kind == "encoder-decoder":
        if not s.pairs and not _targets(texts):
            raise InputError(f"{lm.name} is an encoder-decoder model: give its sources and targets with --pairs FILE "
                             "(source<TAB>target per line)")
        texts = as_targets(texts)
    console.tell(f"Ablating the {plural(len(lm.sites) * lm.geometry.n_heads, 'head')} of {lm.name} on "
                 f"{plural(len(texts), 'sequence')} ({source})")
    measured, analysis = effects_analysis(lm, texts, objective=s.objective, kinds=s.ablation, seeds=s.seeds,
                                          copies=s.copies, clusters=s.clusters, batch_size=s.batch_size,
                                          max_length=s.max_length, progress=console.progress, induction=s.induction,
                                          estimate=console.estimate)
    return folder_result("effects", s, lm, analysis, measured, console,
                         {"heads": analysis.heads, "labels": measured.labels})


def run_prune(model, settings: PruneSettings | None = None, *, texts=None, source: str | None = None,
              console: Console | None = None, device=None, dtype=None, removable: bool = False) -> RunResult:
    """``probe prune`` as one call: heads pruned step by step in importance, redundancy and random order,
    the objective on held-out text at each step, every head measured on the same texts, and the model with
    the first order's heads removed (``measured.pruned_lm``; :func:`save_pruned_copy` writes it).

    Args:
        model: a model name (loaded with the head its objective needs) or a loaded model.
        settings: :class:`~probe.settings.PruneSettings` (corpus, objective, labels file, orders, steps ...).
        texts, source, console, device, dtype: as :func:`run_effects`.
        removable: refuse, before the experiment, a model whose heads cannot be removed from its weights
            (the caller will save the pruned copy).

    Returns:
        A :class:`~probe.entries.result.RunResult`: ``tables`` ``heads`` (with importance) and ``curves``;
        ``measured`` the :class:`~probe.pruning.experiment.PruneResult`.

    Raises:
        InputError: an unreadable corpus or labels file, heads that cannot be removed with ``removable``;
            as :func:`probe.pruning.experiment.prune`.
    """
    s = PruneSettings() if settings is None else settings
    console = Console() if console is None else console
    if texts is None:
        texts, source = corpus_input(s.corpus, None, s.limit)
    source = source or "texts"
    labels = read_labels(s.labels, len(texts)) if s.labels else None
    head = {"mlm": "mlm", "classification": "classification", None: "auto"}.get(s.objective)
    lm = run_model(model, console, head=head, dtype=dtype, device=device)
    if removable and removal_unsupported(lm):
        raise InputError(f"--save-pruned: cannot remove heads: {removal_unsupported(lm)}")
    console.tell(f"Pruning {lm.name} ({lm.geometry.n_layers} x {lm.geometry.n_heads} heads) on "
                 f"{plural(len(texts), 'sequence')} ({source}): {', '.join(s.orders)}, {plural(s.steps, 'step')} "
                 f"to {s.fraction:.0%}")
    measured, analysis = prune_analysis(lm, texts, labels=labels, objective=s.objective, orders=list(s.orders),
                                        steps=s.steps, fraction=s.fraction, seeds=s.seeds, batch_size=s.batch_size,
                                        max_length=s.max_length, progress=console.progress,
                                        estimate=console.estimate)
    return folder_result("prune", s, lm, analysis, measured, console,
                         {"heads": analysis.heads, "curves": measured.curves})


def save_pruned_copy(run: RunResult, folder: str | Path, *, force: bool = False) -> Path:
    """Write the pruned model of a :func:`run_prune` result (the first order's heads removed from its weights)
    to ``folder`` (:func:`probe.pruning.saving.save_pruned`).

    Raises:
        InputError: ``folder`` taken, or a model whose heads could not be removed.
    """
    if run.measured.pruned_lm is None:
        raise InputError(f"--save-pruned: cannot remove heads: {removal_unsupported(run.lm) or 'no pruned copy'}")
    return save_pruned(run.measured.pruned_lm, folder, force=force)


def _targets(texts) -> bool:
    """Every sequence has a target (an encoder-decoder model's texts given directly)."""
    return bool(texts) and all(getattr(t, "target", None) is not None or getattr(t, "pair", None) is not None
                               for t in texts)
