"""Capture-only discovery: the structure of a model whose attention is its own code (RoFormer, XGLM,
BigBird ... : its modules compute attention themselves and never call transformers' ``AttentionInterface``),
read from the maps its eager path returns (an encoder-decoder model's too: its encoder, decoder and
cross-attention maps, FSMT, MVP).

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
from ..architectures.discovered import build_maps_spec, build_seq2seq_maps_spec, model_kind
from ..architectures.spec import ArchSpec
from ..errors import UnsupportedArchitectureError
from .discover import TEXT, _d_model, _layer_split
from .failures import forward_failures
from .hooks import Hooks, measuring

#: The step an exception inside the model's own forward pass is reported in (:mod:`probe.capture.failures`).
STEP = "capture-only discovery (one short forward pass with output_attentions, to find the maps the model returns)"


@torch.no_grad()
def discover_maps(model: nn.Module, tokenizer, why: str = "") -> ArchSpec:
    """A capture-only spec of ``model`` from the maps of one ``output_attentions`` pass (module docstring).

    Args:
        model: a ``transformers`` model whose attention modules compute attention themselves.
        tokenizer: its tokenizer (the pass's text: :data:`probe.capture.discover.TEXT`; an encoder-decoder
            model reads it as the source and its first half as the target, so that cross-attention maps
            [target, source] are told from the others by their shape).
        why: what interface discovery said (repeated where this fails too).

    Returns:
        The spec (not registered: :func:`probe.architectures.discovered.register` files it).

    Raises:
        ModelForwardError: the model's own forward pass raised an exception (one line naming it).
        UnsupportedArchitectureError: no maps returned, maps no module returned, maps that are not
            probabilities of the pass's tokens (an encoder-decoder's: [source, source] for its encoder,
            [target, target] causal for its decoder, [target, source] for cross-attention), a decoder whose
            maps are not causal (one line each).
    """
    kind = model_kind(model.config)
    model_type = model.config.model_type
    ids = tokenizer(TEXT, add_special_tokens=True)["input_ids"][:12]
    device = model.get_input_embeddings().weight.device
    source = torch.tensor([ids], device=device)
    inputs = {"input_ids": source, "attention_mask": torch.ones_like(source)}
    if kind == "encoder-decoder":
        inputs["decoder_input_ids"] = source[:, : len(ids) // 2]
    if kind != "encoder":
        inputs["use_cache"] = False
    names = {m: n for n, m in model.named_modules()}
    returned: list[tuple[str, int, torch.Tensor]] = []  # (module path, index in its output tuple, tensor)

    def record(module, args, output):
        if isinstance(output, (tuple, list)):
            for i, t in enumerate(output):
                if isinstance(t, torch.Tensor) and t.dim() == 4:
                    returned.append((names[module], i, t))

    with measuring(model, eager=True), Hooks() as own, forward_failures(STEP, model):
        for module in model.modules():
            if module is not model:
                own.forward(module, record)
        out = model(**inputs, output_attentions=True)
    fail = f"{model_type}: {why + '; ' if why else ''}"
    T, Tt = len(ids), len(ids) // 2
    if kind == "encoder-decoder":
        kinds = [("encoder", "self", getattr(out, "encoder_attentions", None), (T, T), False),
                 ("decoder", "self", getattr(out, "decoder_attentions", None), (Tt, Tt), True),
                 ("decoder", "cross", getattr(out, "cross_attentions", None), (Tt, T), False)]
    else:
        kinds = [("encoder" if kind == "encoder" else "decoder", "self", getattr(out, "attentions", None), (T, T),
                  kind == "decoder")]
    groups = {}
    for stack, site_kind, maps, shape, causal in kinds:
        if not maps or any(a is None for a in maps):
            raise UnsupportedArchitectureError(f"{fail}and it returns no attention maps with output_attentions=True: "
                                               "probe cannot capture it")
        if any(not isinstance(a, torch.Tensor) or a.dim() != 4 for a in maps):  # PEGASUS-X: global and local maps
            raise UnsupportedArchitectureError(f"{fail}and the {stack} {site_kind}-attention maps it returns are not "
                                               "[batch, heads, query, key] tensors: probe cannot measure them")
        groups[stack, site_kind] = [_held(fail, returned, a, layer, shape, causal) for layer, a in enumerate(maps)]
    base = names[base_model(model)]
    attention = model.get_submodule(groups[kinds[0][:2]][0][0])
    probs_argument = "output_attentions" if "output_attentions" in inspect.signature(attention.forward).parameters \
        else None
    splits = {key: _split(model, [p for p, _, _ in found]) for key, found in groups.items()}
    d_model = _d_model(model)
    heads = {int(maps[0].shape[1]) for _, _, maps, _, _ in kinds}
    if len(heads) != 1:
        raise UnsupportedArchitectureError(f"{fail}and its sites have different head counts {sorted(heads)}; "
                                           "probe needs one")
    n_heads = heads.pop()
    d_head = d_model // int(getattr(model.config, "num_attention_heads", n_heads) or n_heads)  # ConvBERT: fewer maps
    if kind != "encoder-decoder":
        (found,), (split,) = groups.values(), splits.values()
        return build_maps_spec(model_type, kind, found, split, base, n_heads, d_model, d_head, probs_argument)
    return build_seq2seq_maps_spec(model_type, groups, splits, base, n_heads, d_model, d_head, probs_argument)


def _held(fail: str, returned: list, a: torch.Tensor, layer: int, shape: tuple[int, int], causal: bool) -> tuple:
    """(module path, tuple index, layer) of the innermost module that returned the map ``a`` of one layer,
    checked to be attention probabilities of ``shape`` [query, key] (causal where ``causal``)."""
    held = [(path, i) for path, i, t in returned if t is a] or [  # the same values in another tensor
        (path, i) for path, i, t in returned if t.shape == a.shape and torch.equal(t, a)]
    if not held:
        raise UnsupportedArchitectureError(f"{fail}and no module of layer {layer} returned the maps it reports; "
                                           "probe cannot capture them")
    if tuple(a.shape[-2:]) != shape or not torch.allclose(a.float().sum(-1), torch.ones(()), atol=1e-4) \
            or bool((a < 0).any()):
        raise UnsupportedArchitectureError(f"{fail}and the maps it returns are not attention probabilities of "
                                           f"its tokens ([..., {shape[0]}, {shape[1]}], rows summing to 1): probe "
                                           "cannot measure them")
    if causal and bool(a[0].float().triu(1).abs().max() > 0):
        raise UnsupportedArchitectureError(f"{fail}and its decoder's maps are not causal: probe cannot place them")
    path, i = max(held, key=lambda h: h[0].count("."))  # the innermost module: the attention itself
    return path, i, layer


def _split(model: nn.Module, paths: list[str]) -> int:
    """The position of the layer number in the paths' parts (:func:`probe.capture.discover._layer_split`)."""
    last = paths[0].split(".")
    if last[-1].isdigit() and isinstance(model.get_submodule(".".join(last[:-1])), nn.ModuleList):
        return len(last) - 1  # the attention modules are the list's items (XLM, FlauBERT: model.attentions)
    return _layer_split(model, paths)
