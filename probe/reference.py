"""A from-scratch attention module, swapped into a pretrained model to check it reproduces the original.

Scaled dot-product attention written from the formula (Vaswani et al. 2017, "Attention Is All You
Need", sec. 3.2.1-3.2.2)::

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head) + M) V

with multi-head split/merge, rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4) and
grouped key/value heads (Ainslie et al. 2023, GQA). Nothing here calls transformers' attention
functions or ``torch.nn.functional.scaled_dot_product_attention``; the only things taken from the
model are its own projection modules (by reference, never copied) and its config.

Three pieces:

* :func:`attention` - the bare operation on [batch, heads, T, d_head] tensors, with one mask
  convention checked at the door (shared/CASES.md F04, F06, F07).
* :class:`ReferenceAttention` - a drop-in for one layer's attention module (BERT family, DistilBERT,
  GPT-2, LLaMA family). It returns ``(attn_output, attn_probs)`` like the Hugging Face module, so
  probe's capture hooks work on it whatever attention implementation the original used. It builds
  its own causal mask: it only ever reads the 2D padding keep-mask of the current forward pass,
  which :func:`swap_attention` records with a pre-hook on the base model (Hugging Face's 4D mask
  already contains causality and would hide a broken causal mask, F01/F05).
* :func:`swap_attention` - a reversible context manager that puts :class:`ReferenceAttention` in
  every layer and restores the originals on exit (also on exceptions). With ``mutant=`` it puts in
  a deliberately broken variant (see :data:`MUTANTS`) to show that :func:`probe.verify.verify`
  catches classic bugs.

No preprocessing of weights happens anywhere (F17): no folding of layer norms, no centring of the
unembedding, no re-ordering of projection rows.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .architectures import ArchSpec, attention_path, base_model, get_spec, head_geometry, layer_modules
from .errors import ProbeError

__all__ = [
    "MUTANTS", "MaskError", "ForwardContext", "ReferenceAttention", "Swapped", "as_keep_mask",
    "attention", "apply_rope", "rope_inv_freq", "mutant_applies", "swap_attention",
]


class MaskError(ProbeError, ValueError):
    """An attention mask that cannot be interpreted safely (wrong values, wrong length, wrong rank)."""


#: Deliberately broken variants of the reference attention: name -> what is wrong.
MUTANTS: dict[str, str] = {
    "scale-d-model": "scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head) (F15)",
    "no-scale": "scores not scaled at all",
    "no-padding-mask": "padding keys not masked",
    "no-causal-mask": "decoder queries see future tokens (no causal mask)",
    "merge-without-transpose": "heads merged with a reshape of [batch, heads, T, d_head], no transpose (F14)",
    "causal-inverted": "causal mask with inverted polarity: queries see only the future (F05)",
}

_CAUSAL_MUTANTS = ("no-causal-mask", "causal-inverted")

# Additive masks may use -inf or the most negative finite value of any float dtype.
_ADDITIVE_MIN_VALUES = {float(torch.finfo(d).min) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


# ---------------------------------------------------------------------------------------------
# The operation
# ---------------------------------------------------------------------------------------------

def as_keep_mask(mask: torch.Tensor) -> torch.Tensor:
    """Turn any accepted mask into a boolean keep-mask (True = this key may be attended to).

    Accepted (shared/CASES.md F04), all meaning the same thing:

    * boolean: True = keep;
    * integer or float with values in {0, 1} only (at least one 1): 1 = keep;
    * float additive mask with values in {0, -inf, finfo(d).min for any float dtype d}, at least
      one of them not 0: 0 = keep.

    Args:
        mask: any shape; values as above.

    Returns:
        Boolean tensor of the same shape.

    Raises:
        MaskError: any other values (e.g. a float mask holding 0.5 or -1e4 or 2), or a float mask of
            zeros only, which is ambiguous (an additive "keep everything" or a 0/1 "keep nothing");
            pass a boolean mask then.
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
    if set(values) <= {0.0, -math.inf} | _ADDITIVE_MIN_VALUES and values != [0.0]:
        return mask == 0  # additive 0 / -inf mask
    if values == [0.0]:
        raise MaskError("float attention mask of zeros only is ambiguous (additive 'keep all' or 0/1 'keep none'); "
                        "pass a boolean keep-mask instead")
    raise MaskError("float attention mask must be a 0/1 keep-mask or an additive 0/-inf (or 0/finfo.min) mask; "
                    f"got values {values[:6]}")


