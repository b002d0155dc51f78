"""Per-architecture knowledge: the only module that knows Hugging Face attribute paths and behaviour.

Every supported ``model_type`` maps to one :class:`ArchSpec` saying where the transformer layers,
the attention module (the module whose ``forward`` returns ``(attn_output, attn_probs)``), the
query/key/value projections and the output projection live, and how the architecture computes
attention: its score scale, softmax precision, sliding windows, rotary layout, logit soft-capping,
query/key norms, position offset, and the module attributes that hold head counts (for pruning).
Everything else in ``probe`` asks this module instead of branching on the family, so adding an
architecture is one entry in :data:`SPECS` (plus a tiny-model test).

The package: :mod:`.spec` (the spec classes and behaviour rules), :mod:`.table` (the entries,
:data:`SPECS`, :func:`get_spec`), :mod:`.modules` (geometry, sites and modules of a model).
"""

from .modules import (
    HeadGeometry,
    attention_modules,
    attention_path,
    base_model,
    head_geometry,
    layer_modules,
    linear_weight,
    max_positions,
    output_projections,
    site_modules,
    site_spec,
    sites,
    stack_layers,
)
from .spec import QKV_LAYOUTS, ArchSpec, SiteSpec
from .table import SPECS, get_spec

__all__ = [
    "QKV_LAYOUTS", "SPECS", "ArchSpec", "HeadGeometry", "SiteSpec", "attention_modules", "attention_path",
    "base_model", "get_spec", "head_geometry", "layer_modules", "linear_weight", "max_positions",
    "output_projections", "site_modules", "site_spec", "sites", "stack_layers",
]
