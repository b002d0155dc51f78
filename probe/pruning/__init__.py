"""Head pruning: gates, importance and redundancy, pruning curves against random orders, and heads
physically removed from the weights (saved and loaded back).

Modules (each small): :mod:`~probe.pruning.heads` (original numbering and per-layer layouts),
:mod:`~probe.pruning.gates` (head gates on the output projection's input),
:mod:`~probe.pruning.objectives` (clm, mlm, fidelity, classification),
:mod:`~probe.pruning.importance` (Michel et al. 2019), :mod:`~probe.pruning.redundancy`
(Jensen-Shannon distances between heads), :mod:`~probe.pruning.curves` (orders and curves),
:mod:`~probe.pruning.removal` (physical removal), :mod:`~probe.pruning.saving` (save and reload),
:mod:`~probe.pruning.experiment` (:func:`prune`, the whole experiment without files) and
:mod:`~probe.pruning.report` (the report section).

Example::

    from probe import load_model
    from probe.pruning import prune, remove_heads, save_pruned
    lm = load_model("minilm")
    result = prune(lm, texts, steps=10, fraction=0.5)     # curves, importance, pruned copy
    result.to_json()                                      # {"model", "objective", "curves", ...}
    remove_heads(lm, {0: [1], 3: [2, 5]})                 # original numbering, in place
    save_pruned(lm, "minilm-pruned")                      # probe analyze --model minilm-pruned
"""

from __future__ import annotations

_EXPORTS = {
    "prune": "experiment", "PruneResult": "experiment", "split_corpus": "experiment",
    "gated": "gates", "remove_heads": "removal", "save_pruned": "saving", "load_pruned_folder": "saving",
    "head_importance": "importance", "normalize_per_layer": "importance", "PrunedHeads": "heads",
    "PRUNED_FILE": "heads", "HeadDistances": "redundancy", "js_divergence": "redundancy",
    "default_objective": "objectives", "OBJECTIVES": "objectives", "ORDERS": "curves",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import lazily (``probe.models`` reads :mod:`probe.pruning.heads` while it is being imported)."""
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