def causal_keep_mask(n_query: int, n_key: int, device=None, window: int | None = None,
                     inverted: bool = False) -> torch.Tensor:
    """Boolean [query, key] mask: query i (the i-th of the last ``n_query`` positions) keeps key j <= its position.

    The queries are the last ``n_query`` of the ``n_key`` positions (with a key/value cache the keys
    also hold the past), so query i sits at position ``n_key - n_query + i``.

    Args:
        window: sliding-window size (Mistral/Qwen2); keys more than ``window - 1`` positions back are
            dropped too. None: no window.
        inverted: the F05 bug (a boolean mask used with the wrong polarity): keep only the future.
    """
    q_pos = torch.arange(n_key - n_query, n_key, device=device)[:, None]  # (Tq, 1)
    k_pos = torch.arange(n_key, device=device)[None, :]  # (1, Tk)
    if inverted:
        return k_pos > q_pos
    keep = k_pos <= q_pos  # (Tq, Tk)
    if window is not None:
        keep = keep & (k_pos > q_pos - window)
    return keep


def _broadcast_keep(mask: torch.Tensor, batch: int, n_query: int, n_key: int, n_heads: int | None = None) -> torch.Tensor:
    """A keep-mask given as [batch, key], [batch, query, key] or [batch|1, heads|1, query, key] -> 4D."""
    keep = as_keep_mask(mask)
    if keep.size(-1) != n_key:
        raise MaskError(f"attention mask covers {keep.size(-1)} keys but there are {n_key} "
                        "(with a key/value cache the mask must cover the cached and the new tokens)")
    if keep.dim() == 2:  # (B, Tk): key padding
        keep = keep[:, None, None, :]  # (B, 1, 1, Tk)
    elif keep.dim() == 3:  # (B, Tq, Tk)
        keep = keep[:, None, :, :]  # (B, 1, Tq, Tk)
    elif keep.dim() != 4:
        raise MaskError(f"attention mask must have 2, 3 or 4 dimensions; got shape {tuple(mask.shape)}")
    if (keep.size(0) not in (1, batch) or keep.size(-2) not in (1, n_query)
            or (n_heads is not None and keep.size(1) not in (1, n_heads))):
        raise MaskError(f"attention mask of shape {tuple(mask.shape)} does not fit batch {batch}, "
                        f"{n_heads} heads, {n_query} queries, {n_key} keys")
    return keep


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              causal: bool = False, scale: float | None = None, *, window: int | None = None,
              softmax_dtype: torch.dtype | None = None, upcast: bool = False,
              causal_inverted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, from the formula (Vaswani et al. 2017, sec. 3.2.1).

    ``probs = softmax(q k^T * scale, masked)``, ``out = probs v``.

    Args:
        q: queries [batch, heads, query, d_head].
        k: keys [batch, heads, key, d_head] (repeat grouped KV heads first).
        v: values [batch, heads, key, d_head].
        mask: keep-mask [batch, key] (padding), [batch, query, key] or [batch|1, heads|1, query, key];
            boolean, 0/1 (int or float) or additive 0/-inf (0/finfo.min): see :func:`as_keep_mask`.
        causal: also mask keys after each query; the queries are the last ``query`` of the ``key``
            positions (true with a key/value cache).
        scale: multiplier of the scores; default ``d_head ** -0.5`` (1/sqrt(d_head), sec. 3.2.1).
        window: sliding-window size for causal attention (None: unlimited).
        softmax_dtype: dtype the softmax runs in (LLaMA: float32); default the scores' dtype.
        upcast: compute the scores and softmax in float32 (GPT-2 ``reorder_and_upcast_attn``).
        causal_inverted: the F05 mutant (keep only the future); for verification tests only.

    Returns:
        ``(out, probs)``: out [batch, heads, query, d_head] in v's dtype; probs [batch, heads, query,
        key] in v's dtype, each real row summing to 1. Masked positions are exactly 0; a query row
        with every key masked gets probabilities 0 and output 0, never NaN (F07). The fill value of
        masked scores is ``torch.finfo(dtype).min`` of the scores' dtype (F06), set, not added, so
        it cannot overflow to -inf.

    Raises:
        MaskError: a mask with values other than the accepted conventions, or a shape that does
            not fit (e.g. a mask covering only the new tokens when a cache holds past ones, F09).
        ValueError: q, k, v shapes that do not fit together.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [batch, heads, T, d_head]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, nh, Tq, hs = q.shape
    Tk = k.size(-2)
    if k.shape != v.shape[:-1] + (hs,) or k.size(1) != nh or v.size(-2) != Tk:
        raise ValueError(f"q, k, v shapes do not fit: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if scale is None:
        scale = hs ** -0.5

    # Which (query, key) pairs may interact: padding and causality as one boolean keep-mask.
    keep = None
    if mask is not None:
        keep = _broadcast_keep(mask.to(q.device), B, Tq, Tk, nh)  # (B|1, nh|1, Tq|1, Tk)
    if causal or causal_inverted:
        tri = causal_keep_mask(Tq, Tk, q.device, window, inverted=causal_inverted)  # (Tq, Tk)
        keep = tri if keep is None else keep & tri  # (B|1, nh|1, Tq, Tk)

    if upcast:
        q, k = q.float(), k.float()
    att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, Tq, hs) x (B, nh, hs, Tk) -> (B, nh, Tq, Tk)
    if keep is not None:
        att = att.masked_fill(~keep, torch.finfo(att.dtype).min)  # (B, nh, Tq, Tk)
    att = F.softmax(att, dim=-1, dtype=softmax_dtype).to(v.dtype)  # (B, nh, Tq, Tk), rows sum to 1
    if keep is not None:
        has_key = keep.any(dim=-1, keepdim=True)  # (B|1, nh|1, Tq, 1)
        if not bool(has_key.all()):
            att = att.masked_fill(~has_key, 0.0)  # fully masked rows: 0, not uniform (F07)
    y = att @ v  # (B, nh, Tq, Tk) x (B, nh, Tk, hs) -> (B, nh, Tq, hs)
    return y, att


