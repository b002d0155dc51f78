"""What heads do, measured by intervening on them: activation patching (:mod:`.patching`, on the
prompt pairs of :mod:`.pairs`), direct logit attribution (:mod:`.dla`) and weight-only composition
scores (:mod:`.composition`); ``probe patch`` is :mod:`.patch_run` with its report section
:mod:`.patch_report`."""

from .composition import composition_scores
from .dla import direct_logit_attribution, dla_by_layer
from .patching import Pair, builtin_pairs, patch_heads, patch_residual, read_pairs

__all__ = ["Pair", "builtin_pairs", "composition_scores", "direct_logit_attribution", "dla_by_layer", "patch_heads",
           "patch_residual", "read_pairs"]
