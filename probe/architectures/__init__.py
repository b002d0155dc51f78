"""Per-architecture knowledge: the only module that knows Hugging Face attribute paths and behaviour.

Every supported ``model_type`` maps to one :class:`ArchSpec` saying its kind (encoder, decoder,
encoder-decoder), its kinds of attention site (:class:`SiteSpec`, the only place naming module
paths: where each site's layers, attention module (whose ``forward`` returns the attention
probabilities), query/key/value projections and output projection live), and how it computes
attention: its score scale, softmax precision, sliding windows, rotary layout, logit soft-capping,
query/key norms, position offset, and the module attributes that hold head counts (for pruning).
Everything else in ``probe`` asks this module instead of branching on the family, so adding an
architecture is one entry in :data:`SPECS` (plus a tiny-model test).

A type without an entry whose attention calls transformers' ``AttentionInterface`` gets a spec
discovered from one forward pass when it is loaded (:mod:`probe.capture.discover`), filed in
:data:`DISCOVERED` (:mod:`.discovered`), where :func:`get_spec` finds it after :data:`SPECS`.

The package: :mod:`.spec` (the spec classes and behaviour rules), :mod:`.table` (the entries,
:data:`SPECS`, :func:`get_spec`), :mod:`.discovered` (specs built from a forward pass), :mod:`.own_code`
(a capture-only type's projections found by name, for its attention steps),
:mod:`.modules` (geometry, sites and modules of a model); a family's own rules in its module
(:mod:`.disentangled` DeBERTa, :mod:`.falcon`, :mod:`.gpt_neo`, :mod:`.mpnet`).
"""

from .discovered import DISCOVERED, Found, build_spec, model_kind, needs_weights, register
from .falcon import FALCON_ALIBI
from .modules import (
    HeadGeometry,
    base_model,
    head_geometry,
    max_positions,
    output_projection_bypass,
    site_block,
    site_modules,
    site_outputs,
    site_spec,
    sites,
    stack_layers,
)
from .mpnet import MPNET_RELATIVE
from .position_bias import ALIBI, DISENTANGLED, NO_POSITION_BIAS, T5_RELATIVE, PositionBias
from .spec import MODEL_KINDS, QKV_LAYOUTS, ArchSpec, SiteSpec, one_stack
from .table import SPECS, get_spec, kind_of

__all__ = [
    "ALIBI", "DISCOVERED", "DISENTANGLED", "FALCON_ALIBI", "MODEL_KINDS", "MPNET_RELATIVE", "NO_POSITION_BIAS",
    "QKV_LAYOUTS", "SPECS", "T5_RELATIVE", "ArchSpec", "Found", "HeadGeometry", "PositionBias", "SiteSpec",
    "base_model", "build_spec", "get_spec", "head_geometry", "kind_of", "max_positions", "model_kind",
    "needs_weights", "one_stack", "output_projection_bypass", "register", "site_block", "site_modules",
    "site_outputs", "site_spec", "sites",
    "stack_layers",
]
