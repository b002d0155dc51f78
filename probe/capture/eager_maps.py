"""Capture-only discovery: the structure of a model whose attention is its own code (RoFormer, XGLM,
BigBird ... : its modules compute attention themselves and never call transformers' ``AttentionInterface``),
read from the maps its eager path returns.

:func:`discover_maps` runs one short forward pass with ``output_attentions=True`` and forward hooks on every
module: the maps the model returns (``outputs.attentions``, one [batch, heads, T, T] per layer) are the very
tensors some modules returned in their output tuples; the innermost such module of each layer is its
attention site, and the tuple position is where capture reads its maps
(:attr:`probe.architectures.ArchSpec.probs`). The spec is capture-only
(:attr:`~probe.architectures.ArchSpec.capture_only`): statistics, views and labels read those maps; verify,
steps, block capture and every intervention refuse by name, since probe has no projection, no mask and no
from-scratch module of such a model to check or edit.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..architectures import base_model
from ..architectures.discovered import build_maps_spec, model_kind
from ..architectures.spec import ArchSpec
from ..errors import UnsupportedArchitectureError
from .discover import TEXT, _d_model, _layer_split
from .hooks import Hooks, measuring


@torch.no_grad()
def discover_maps(model: nn.Module, tokenizer, why: str = "") -> ArchSpec:
    """A capture-only spec of ``model`` from the maps of one ``output_attentions`` pass (module docstring).

    Args:
        model: a one-stack ``transformers`` model whose attention modules compute attention themselves.
        tokenizer: its tokenizer (the pass's text: :data:`probe.capture.discover.TEXT`).
        why: what interface discovery said (repeated where this fails too).

    Returns:
        The spec (not registered: :func:`probe.architectures.discovered.register` files it).

    Raises:
        UnsupportedArchitectureError: an encoder-decoder model, no maps returned, maps no module returned, a
            decoder whose maps are not causal (one line each).
    """
    kind = model_kind(model.config)
    model_type = model.config.model_type
    if kind == "encoder-decoder":
        build_maps_spec(model_type, kind, [], 0, "", 1, 1, 1, None)  # raises: one-stack models only
    ids = tokenizer(TEXT, add_special_tokens=True)["input_ids"][:12]
    device = model.get_input_embeddings().weight.device
    source = torch.tensor([ids], device=device)
    inputs = {"input_ids": source, "attention_mask": torch.ones_like(source)}
    if kind == "decoder":
        inputs["use_cache"] = False
    names = {m: n for n, m in model.named_modules()}
    returned: list[tuple[str, int, torch.Tensor]] = []  # (module path, index in its output tuple, tensor)

    def record(module, args, output):
        if isinstance(output, (tuple, list)):
            for i, t in enumerate(output):
                if isinstance(t, torch.Tensor) and t.dim() == 4:
                    returned.append((names[module], i, t))

    with measuring(model, eager=True), Hooks() as own:
        for module in model.modules():
            if module is not model:
                own.forward(module, record)
        out = model(**inputs, output_attentions=True)
    maps = getattr(out, "attentions", None)
    fail = f"{model_type}: {why + '; ' if why else ''}"
    if not maps or any(a is None for a in maps):
        raise UnsupportedArchitectureError(f"{fail}and it returns no attention maps with output_attentions=True: "
                                           "probe cannot capture it")
    found = []
    for layer, a in enumerate(maps):
        held = [(path, i) for path, i, t in returned if t is a] or [  # the same values in another tensor
            (path, i) for path, i, t in returned if t.shape == a.shape and torch.equal(t, a)]
        if not held:
            raise UnsupportedArchitectureError(f"{fail}and no module of layer {layer} returned the maps it reports; "
                                               "probe cannot capture them")
        path, i = max(held, key=lambda h: h[0].count("."))  # the innermost module: the attention itself
        found.append((path, i, layer))
        T = len(ids)
        if tuple(a.shape[-2:]) != (T, T) or not torch.allclose(a.float().sum(-1), torch.ones(()), atol=1e-4) \
                or bool((a < 0).any()):
            raise UnsupportedArchitectureError(f"{fail}and the maps it returns are not attention probabilities of "
                                               f"its {T} tokens ([..., {T}, {T}], rows summing to 1): probe cannot "
                                               "measure them")
        if kind == "decoder" and bool(a[0].float().triu(1).abs().max() > 0):
            raise UnsupportedArchitectureError(f"{fail}and its decoder's maps are not causal: probe cannot place them")
    paths = [p for p, _, _ in found]
    last = paths[0].split(".")
    if last[-1].isdigit() and isinstance(model.get_submodule(".".join(last[:-1])), nn.ModuleList):
        split = len(last) - 1  # the attention modules are the list's items (XLM, FlauBERT: model.attentions)
    else:
        split = _layer_split(model, paths)
    attention = model.get_submodule(found[0][0])
    probs_argument = "output_attentions" if "output_attentions" in inspect.signature(attention.forward).parameters \
        else None
    base = names[base_model(model)]
    d_model, heads = _d_model(model), int(maps[0].shape[1])
    d_head = d_model // int(getattr(model.config, "num_attention_heads", heads) or heads)  # ConvBERT: fewer maps
    return build_maps_spec(model_type, kind, found, split, base, heads, d_model, d_head, probs_argument)
