"""probe's reference module as the intervention point of a hand-spec model outside the attention
interface (DeBERTa, BLOOM, GPT-Neo, MPNet in transformers 5.25; Falcon until 5.24: transformers' own test
of the loaded model says which, :func:`probe.capture.hooks.native`).

Their transformers modules compute attention inline and never call the function registered in
``AttentionInterface``. probe's from-scratch module (:class:`probe.capture.reference.ReferenceAttention`)
computes each family's q, k, v and position terms and then calls probe's attention function
(:func:`probe.capture.interface.probe_attention`), so with it swapped in every point of the function
(query, key, value, pattern, output) exists for these families too. It is swapped in only where it
reproduces the model: :func:`reference_agrees` runs the model once as it is and once swapped, on the
same fixed inputs, and asks for bit-equal outputs (the check of ``probe verify``, on one short batch
with padding); otherwise the caller keeps the output projection's pre-hook.
"""

from __future__ import annotations

from contextlib import ExitStack
from weakref import WeakKeyDictionary

import torch
from torch import nn

from ..architectures import site_modules
from ..errors import ProbeError
from .hooks import input_device
from .reference.module import ReferenceAttention
from .reference.swap import swap_attention

#: Tokens of the check's two rows (the second right-padded by :data:`PADDED`).
LENGTH = 12
#: Padding positions of the check's second row.
PADDED = 4

_AGREES: WeakKeyDictionary = WeakKeyDictionary()  # model -> {(dtype, device, implementation): bool}


def is_swapped(lm) -> bool:
    """Whether ``lm``'s attention sites run probe's reference module now (an outer context swapped it)."""
    return any(isinstance(module, ReferenceAttention) for _, module in site_modules(lm.model, lm.spec))


def _check_inputs(lm) -> dict:
    """Two rows of fixed token ids ([2, LENGTH]), the second right-padded by :data:`PADDED`."""
    vocab = lm.model.get_input_embeddings().num_embeddings
    ids = (torch.arange(2 * LENGTH).reshape(2, LENGTH) * 7919 + 11) % vocab
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, LENGTH - PADDED:] = 0
    device = input_device(lm.model)
    inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    return inputs


def _outputs(model: nn.Module, inputs: dict) -> torch.Tensor:
    out = model(**inputs)
    return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def reference_agrees(lm) -> bool:
    """Whether probe's reference module reproduces ``lm`` bit for bit, as the model runs now (its
    dtype, device and attention implementation): the first output (logits, else the last hidden
    state) at the real positions of a fixed two-row batch, model as it is against the reference
    swapped in. Cached per model, dtype, device, implementation, train mode and parameter count. A
    model the reference cannot be swapped into (no hand spec, an encoder-decoder, an unknown RoPE
    type ...) does not agree.

    Returns:
        True: the swapped model's outputs equal the model's own (difference 0.0).
    """
    model = lm.model
    size = sum(p.numel() for p in model.parameters())  # physically removed heads change it
    key = (next(model.parameters()).dtype, str(input_device(model)),
           getattr(model.config, "_attn_implementation", None), model.training, size)
    cache = _AGREES.setdefault(model, {})
    if key not in cache:
        cache[key] = _agrees(lm)
    return cache[key]


def _agrees(lm) -> bool:
    if lm.spec.discovered or lm.spec.capture_only or lm.kind == "encoder-decoder":
        return False
    inputs = _check_inputs(lm)
    real = inputs["attention_mask"].bool()
    try:
        with torch.no_grad():
            own = _outputs(lm.model, inputs)[real]
            with swap_attention(lm):
                ours = _outputs(lm.model, inputs)[real]
    except ProbeError:
        return False
    return own.shape == ours.shape and bool(torch.equal(own, ours))


def swap_if_agrees(lm, stack: ExitStack) -> bool:
    """Swap probe's reference module into ``lm`` for the life of ``stack`` (its own hooks, so that
    removing a context's editors keeps it), where it reproduces the model (:func:`reference_agrees`);
    already swapped counts as swapped.

    Returns:
        Whether the model's sites run the reference module (and so probe's attention function).
    """
    if is_swapped(lm):
        return True
    if not reference_agrees(lm):
        return False
    stack.enter_context(swap_attention(lm))
    return True
