"""A from-scratch attention module, swapped into a pretrained model to check it reproduces the original.

Scaled dot-product attention written from the formula (Vaswani et al. 2017, "Attention Is All You
Need", sec. 3.2.1-3.2.2)::

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head) + M) V

with multi-head split/merge, rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4) and
grouped key/value heads (Ainslie et al. 2023, GQA). The only things taken from the model are its own
projection modules (by reference, never copied) and its config.

* :mod:`~probe.capture.op` - :func:`attention`, the bare operation on [batch, heads, T, d_head]
  tensors, and the one mask convention checked at the door (0/1, boolean, additive; fp16-safe; empty rows give 0);
* :mod:`~probe.capture.reference.rotary` - RoPE frequencies from the config (every rope_type the supported
  families use, partial rotary included);
* :mod:`~probe.capture.reference.module` - :class:`ReferenceAttention`, a drop-in for one layer's attention
  module, one small method per step;
* :mod:`~probe.capture.reference.mutants` - deliberately broken variants, one overridden step each;
* :mod:`~probe.capture.reference.swap` - :func:`~probe.capture.reference.swap.swap_attention`, reversible (imported from
  its module: it registers hooks through :mod:`probe.capture.hooks`, which sits above the operation).

No preprocessing of weights happens anywhere: no folding of layer norms, no centring of the
unembedding, no re-ordering of projection rows.
"""

from ..op import MaskError, as_keep_mask, attention
from .module import ForwardContext, ReferenceAttention
from .mutants import MUTANTS, check_mutant, mutant_applies, mutant_class
from .rotary import ROPE_TYPES, Rope, RopeError, apply_rope

__all__ = [
    "MUTANTS", "MaskError", "ForwardContext", "ReferenceAttention", "Swapped", "Rope", "RopeError",
    "ROPE_TYPES", "as_keep_mask", "attention", "apply_rope", "check_mutant", "mutant_applies", "mutant_class",
    "swap_attention",
]
