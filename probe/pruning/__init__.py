"""Head pruning: gates, importance and redundancy, pruning curves against random orders, and heads
physically removed from the weights (saved and loaded back).

Modules (each small): :mod:`~probe.loading.pruned` (original numbering and per-layer layouts),
:mod:`~probe.pruning.importance` (Michel et al. 2019), :mod:`~probe.pruning.redundancy`
(the redundancy order, from :mod:`probe.patterns.distance`'s Jensen-Shannon distances),
:mod:`~probe.pruning.curves` (orders and curves),
:mod:`~probe.pruning.removal` (physical removal), :mod:`~probe.pruning.saving` (save and reload),
:mod:`~probe.pruning.experiment` (:func:`prune`, the whole experiment without files) and
:mod:`~probe.pruning.report` (the report section). The head gates, objectives and corpus split it
shares with ablation live in :mod:`probe.causal`.

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

from ..causal.gates import gated
from ..causal.objectives import OBJECTIVES, default_objective
from ..causal.split import split_corpus
from ..loading.pruned import PRUNED_FILE, PrunedHeads, load_pruned_folder
from .curves import ORDERS
from .experiment import PruneResult, prune
from .importance import head_importance, normalize_per_layer
from .removal import remove_heads
from .saving import save_pruned

__all__ = [
    "OBJECTIVES", "ORDERS", "PRUNED_FILE", "PruneResult", "PrunedHeads", "default_objective",
    "gated", "head_importance", "load_pruned_folder", "normalize_per_layer", "prune",
    "remove_heads", "save_pruned", "split_corpus",
]
