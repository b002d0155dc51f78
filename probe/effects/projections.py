"""Per-head query, key and value matrices of attention modules whose projections are their own code,
read from the modules themselves.

Where probe's spec could not find and check a layer's q, k or v projection (``spec.missing``: OLMo2's
and Qwen3-MoE's q/k norms between the projection and the attention function, DeepSeek's multi-head
latent attention with low-rank projections and a rotary key shared by the heads, CodeGen's fused
projection interleaved by shard), the matrices that map the attention's input to what probe's
attention function receives are measured by running each attention module on the basis of its
input space: every module's input is replaced by the rows of [0; I] (d_model + 1 one-token sequences,
position 0, where every rotation is the identity), the norms inside the module taken linear (each
norm's output with its per-token scale multiplied back: gain and bias stay, the division by the RMS or
standard deviation goes), and the query, key and value the function receives recorded. Row i of
W minus the zero row's output is W's row i; the zero row's output is the bias.

The pass checks itself: eight random inputs (seed 0) fed alongside must give exactly x W + b (to
:data:`LINEAR_TOL` of their largest value); anything else (a nonlinearity or position dependence the
linear reading misses) is refused in one line.

What the linear reading leaves out is each norm's per-token scale, as composition leaves out the
block's input norm's: on OLMo2 (one norm over all heads' queries) and Qwen3-MoE (one per head) it is a
factor of each head's whole matrix, which the normalised composition scores do not see; on MLA the
latent norm scales the content part of each key and not its rotary part (shared by the heads), so the
scores read the key as if that scale were 1: an approximation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import site_modules, weights
from ..capture.hooks import Hooks, input_device, measuring
from ..capture.interface import edit
from ..errors import UnsupportedAnalysisError

#: Largest |recorded - (x W + b)| allowed on the check inputs, relative to their largest |value|.
LINEAR_TOL = 1e-4
#: Basis rows per forward pass (a real model's d_model rows in a few passes).
CHUNK = 256
CHECKS = 8
POINTS = ("query", "key", "value")


@dataclass
class Projections:
    """One layer's matrices in the row convention (y = x W + b), float64: ``W_Q`` [heads, d_model, d_qk],
    ``W_K`` [kv_heads, d_model, d_qk], ``W_V`` [kv_heads, d_model, d_v], biases ``b_Q`` [heads, d_qk],
    ``b_K``, ``b_V``; ``error`` the check's largest relative difference."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    b_Q: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    error: float


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() and getattr(module, "weight", None) is not None


def _linear_norm(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """A norm's output with its per-token scale multiplied back (forward hook): x g (+ b) for RMSNorm,
    (x - mean) g + b for LayerNorm."""
    x = args[0]
    centred = "rms" not in type(module).__name__.lower()
    xc = x - x.mean(-1, keepdim=True) if centred else x
    scale = (xc.float().pow(2).mean(-1, keepdim=True) + (weights.norm_eps(module) or 0.0)).sqrt()
    bias = getattr(module, "bias", None)
    if bias is None:
        return (out.float() * scale).to(out.dtype)
    return ((out - bias).float() * scale).to(out.dtype) + bias


def module_projections(lm) -> list[Projections]:
    """Every self-attention site's :class:`Projections`, measured from the attention modules (module
    docstring).

    Args:
        lm: a complete decoder-only :class:`~probe.loading.models.LoadedModel` whose modules call
            probe's attention function (a discovered spec).

    Returns:
        one :class:`Projections` per site, in ``lm.sites`` order.

    Raises:
        UnsupportedAnalysisError: a module whose q, k or v is not linear in its input at position 0
            (the check's difference above :data:`LINEAR_TOL`).
    """
    model, d = lm.model, lm.geometry.d_model
    sites = site_modules(model, lm.spec)
    dtype = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.zeros(1, d), torch.eye(d), torch.randn(CHECKS, d, generator=g)]).to(dtype)
    got: dict = {(i, p): [] for i in range(len(sites)) for p in POINTS}
    current: list = [None]

    def feed(module, args, kwargs):
        x = current[0].to(input_device(model))[:, None, :]
        if args:
            return (x, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x}

    def recorder(i, point):
        def editor(tensor, call):
            got[i, point].append(tensor.detach()[:, :, 0, :].double().cpu())  # [rows, heads, d]
            return tensor
        return editor

    with torch.no_grad(), measuring(model), Hooks() as hooks:
        for i, (_, attention) in enumerate(sites):
            hooks.forward_pre(attention, feed, with_kwargs=True)
            for point in POINTS:
                hooks.own(edit(attention, point, recorder(i, point)))
            for norm in (m for m in attention.modules() if m is not attention and _is_norm(m)):
                hooks.forward(norm, _linear_norm)
        for chunk in rows.split(CHUNK):
            current[0] = chunk
            ids = torch.ones(len(chunk), 1, dtype=torch.long, device=input_device(model))
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    out = []
    check = rows[1 + d:].double()
    for i in range(len(sites)):
        mats = {}
        error = 0.0
        for point in POINTS:
            y = torch.cat(got[i, point])  # [1 + d + CHECKS, heads, d_point]
            bias, W = y[0], (y[1:1 + d] - y[0]).permute(1, 0, 2)  # [heads, d_model, d_point]
            predicted = torch.einsum("nd,hde->nhe", check, W) + bias
            diff = (predicted - y[1 + d:]).abs().max().item() / max(y[1 + d:].abs().max().item(), 1e-30)
            error = max(error, diff)
            mats[point] = (W, bias)
        if error > LINEAR_TOL:
            raise UnsupportedAnalysisError(
                f"{lm.name}: layer {i}'s queries, keys or values are not linear in the attention's input at "
                f"position 0 (difference {error:.1e} on the check inputs), so no per-head matrix holds them")
        out.append(Projections(mats["query"][0], mats["key"][0], mats["value"][0], mats["query"][1],
                               mats["key"][1], mats["value"][1], error))
    return out
