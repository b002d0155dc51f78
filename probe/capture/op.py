"""The attention operation, from the formula (Vaswani et al. 2017, "Attention Is All You Need",
sec. 3.2.1), and the one mask convention it accepts::

    Attention(Q, K, V) = softmax(Q K^T * scale, masked) V

Nothing here calls transformers' attention functions or ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ProbeError
from ..sites import causal_keep


class MaskError(ProbeError, ValueError):
    """An attention mask that cannot be interpreted safely (wrong values, wrong length, wrong rank)."""


#: Half-precision dtypes: scores that overflow in them are computed again in float32 (:func:`attention`).
HALF = (torch.float16, torch.bfloat16)

# Additive masks may use -inf or the most negative finite value of any float dtype.
_ADDITIVE_MIN = {float(torch.finfo(d).min) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def as_keep_mask(mask: torch.Tensor) -> torch.Tensor:
    """Turn any accepted mask into a boolean keep-mask (True = this key may be attended to).

    Accepted (a 0/1 mask is never read as additive), all meaning the same thing: boolean (True = keep); integer or
    float holding only 0 and 1 (at least one 1; 1 = keep); float additive with values in
    {0, -inf, finfo(d).min of any float dtype d}, at least one not 0 (0 = keep).

    Raises:
        MaskError: any other values (0.5, -1e4, 2 ...), or a float mask of zeros only, which is
            ambiguous (additive "keep all" or 0/1 "keep none"): pass a boolean mask then.
    """
    if mask.dtype == torch.bool:
        return mask
    values = torch.unique(mask.detach()).double().tolist()
    if not mask.is_floating_point():
        if not set(values) <= {0.0, 1.0}:
            raise MaskError(f"integer attention mask must hold only 0 (masked) and 1 (keep); got values {values[:6]}")
        return mask != 0
    if set(values) <= {0.0, 1.0} and 1.0 in values:
        return mask != 0  # 0/1 keep-mask
    if set(values) <= {0.0, -math.inf} | _ADDITIVE_MIN and values != [0.0]:
        return mask == 0  # additive 0 / -inf mask
    if values == [0.0]:
        raise MaskError("float attention mask of zeros only is ambiguous (additive 'keep all' or 0/1 'keep none'); "
                        "pass a boolean keep-mask instead")
    raise MaskError("float attention mask must be a 0/1 keep-mask or an additive 0/-inf (or 0/finfo.min) mask; "
                    f"got values {values[:6]}")


def broadcast_keep(mask: torch.Tensor, batch: int, n_heads: int, n_query: int, n_key: int) -> torch.Tensor:
    """A keep-mask given as [batch, key], [batch, query, key] or [batch|1, heads|1, query, key] -> 4D bool.

    Raises:
        MaskError: a shape that does not fit (a mask covering only the new tokens when a cache holds
            past ones), or values :func:`as_keep_mask` rejects.
    """
    keep = as_keep_mask(mask)
    if keep.size(-1) != n_key:
        raise MaskError(f"attention mask covers {keep.size(-1)} keys but there are {n_key} "
                        "(with a key/value cache the mask must cover the cached and the new tokens)")
    if keep.dim() == 2:
        keep = keep[:, None, None, :]  # (B, 1, 1, Tk): key padding
    elif keep.dim() == 3:
        keep = keep[:, None, :, :]  # (B, 1, Tq, Tk)
    elif keep.dim() != 4:
        raise MaskError(f"attention mask must have 2, 3 or 4 dimensions; got shape {tuple(mask.shape)}")
    if keep.size(0) not in (1, batch) or keep.size(1) not in (1, n_heads) or keep.size(2) not in (1, n_query):
        raise MaskError(f"attention mask of shape {tuple(mask.shape)} does not fit batch {batch}, "
                        f"{n_heads} heads, {n_query} queries, {n_key} keys")
    return keep


@dataclass
class Scores:
    """The scores a call's softmax read, for statistics computed from them without a logarithm of
    the probabilities (:func:`probe.measures.stats.map_sums`: the entropy -sum_j p_j ln p_j =
    ln Z - sum_j p_j s_j, with ln Z = ``top`` - ln max_j p_j).

    Attributes:
        values: [batch, heads, query, key] the scores before the mask (softcap and bias included):
            p_j = exp(s_j - ln Z) at every key the mask keeps; finite, or the caller falls back to
            the probabilities. Float32 for half-precision models, else the model's dtype.
        top: [batch, heads, query] the largest score among the keys the mask keeps (-inf for a
            row without one).
    """

    values: torch.Tensor
    top: torch.Tensor


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              causal: bool = False, scale: float | None = None, *, window: int | None = None,
              softmax_dtype: torch.dtype | None = None, upcast: bool = False,
              softcap: float | None = None, bias: torch.Tensor | None = None,
              fused_bias: bool = False, divide_keys: bool = False,
              inner_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention: ``probs = softmax(q k^T * scale, masked)``, ``out = probs v``.

    Args:
        q: queries [batch, heads, query, d_head]; k, v: keys/values [batch, heads, key, d_head]
            (repeat grouped key/value heads first).
        mask: keep-mask [batch, key], [batch, query, key] or [batch|1, heads|1, query, key]: boolean,
            0/1 or additive 0/-inf (:func:`as_keep_mask`).
        causal: also mask keys after each query; the queries are the last ``query`` of the ``key``
            positions (true with a key/value cache). ``window``: a sliding window of that many keys.
        scale: multiplier of the scores; default ``d_head ** -0.5`` (sec. 3.2.1).
        softmax_dtype: dtype the softmax runs in (LLaMA-style models: float32); default the scores'.
        upcast: scores and softmax in float32 (GPT-2's ``reorder_and_upcast_attn``).
        softcap: scores become ``softcap * tanh(scores / softcap)`` before masking (Gemma 2).
        bias: added to the scores before masking, broadcastable to [batch, heads, query, key]
            (ALiBi, T5's relative position bias).
        fused_bias: compute ``bias + scale * q k^T`` in one batched GEMM (``baddbmm``), as BLOOM's
            eager path does (the same value; rounding as the original's).
        divide_keys: compute ``q (k^T / (1 / scale))``, the keys divided before the product, as
            DeBERTa does (the same value; rounding as the original's).
        inner_bias: added to q k^T before the scaling, broadcastable to [batch, heads, query, key]
            (Falcon's eager ALiBi up to transformers 5.24: ``(q k^T + a) * scale + bias``).

    Returns:
        ``(out, probs)``: out [batch, heads, query, d_head] and probs [batch, heads, query, key], both
        in v's dtype. Masked keys get exactly 0, in every dtype: masked scores are set to -inf.
        Half-precision scores (float16, bfloat16) are computed in the inputs' dtype, rounding as the
        model's own eager attention does; where any of them overflows to +-inf (float16's largest
        value is 65504), the scores and the softmax are computed again in float32, so every row gets
        the float32 result (then rounded to v's dtype), never NaN. A query row with every key masked
        gets probabilities 0 and output 0, never NaN, as PyTorch's own
        scaled_dot_product_attention returns for a fully masked row.

    Raises:
        MaskError: a mask with values other than the accepted conventions, or a shape that does not fit.
        ValueError: q, k, v shapes that do not fit together.
    """
    out, probs, _ = _attention(q, k, v, mask, causal, scale, window, softmax_dtype, upcast, softcap, bias,
                               fused_bias, divide_keys, inner_bias, scored=False)
    return out, probs