# ---------------------------------------------------------------------------------------------
# Rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4.2)
# ---------------------------------------------------------------------------------------------

#: rope_type values computed from scratch; others fall back to the model's own (cos, sin).
ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(config) -> dict:
    """The RoPE settings of a config as one dict (``rope_parameters``, or older ``rope_theta``/``rope_scaling``)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params = {**scaling, **params}
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def rope_inv_freq(config, d_head: int) -> torch.Tensor | None:
    """Inverse frequencies theta_i = base^(-2i/d_head), i = 0 .. d_head/2 - 1 (RoFormer eq. 15), float32.

    ``rope_type`` ``"linear"`` divides them by ``factor`` (position interpolation, Chen et al. 2023);
    ``"llama3"`` divides low frequencies by ``factor``, keeps high ones and interpolates between
    (Llama 3.1 report, "wavelength" rule). Units: radians per token.

    Returns:
        [d_head / 2] float32 tensor, or None for a rope_type not implemented here (or a partial
        rotary factor), in which case the caller uses the model's own ``position_embeddings``.
    """
    params = rope_parameters(config)
    rope_type = params["rope_type"]
    if rope_type not in ROPE_TYPES or params.get("partial_rotary_factor", 1.0) != 1.0:
        return None
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))  # (hs/2,)
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif rope_type == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq  # tokens per full turn
        low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)  # long waves: / factor
        smooth = (old_len / wavelen - low) / (high - low)  # 0 at low_freq_wavelen, 1 at high_freq_wavelen
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, [batch, T, d_head] (the half-dims repeated), cast to ``dtype``."""
    freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)  # (B, T, hs/2), radians
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hs)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (x_i, x_{i + d/2}) pair of a [batch, heads, T, d_head] tensor by position x theta_i.

    The "rotate half" layout of GPT-NeoX/LLaMA (pairs are dimension i and i + d_head/2, not 2i and
    2i+1 as in RoFormer's eq. 34; the same rotation up to a fixed permutation of the weights).
    ``cos``/``sin``: [batch, T, d_head].
    """
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hs)
    x1, x2 = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]  # (B, nh, T, hs/2) each
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, nh, T, hs)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------
# The swapped-in module
# ---------------------------------------------------------------------------------------------

@dataclass
class ForwardContext:
    """What the reference modules of one model read about the current forward pass.

    Filled by a forward pre-hook on the base model (see :func:`swap_attention`) from the arguments
    the user passed, before Hugging Face turns them into a 4D mask that already contains causality.

    Attributes:
        active: a forward pass of the swapped model is running.
        attention_mask: [batch, past + T] keep-mask (bool) of the current pass, or None (no padding).
        position_ids: [batch, T] (or [1, T]) positions, or None (then 0.. counted from the cache).
    """

    active: bool = False
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None


def _model_scaling(config, spec: ArchSpec, d_head: int, layer_idx: int) -> float:
    """The score multiplier the architecture prescribes (GPT-2's options included)."""
    if spec.family == "gpt2":
        scale = d_head ** -0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            scale /= float(layer_idx + 1)
        return scale
    return d_head ** -0.5


def _sliding_window(config, original: nn.Module) -> int | None:
    if config.model_type == "mistral":
        return getattr(config, "sliding_window", None)
    if config.model_type == "qwen2":
        return getattr(original, "sliding_window", None)
    return None


class ReferenceAttention(nn.Module):
    """One layer's attention, written from the formula, using the original module's projections.

    The projection modules are the original ones (same objects, registered under the same names, so
    ``state_dict`` keys and hooks on them are unchanged); nothing is copied or transformed.

    Forward: ``hidden_states`` [batch, T, d_model] (plus whatever the Hugging Face layer passes:
    ``cache``/``past_key_values``, ``position_ids``, ``position_embeddings`` ...) ->
    ``(attn_output, attn_probs)``: attn_output [batch, T, d_model] (after the output projection
    where the architecture has it inside the attention module; BERT's stays in ``BertSelfOutput``),
    attn_probs [batch, heads, T, past + T]. Hugging Face's own 4D ``attention_mask`` is ignored: the
    padding keep-mask comes from the :class:`ForwardContext` (or the ``padding_mask`` keyword,
    [batch, past + T]), the causal mask is built here.

    Dropout is not applied (eval semantics).

    Raises (at forward):
        MaskError: called outside a swapped model's forward with a Hugging Face mask but no
            ``padding_mask``; a padding mask whose length is not past + T (F09).
        ProbeError: cross-attention (``encoder_hidden_states``) requested.
    """

    def __init__(self, original: nn.Module, spec: ArchSpec, config, layer_idx: int,
                 context: ForwardContext | None = None, mutant: str | None = None) -> None:
        super().__init__()
        if mutant is not None and mutant not in MUTANTS:
            raise ProbeError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
        geo = head_geometry(config)
        self.spec, self.config, self.layer_idx, self.mutant = spec, config, layer_idx, mutant
        self.n_head, self.n_kv_head, self.d_head, self.d_model = geo.n_heads, geo.n_kv_heads, geo.d_head, geo.d_model
        self.is_causal = spec.causal
        self.context = context if context is not None else ForwardContext()
        self.notes: list[str] = []
        self._signature = inspect.signature(original.forward)

        # The original projections, by reference, under their original attribute names.
        self._names: dict[str, str] = {}
        for role in ("q", "k", "v", "qkv", "o"):
            path = getattr(spec, role)
            if path is None or not path.startswith(spec.attention + "."):
                continue  # absent, or outside the attention module (BERT's output projection)
            rel = path[len(spec.attention) + 1:]
            name = rel.replace(".", "_")
            self.add_module(name, original.get_submodule(rel))
            self._names[role] = name

        # Head counts from the projections' widths (so a layer with physically pruned heads works).
        if "qkv" in self._names:  # Conv1D weight [in, 3 * heads * d_head]
            width = getattr(self, self._names["qkv"]).weight.shape[1] // 3
            self.n_head = self.n_kv_head = width // self.d_head
        else:  # nn.Linear weight [out, in]
            self.n_head = getattr(self, self._names["q"]).weight.shape[0] // self.d_head
            self.n_kv_head = getattr(self, self._names["k"]).weight.shape[0] // self.d_head

        # Score scale: 1/sqrt(d_head) (Vaswani et al. 2017, sec. 3.2.1) or the architecture's option.
        self.model_scale = _model_scaling(config, spec, self.d_head, layer_idx)
        own = getattr(original, "scaling", None)
        if isinstance(own, float) and not math.isclose(own, self.model_scale, rel_tol=1e-6):
            self.notes.append(f"layer {layer_idx}: the model's own scaling {own} differs from the formula's "
                              f"{self.model_scale}; using the model's")
            self.model_scale = own
        self.scale = self.model_scale
        if mutant == "no-scale":
            self.scale = 1.0
        elif mutant == "scale-d-model":
            # the 1/sqrt(d_head) factor replaced by 1/sqrt(d_model); GPT-2's 1/(layer + 1) factor kept
            by_layer = spec.family == "gpt2" and config.scale_attn_by_inverse_layer_idx
            self.scale = self.d_model ** -0.5 / (float(layer_idx + 1) if by_layer else 1.0)

        # Numerics of the original's eager path (matters only below float32).
        self.softmax_dtype = torch.float32 if spec.family == "llama" else None
        self.upcast = spec.family == "gpt2" and bool(getattr(config, "reorder_and_upcast_attn", False))
        self.window = _sliding_window(config, original)

        # Rotary embedding (Su et al. 2021), computed here from the config.
        self.inv_freq = None
        if spec.rotary:
            self.inv_freq = rope_inv_freq(config, self.d_head)
            if self.inv_freq is None:
                self.notes.append(f"layer {layer_idx}: rope_type {rope_parameters(config)['rope_type']!r} is not "
                                  "implemented from scratch; using the model's own (cos, sin)")

    def extra_repr(self) -> str:
        return (f"heads={self.n_head}, kv_heads={self.n_kv_head}, d_head={self.d_head}, scale={self.scale:.6g}, "
                f"causal={self.is_causal}, rotary={self.spec.rotary}, mutant={self.mutant}")

    # -- pieces -----------------------------------------------------------------------------------

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [batch, T, d_model] -> q [batch, T, heads*d_head], k, v [batch, T, kv_heads*d_head]."""
        if "qkv" in self._names:  # GPT-2: one Conv1D, x @ W[in, 3*nh*hs] + b, q | k | v along the last dim
            return getattr(self, self._names["qkv"])(x).split(self.n_head * self.d_head, dim=2)
        return (getattr(self, self._names["q"])(x), getattr(self, self._names["k"])(x),
                getattr(self, self._names["v"])(x))

    def _arguments(self, hidden_states, args, kwargs) -> dict:
        """The call's arguments by name, whatever order the Hugging Face layer passed them in."""
        if not args:
            return kwargs
        bound = self._signature.bind_partial(hidden_states, *args, **kwargs).arguments
        extra = {}
        for name, param in self._signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                extra = bound.pop(name, {})
        bound.pop("hidden_states", None)
        return {**bound, **extra}

    def _padding_keep(self, kw: dict, batch: int, n_key: int) -> torch.Tensor | None:
        """[batch, key] boolean keep-mask of the current pass, or None."""
        mask = kw.get("padding_mask")
        if mask is None and self.context.active:
            mask = self.context.attention_mask
        elif mask is None and kw.get("attention_mask") is not None:
            raise MaskError("the reference attention builds its own causal mask and needs the 2D padding mask: "
                            "run it through the model inside swap_attention(), or pass padding_mask=[batch, key]")
        if mask is None or self.mutant == "no-padding-mask":
            return None
        keep = as_keep_mask(mask)
        if keep.dim() != 2 or keep.shape != (batch, n_key):
            raise MaskError(f"padding mask of shape {tuple(mask.shape)} does not cover the {n_key} keys of "
                            f"batch {batch} (with a key/value cache it must cover the cached and the new tokens)")
        return None if bool(keep.all()) else keep  # no padding: nothing to mask

    # -- forward ----------------------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        kw = self._arguments(hidden_states, args, kwargs)
        if kw.get("encoder_hidden_states") is not None:
            raise ProbeError("cross-attention (encoder_hidden_states) is not supported by the reference attention")
        cache = kw.get("cache", kw.get("past_key_values"))
        if cache is not None and hasattr(cache, "self_attention_cache"):
            cache = cache.self_attention_cache  # EncoderDecoderCache: the self-attention half
        B, T, C = hidden_states.size()  # batch, sequence length (new tokens), d_model
        nh, nkv, hs = self.n_head, self.n_kv_head, self.d_head

        # 1. project and split into heads
        q, k, v = self._project(hidden_states)  # (B, T, nh*hs), (B, T, nkv*hs), (B, T, nkv*hs)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)

        past = cache.get_seq_length(self.layer_idx) if cache is not None else 0  # tokens already cached

        # 2. rotary position embedding on q and k (Su et al. 2021)
        if self.spec.rotary:
            if self.inv_freq is not None:
                positions = kw.get("position_ids")
                if positions is None and self.context.active:
                    positions = self.context.position_ids
                if positions is None:
                    positions = torch.arange(past, past + T, device=q.device)[None]  # (1, T)
                cos, sin = rope_cos_sin(self.inv_freq, positions, q.dtype)  # (B|1, T, hs)
            else:
                cos, sin = kw["position_embeddings"]  # the model's own, for rope types not done here
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, nh, T, hs), (B, nkv, T, hs)

        # 3. key/value cache: append the new keys/values, get all of them back
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, nkv, Tk, hs), Tk = past + T
        Tk = k.size(-2)  # a sliding-window cache returns only the last Tk <= past + T positions

        # 4. grouped-query attention: each KV head serves nh / nkv query heads (Ainslie et al. 2023)
        if nkv != nh:
            rep = nh // nkv  # query heads per KV head; KV head j serves query heads j*rep .. j*rep + rep - 1
            k = k[:, :, None].expand(B, nkv, rep, Tk, hs).reshape(B, nh, Tk, hs)  # (B, nh, Tk, hs)
            v = v[:, :, None].expand(B, nkv, rep, Tk, hs).reshape(B, nh, Tk, hs)  # (B, nh, Tk, hs)

        # 5. softmax(q k^T * scale + mask) v
        padding = self._padding_keep(kw, B, past + T)  # (B, past + T) or None
        if padding is not None and Tk < past + T:
            padding = padding[:, -Tk:]  # (B, Tk): the positions the cache returned
        y, att = attention(
            q, k, v, mask=padding,
            causal=self.is_causal and self.mutant not in _CAUSAL_MUTANTS,
            causal_inverted=self.is_causal and self.mutant == "causal-inverted",
            scale=self.scale, window=self.window, softmax_dtype=self.softmax_dtype, upcast=self.upcast,
        )  # y (B, nh, T, hs), att (B, nh, T, Tk)

        # 6. merge heads: (B, nh, T, hs) -> (B, T, nh, hs) -> (B, T, nh*hs)
        if self.mutant == "merge-without-transpose":
            y = y.reshape(B, T, nh * hs)  # the F14 bug: mixes tokens and heads
        else:
            y = y.transpose(1, 2).contiguous().view(B, T, nh * hs)  # (B, T, nh*hs)

        # 7. output projection, where it lives inside the attention module
        if "o" in self._names:
            y = getattr(self, self._names["o"])(y)  # (B, T, d_model)
        return y, att


