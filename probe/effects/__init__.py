"""What heads do, measured by intervening on them: activation patching (:mod:`.patching`), direct
logit attribution (:mod:`.dla`) and weight-only composition scores (:mod:`.composition`)."""

from .patching import Pair, builtin_pairs, patch_heads, patch_residual, read_pairs

__all__ = ["Pair", "builtin_pairs", "patch_heads", "patch_residual", "read_pairs"]
