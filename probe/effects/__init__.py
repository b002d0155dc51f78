"""What heads do, measured by intervening on them.

- Ablation effects of every head and of every label group (:mod:`.measure`), the ablation itself at
  the gate site (:mod:`.ablation`: zero, mean, resample with the donors of :mod:`.resample`), the
  encoder-decoder objective (:mod:`.objective`), label groups against random heads and the
  intervals (:mod:`.groups`), the induction claim on repeated random tokens (:mod:`.induction`) and
  the in-context learning score (:mod:`.icl`); ``probe effects`` is :mod:`.run` with its report
  section :mod:`.report`.
- Activation patching (:mod:`.patching`; the passes of :mod:`.patch_full`, re-entered at the patched
  layer by :mod:`.patch_layers` where the model allows it; on the prompt pairs of :mod:`.pairs`), direct
  logit attribution (:mod:`.dla`) and weight-only composition scores (:mod:`.composition`); ``probe patch`` is
  :mod:`.patch_run` with its report section :mod:`.patch_report`.

Example::

    from probe import load_model
    from probe.effects import head_effects
    lm = load_model("minilm")
    result = head_effects(lm, texts)    # labels from analyze(lm, texts); or heads=<a heads table>
    result.heads      # effects.csv: effect_zero, effect_mean (kinds=... adds resample) and intervals per head
    result.labels     # label_effects.csv: each label's group against random heads
"""

from __future__ import annotations

from .ablation import ablating, head_means
from .composition import composition_scores
from .dla import direct_logit_attribution, dla_by_layer
from .groups import label_groups, paired_bootstrap, random_sets, t_interval
from .measure import EffectsResult, head_effects, labelled_heads
from .patching import Pair, builtin_pairs, patch_heads, patch_residual, read_pairs

__all__ = ["EffectsResult", "ablating", "head_effects", "head_means", "label_groups", "labelled_heads",
           "paired_bootstrap", "random_sets", "t_interval",
           "Pair", "builtin_pairs", "composition_scores", "direct_logit_attribution", "dla_by_layer", "patch_heads",
           "patch_residual", "read_pairs"]