# ---------------------------------------------------------------------------------------------
# Swapping it in
# ---------------------------------------------------------------------------------------------

@dataclass
class Swapped:
    """What :func:`swap_attention` put in place.

    Attributes:
        modules: the :class:`ReferenceAttention` of every layer, in order.
        originals: the original attention modules, in order (restored on exit).
        context: the shared :class:`ForwardContext`.
        notes: anything done differently from the from-scratch path (e.g. a RoPE type taken from the model).
    """

    modules: list[ReferenceAttention]
    originals: list[nn.Module]
    context: ForwardContext
    notes: list[str] = field(default_factory=list)


def mutant_applies(mutant: str, model_or_lm) -> tuple[bool, str]:
    """Whether a mutant changes anything on this architecture, and why not if it does not.

    Causal mutants apply to decoders only; ``no-scale`` needs a model whose scale is not 1
    (GPT-2 with ``scale_attn_weights=False`` and no per-layer scaling has none).

    Raises:
        ProbeError: unknown mutant name.
    """
    if mutant not in MUTANTS:
        raise ProbeError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
    model = getattr(model_or_lm, "model", model_or_lm)
    config = model.config
    spec = get_spec(config)
    if mutant in _CAUSAL_MUTANTS and not spec.causal:
        return False, f"{mutant} applies to decoders only"
    if mutant == "no-scale":
        geo = head_geometry(config)
        if all(_model_scaling(config, spec, geo.d_head, i) == 1.0 for i in range(geo.n_layers)):
            return False, "the model does not scale its scores"
    return True, ""


