"""The weights of a model in one convention, for every analysis that reads weights (composition, direct
logit attribution, value-weighted norms): the projections of each head, the norm before each block, the
final norm and the unembedding. The projection layout is decoded by :mod:`probe.architectures.layout`;
the norms and MLPs are named by the spec; nothing here guesses an attribute or a class name.

The convention (TransformerLens's, Elhage et al. 2021): a head reads the residual stream through
W_Q, W_K, W_V [heads, d_model, d_head] (x @ W_Q[h] is head h's query) and writes through
W_O [heads, d_head, d_model]; key/value weights have as many rows as the model has key/value heads
(grouped-query attention: query head h reads key/value head h // (heads / kv_heads)). Tensors are
detached, in the weights' own dtype: callers choose the precision.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import UnsupportedAnalysisError
from ..sites import Site
from .modules import base_model, head_geometry, site_block, site_spec
from .spec import NORMS, ArchSpec


@dataclass
class AttentionWeights:
    """One attention site's weights.

    Attributes:
        W_Q: [heads, d_model, d_head].
        W_K, W_V: [kv_heads, d_model, d_head].
        b_Q: [heads, d_head], or None without a bias; b_K, b_V: [kv_heads, d_head] or None.
        W_O: [heads, d_head, d_model].
        b_O: [d_model], or None without a bias.
        q_gain, k_gain: [d_head] gains of per-head RMS norms on q and k (Qwen3, Gemma 3), or None.
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    b_Q: torch.Tensor | None
    b_K: torch.Tensor | None
    b_V: torch.Tensor | None
    W_O: torch.Tensor
    b_O: torch.Tensor | None
    q_gain: torch.Tensor | None = None
    k_gain: torch.Tensor | None = None


def _getter(block: nn.Module, paths):
    return lambda role: block.get_submodule(getattr(paths, role))


def output_weights(model: nn.Module, spec: ArchSpec, site: Site) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W_O [heads, d_head, d_model], b_O [d_model] or None) of one site's output projection, as many
    heads as it holds now (fewer in a physically pruned model)."""
    o = site_block(model, spec, site).get_submodule(site_spec(spec, site).o)
    w = spec.layout.output_rows(o)  # [heads * d_head, d_model]
    d_head = head_geometry(model.config).d_head
    bias = getattr(o, "bias", None)
    return w.reshape(-1, d_head, w.shape[-1]), None if bias is None else bias.detach()


def attention_weights(model: nn.Module, spec: ArchSpec, site: Site) -> AttentionWeights:
    """The weights of one self-attention site of a complete model, in the convention above.

    Args:
        model: the transformers model.
        spec: its architecture spec.
        site: the site (:func:`probe.architectures.sites`).

    Returns:
        An :class:`AttentionWeights`.
    """
    g = head_geometry(model.config)
    block, paths = site_block(model, spec, site), site_spec(spec, site)
    get = _getter(block, paths)
    args = (get, g.n_heads, g.n_kv_heads, g.d_head)
    W_Q, W_K, W_V = spec.layout.qkv_weights(*args)
    b_Q, b_K, b_V = spec.layout.qkv_biases(*args)
    W_O, b_O = output_weights(model, spec, site)
    gains = [None if p is None else norm_gain(spec, block.get_submodule(p)) for p in (paths.q_norm, paths.k_norm)]
    return AttentionWeights(W_Q, W_K, W_V, b_Q, b_K, b_V, W_O, b_O, *gains)


def norm_gain(spec: ArchSpec, norm: nn.Module, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A norm's gain [width]: its stored weight (in ``dtype``, default its own) plus the family's
    :attr:`~ArchSpec.norm_offset` (Gemma stores gain - 1)."""
    gain = norm.weight.detach().to(dtype or norm.weight.dtype)
    return gain + spec.norm_offset if spec.norm_offset else gain


def norm_eps(norm: nn.Module) -> float | None:
    """The epsilon a norm adds to the variance (``eps`` or ``variance_epsilon``), or None."""
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None)


def present_module(block: nn.Module, path: str | None) -> nn.Module | None:
    """The first module of ``block`` at one of the ``|``-separated alternatives of ``path`` (a family
    whose configurations name one norm differently), or None where none is there."""
    for alternative in (path or "").split("|"):
        try:
            return block.get_submodule(alternative) if alternative else None
        except AttributeError:  # not in this configuration of the family
            continue
    return None


def input_norm(model: nn.Module, spec: ArchSpec, site: Site) -> nn.Module | None:
    """The norm before the attention of ``site``'s block (pre-norm decoders), or None where the spec names
    none or the block has no module at the paths the spec names (``"input_layernorm|ln_attn"``: Falcon
    names it ``ln_attn`` with ``new_decoder_architecture`` and two parallel norms, ``ln_attn`` and
    ``ln_mlp``)."""
    return present_module(site_block(model, spec, site), site_spec(spec, site).input_norm)


