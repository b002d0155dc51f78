"""What the causal methods share below them: head gates on the output projection's input
(:mod:`~probe.causal.gates`), the objectives an intervention may hurt (:mod:`~probe.causal.objectives`:
clm, mlm, fidelity, classification) and the split of a corpus into a scoring and a held-out part
(:mod:`~probe.causal.split`). Pruning (:mod:`probe.pruning`) and ablation (:mod:`probe.effects`)
both build on it; neither imports the other.
"""

from __future__ import annotations

from .gates import Gates, gated, ones
from .objectives import OBJECTIVES, ZERO_WITHIN, Objective, default_objective, make_objective
from .split import MIN_PART, split_corpus

__all__ = ["MIN_PART", "OBJECTIVES", "ZERO_WITHIN", "Gates", "Objective", "default_objective", "gated",
           "make_objective", "ones", "split_corpus"]