def scored_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                     causal: bool = False, scale: float | None = None, *, window: int | None = None,
                     softmax_dtype: torch.dtype | None = None, upcast: bool = False,
                     softcap: float | None = None, bias: torch.Tensor | None = None,
                     fused_bias: bool = False, divide_keys: bool = False,
                     inner_bias: torch.Tensor | None = None, scored: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor, Scores | None]:
    """:func:`attention` (the same arguments, the same ``out`` and ``probs``, bit for bit), and the
    :class:`Scores` its softmax read (None unless ``scored``): ``(out, probs, scores)``."""
    return _attention(q, k, v, mask, causal, scale, window, softmax_dtype, upcast, softcap, bias, fused_bias,
                      divide_keys, inner_bias, scored=scored)


def _attention(q, k, v, mask, causal, scale, window, softmax_dtype, upcast, softcap, bias, fused_bias, divide_keys,
               inner_bias, *, scored: bool) -> tuple[torch.Tensor, torch.Tensor, Scores | None]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [batch, heads, T, d_head]; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, nh, Tq, hs = q.shape
    Tk = k.size(-2)
    if k.shape != v.shape[:-1] + (hs,) or k.size(1) != nh or v.size(-2) != Tk:
        raise ValueError(f"q, k, v shapes do not fit: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    scale = hs ** -0.5 if scale is None else scale

    keep = None  # (B|1, nh|1, Tq|1, Tk): which (query, key) pairs may interact
    if mask is not None:
        keep = broadcast_keep(mask.to(q.device), B, nh, Tq, Tk)
    if causal:
        tri = causal_keep(Tq, Tk, window=window, device=q.device)  # (Tq, Tk)
        keep = tri if keep is None else keep & tri

    scores = scaled_scores(q, k, scale, upcast=upcast, softcap=softcap, bias=bias, fused_bias=fused_bias,
                           divide_keys=divide_keys, inner_bias=inner_bias)
    if scores.dtype in HALF and bool(torch.isinf(scores).any()):
        # a half-precision score overflowed (float16's largest is 65504): scores and softmax in float32,
        # so the row gets the float32 result rather than NaN or nothing
        scores = scaled_scores(q, k, scale, upcast=True, softcap=softcap, bias=bias, fused_bias=fused_bias,
                               divide_keys=divide_keys, inner_bias=inner_bias)
        softmax_dtype = torch.float32
    masked = scores if keep is None else scores.masked_fill(~keep, -math.inf)  # set, not added: no fp16 overflow
    probs = masked_softmax(masked, None, softmax_dtype).to(v.dtype)  # (B, nh, Tq, Tk), rows sum to 1
    out = probs @ v  # (B, nh, Tq, Tk) x (B, nh, Tk, hs) -> (B, nh, Tq, hs)
    return out, probs, (Scores(scores, masked.amax(-1)) if scored else None)


def scaled_scores(q: torch.Tensor, k: torch.Tensor, scale: float, *, upcast: bool = False,
                  softcap: float | None = None, bias: torch.Tensor | None = None,
                  fused_bias: bool = False, divide_keys: bool = False,
                  inner_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The scores before masking: ``softcap(q k^T * scale) + bias``, as :func:`attention` computes them.

    Args:
        q: [batch, heads, query, d_head]; k: [batch, heads, key, d_head] (grouped heads repeated).
        scale, upcast, softcap, bias, fused_bias, divide_keys, inner_bias: as :func:`attention`.

    Returns:
        [batch, heads, query, key] (float32 with ``upcast``, else q's dtype).
    """
    B, nh, Tq, hs = q.shape
    Tk = k.size(-2)
    if upcast:
        q, k = q.float(), k.float()
        bias = None if bias is None else bias.float()
    if bias is not None and fused_bias:  # bias + scale * q k^T in one GEMM, (B*nh, Tq, Tk)
        full = bias.expand(B, nh, Tq, Tk).reshape(B * nh, Tq, Tk)
        return torch.baddbmm(full, q.reshape(B * nh, Tq, hs), k.reshape(B * nh, Tk, hs).transpose(1, 2),
                             beta=1.0, alpha=scale).view(B, nh, Tq, Tk)
    if divide_keys:  # DeBERTa: q (k^T / sqrt(d_head * s))
        scores = q @ (k.transpose(-2, -1) / torch.tensor(1.0 / scale, dtype=torch.float32).to(k.dtype))
    elif inner_bias is not None:  # Falcon's eager ALiBi: (q k^T + a) * scale
        scores = (q @ k.transpose(-2, -1) + inner_bias) * scale
    else:
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, Tq, hs) x (B, nh, hs, Tk) -> (B, nh, Tq, Tk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias  # position bias (ALiBi, T5)
    return scores


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None,
                   softmax_dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax over keys with masked pairs set to -inf: [batch, heads, query, key] -> the same shape,
    in ``softmax_dtype`` (default the scores'). Masked keys get exactly 0; a row with no finite
    score gets 0 everywhere (never NaN). ``keep``: a boolean mask broadcastable to the scores, or None."""
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)  # set, not added: cannot overflow in fp16
    probs = F.softmax(scores, dim=-1, dtype=softmax_dtype)
    empty = probs.sum(dim=-1, keepdim=True).isnan()  # (B, nh, Tq, 1): rows without a finite score
    if bool(empty.any()):
        probs = probs.masked_fill(empty, 0.0)
    return probs