def block_mlp(model: nn.Module, spec: ArchSpec, site: Site) -> nn.Module | None:
    """The MLP of ``site``'s block, or None where the spec names none."""
    path = site_spec(spec, site).mlp
    return None if path is None else site_block(model, spec, site).get_submodule(path)


def mlp_norm(model: nn.Module, spec: ArchSpec, site: Site) -> nn.Module | None:
    """The norm whose output the MLP of ``site``'s block reads, or None where the spec names none or the
    block has no module at the paths it names (Falcon's parallel block with one norm: its MLP reads the
    attention's)."""
    return present_module(site_block(model, spec, site), site_spec(spec, site).mlp_norm)


def final_norm(model: nn.Module, spec: ArchSpec) -> nn.Module | None:
    """A decoder's final norm (between the last block and the unembedding), or None where the spec names none."""
    return None if spec.final_norm is None else base_model(model).get_submodule(spec.final_norm)


def unembedding(model: nn.Module) -> torch.Tensor:
    """W_U [d_model, vocab]: logits = final_norm(x) @ W_U (+ the head's bias, if any).

    Raises:
        ValueError: a model without an output embedding (no language-model head).
    """
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no language-model head")
    return head.weight.detach().t()


def frozen_as(kind: str, offset: float, norm: nn.Module, x: torch.Tensor):
    """(fn, beta): ``norm`` of kind ``kind`` (:data:`~probe.architectures.spec.NORMS`) with gain
    weight + ``offset``, its per-row scale frozen at ``x`` [..., d_model] (float64)."""
    x = x.double()
    gamma = norm.weight.detach().double() + offset if getattr(norm, "weight", None) is not None else 1.0
    eps = norm_eps(norm)
    if eps is None:
        raise UnsupportedAnalysisError(f"the norm {type(norm).__name__} has no epsilon probe can read")
    if kind == "layernorm":
        sigma = (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
        bias = getattr(norm, "bias", None)
        beta = bias.detach().double() if bias is not None else torch.zeros(x.shape[-1], dtype=torch.float64)
        return (lambda c: gamma * (c - c.mean(-1, keepdim=True)) / sigma), beta
    rms = ((x ** 2).mean(-1, keepdim=True) + eps).sqrt()
    return (lambda c: gamma * c / rms), torch.zeros(x.shape[-1], dtype=torch.float64)


def norm_rule(spec: ArchSpec, norm: nn.Module, x: torch.Tensor) -> tuple[str, float]:
    """(kind, gain offset) of ``norm``: the spec's :attr:`~ArchSpec.norm` and
    :attr:`~ArchSpec.norm_offset` for a hand-written spec; for a discovered one, the kind and offset
    (0 or 1) whose computation reproduces the module's output on ``x`` [..., d_model] (relative 1e-4;
    a float32 copy of the module, so that a half-precision model's rounding does not blur them).

    Raises:
        UnsupportedAnalysisError: a discovered norm none of them reproduces.
    """
    if not spec.discovered:
        return spec.norm, spec.norm_offset
    ref = copy.deepcopy(norm).float()  # in float32 whatever the model's dtype: the kinds differ by more
    for hooks in (ref._forward_hooks, ref._forward_pre_hooks):  # a copy without the pass's hooks
        hooks.clear()
    with torch.no_grad():
        y = ref(x.float()).double()
        for kind in NORMS:
            for offset in (0.0, 1.0):
                try:
                    fn, beta = frozen_as(kind, offset, norm, x)
                except (AttributeError, UnsupportedAnalysisError):
                    continue
                if float((fn(x.double()) + beta - y).abs().max()) <= 1e-4 * (float(y.abs().max()) + 1e-30):
                    return kind, offset
    raise UnsupportedAnalysisError(f"the norm {type(norm).__name__} computes neither a LayerNorm nor an RMSNorm "
                                   "probe can linearise")


def frozen_norm(spec: ArchSpec, norm: nn.Module, x: torch.Tensor):
    """A norm linearised at input ``x`` [..., d_model]: (fn(c) for components [..., d_model], beta), in
    float64. With each row's scale frozen at ``x``'s, the norm is linear in its input:
    n(c) = gamma (c - mean_d c) / sigma for LayerNorm (sigma = sqrt(Var_d x + eps)) and
    n(c) = gamma c / sqrt(mean_d x^2 + eps) for RMSNorm (Gemma: 1 + gamma), so n(x) = sum_c n(c) + beta
    for any split of x into components c (the norm's kind: :func:`norm_rule`).

    Raises:
        UnsupportedAnalysisError: an RMS norm without a known epsilon, or a discovered norm probe
            cannot linearise.
    """
    return frozen_as(*norm_rule(spec, norm, x), norm, x)