def _bind_forward(module: nn.Module):
    signature = inspect.signature(module.forward)

    def bind(args, kwargs) -> dict:
        arguments = signature.bind_partial(*args, **kwargs).arguments
        for name, param in signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        return arguments
    return bind


@contextmanager
def swap_attention(model_or_lm, mutant: str | None = None) -> Iterator[Swapped]:
    """Context manager: every layer's attention module replaced by a :class:`ReferenceAttention`.

    Inside the context, forward passes of the model (also ``generate``) run the from-scratch
    attention; the weights are untouched (the reference modules hold the original projection
    modules). A forward pre-hook on the base model records the 2D padding keep-mask
    ([batch, past + T]) and ``position_ids`` of each pass into a shared :class:`ForwardContext`.
    On exit, also on exceptions, the original modules and the hook are removed/restored.

    Args:
        model_or_lm: a :class:`~probe.models.LoadedModel` or a Hugging Face model of a supported type.
        mutant: None, or a name from :data:`MUTANTS` (a deliberately broken variant).

    Yields:
        :class:`Swapped`.

    Raises:
        ProbeError: unknown mutant. UnsupportedArchitectureError: unsupported model type.
        MaskError (at forward): a 4D attention mask passed by the caller (the reference module must
            build causality itself), or a 2D mask whose length is not past + T (F09).
    """
    model = getattr(model_or_lm, "model", model_or_lm)
    spec = get_spec(model.config)
    if mutant is not None and mutant not in MUTANTS:
        raise ProbeError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
    context = ForwardContext()
    base = base_model(model)
    bind = _bind_forward(base)

    def pre_hook(module, args, kwargs):
        arguments = bind(args, kwargs)
        mask = arguments.get("attention_mask")
        ids = arguments.get("input_ids")
        embeds = arguments.get("inputs_embeds")
        n_new = (ids if ids is not None else embeds).shape[1] if (ids is not None or embeds is not None) else None
        cache = arguments.get("cache", arguments.get("past_key_values"))
        past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        if mask is not None:
            if mask.dim() != 2:
                raise MaskError(f"the reference attention takes a 2D [batch, key] padding mask; got shape "
                                f"{tuple(mask.shape)} (it builds the causal mask itself)")
            if n_new is not None and mask.shape[1] != past + n_new:
                raise MaskError(f"attention_mask has {mask.shape[1]} columns but the keys are {past + n_new} "
                                f"({past} cached + {n_new} new tokens); pass a mask covering the cached and new tokens")
            mask = as_keep_mask(mask)
        context.attention_mask = mask
        context.position_ids = arguments.get("position_ids")
        context.active = True

    def post_hook(module, args, kwargs, output):
        context.active = False
        context.attention_mask = context.position_ids = None

    layers = layer_modules(model, spec)
    parent_path, name = attention_path(spec, 0)
    originals = [layer.get_submodule(spec.attention) for layer in layers]
    handles = []
    done = []
    try:
        modules = [ReferenceAttention(orig, spec, model.config, i, context, mutant) for i, orig in enumerate(originals)]
        notes = sorted({n.split(": ", 1)[1] for m in modules for n in m.notes})
        if model.training:
            notes.append("the model is in train mode; the reference attention applies no dropout")
        handles.append(base.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(base.register_forward_hook(post_hook, with_kwargs=True, always_call=True))
        for layer, module in zip(layers, modules):
            parent = layer.get_submodule(parent_path) if parent_path else layer
            setattr(parent, name, module)
            done.append(layer)
        yield Swapped(modules, originals, context, notes)
    finally:
        for layer, original in zip(done, originals):
            parent = layer.get_submodule(parent_path) if parent_path else layer
            setattr(parent, name, original)
        for handle in handles:
            handle.remove()
        context.active = False
        context.attention_mask = context.position_ids = None
