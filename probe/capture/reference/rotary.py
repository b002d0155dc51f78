"""Rotary position embedding (Su et al. 2021, RoFormer, sec. 3.4), computed from a config.

RoPE rotates each pair of query/key features by an angle proportional to the token's position, so
q . k depends on the positions only through their difference. Frequencies per pair i:
theta_i = base^(-2i / d_rot), with d_rot = the rotated dimensions (``partial_rotary_factor`` x
d_head; GPT-NeoX/Pythia rotate a quarter of each head, the rest passes through). Context-extension
variants change the frequencies (and for YaRN/LongRoPE also scale cos/sin):

* ``default`` - theta_i as above.
* ``linear`` - position interpolation: theta_i / factor (Chen et al. 2023).
* ``dynamic`` - NTK-aware: base grows with the sequence length L beyond the trained length
  L0: base * (factor * L / L0 - (factor - 1))^(d_rot / (d_rot - 2)) (bloc97/emozilla 2023);
  unchanged up to L0.
* ``llama3`` - long wavelengths divided by ``factor``, short ones kept, a smooth ramp between
  (Llama 3.1 report, "wavelength" rule).
* ``yarn`` - per-frequency blend of interpolation and extrapolation by a linear ramp between the
  dimensions that complete ``beta_slow`` and ``beta_fast`` turns in L0 tokens; cos/sin scaled by
  0.1 ln(factor) + 1 (Peng et al. 2023, YaRN, sec. 3.2-3.4).
* ``longrope`` - per-frequency rescale factors, ``short_factor`` up to L0 and ``long_factor``
  beyond; cos/sin scaled by sqrt(1 + ln(factor) / ln(L0)) (Ding et al. 2024, LongRoPE).
* ``proportional`` - only the first ``partial_rotary_factor`` share of the pairs rotate (the
  others get frequency 0, i.e. no rotation), all divided by ``factor``.

Nothing here reads the model's own rotary module; the tests compare with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import ProbeError

#: rope_type values computed here. Any other type is an error at swap time, never a silent fallback.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")


class RopeError(ProbeError, ValueError):
    """A RoPE configuration probe does not compute."""


@dataclass(frozen=True)
class Rope:
    """The rotary embedding of one layer.

    Attributes:
        params: the layer's RoPE settings (``rope_type``, ``rope_theta`` ...).
        d_head: features per head.
        rotary_dim: features rotated (the first ``rotary_dim`` of each head; even).
        max_positions: the config's ``max_position_embeddings`` (for ``dynamic``/``longrope``).
    """

    params: dict
    d_head: int
    rotary_dim: int
    max_positions: int | None

    @classmethod
    def from_config(cls, params: dict, d_head: int, max_positions: int | None) -> Rope:
        """Check the settings and size the rotation.

        Raises:
            RopeError: an unknown ``rope_type`` (the message names the ones computed here).
        """
        rope_type = params.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise RopeError(f"rope_type {rope_type!r} is not computed by probe's reference attention; "
                            f"supported: {', '.join(ROPE_TYPES)}")
        share = float(params.get("partial_rotary_factor", 1.0))
        rotary_dim = d_head if rope_type == "proportional" else int(d_head * share)
        return cls(dict(params), d_head, rotary_dim, max_positions)

    @property
    def rope_type(self) -> str:
        return self.params.get("rope_type", "default")

    def inv_freq(self, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """Inverse frequencies [rotary_dim / 2] (radians per token, float32) and the cos/sin scale.

        Args:
            seq_len: tokens in the current pass (max position + 1); only ``dynamic`` and
                ``longrope`` depend on it.
        """
        p, dim = self.params, self.rotary_dim
        base = float(p["rope_theta"])
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # 2i / d_rot, (d_rot/2,)
        kind = self.rope_type
        if kind == "default":
            return 1.0 / (base ** exponents), 1.0
        if kind == "linear":
            return 1.0 / (base ** exponents) / p["factor"], 1.0
        if kind == "dynamic":
            L0 = self.max_positions
            L = max(seq_len or L0, L0)
            base = base * ((p["factor"] * L / L0) - (p["factor"] - 1)) ** (dim / (dim - 2))
            return 1.0 / (base ** exponents), 1.0
        if kind == "llama3":
            return _llama3(1.0 / (base ** exponents), p), 1.0
        if kind == "yarn":
            return _yarn(base, dim, p, self.max_positions)
        if kind == "longrope":
            return _longrope(base, exponents, p, self.max_positions, seq_len)
        # proportional: the first share of the d_head/2 pairs rotate, the rest have frequency 0
        angles = int(float(p.get("partial_rotary_factor", 1.0)) * self.d_head // 2)
        rotated = 1.0 / (base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / self.d_head))
        inv = torch.cat((rotated, torch.zeros(self.d_head // 2 - angles)))
        return inv / p.get("factor", 1.0), 1.0

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of position x frequency, [batch, T, rotary_dim] (the half-dims repeated), times
        the type's scale, cast to ``dtype``."""
        seq_len = int(position_ids.max()) + 1 if position_ids.numel() else 1
        inv_freq, scale = self.inv_freq(seq_len)
        freqs = position_ids[..., None].float() * inv_freq.to(position_ids.device)  # (B, T, d_rot/2), radians
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, d_rot)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq  # tokens per full turn
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)  # long waves: / factor
    smooth = (old_len / wavelen - low) / (high - low)  # 0 at low_freq_wavelen, 1 at high_freq_wavelen
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(base: float, dim: int, p: dict, max_positions: int | None) -> tuple[torch.Tensor, float]:
    L0 = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_positions / L0
    attention = p.get("attention_factor")
    if attention is None:
        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention = float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
        else:
            attention = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def dim_of(turns):  # the dimension whose wavelength fits `turns` turns into L0 tokens
        return (dim * math.log(L0 / (turns * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolate = 1 - ramp  # 1 for high frequencies (kept), 0 for low ones (interpolated)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv, attention


def _longrope(base: float, exponents: torch.Tensor, p: dict, max_positions: int | None,
              seq_len: int | None) -> tuple[torch.Tensor, float]:
    L0 = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_positions / L0
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(L0))
    ext = p["long_factor"] if seq_len and seq_len > L0 else p["short_factor"]
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * base ** exponents), attention


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of a [batch, heads, T, d_head] tensor.

    Each pair (x_i, x_{i + d_rot/2}) of the rotated part turns by position x theta_i: the
    "rotate half" layout of GPT-NeoX/LLaMA (pairs are dimensions i and i + d_rot/2, not 2i and
    2i+1 as in RoFormer's eq. 34; the same rotation up to a fixed permutation of the weights).
    Features beyond d_rot pass through unchanged (partial rotary).

    Args:
        cos, sin: [batch, T, d_rot].
    """
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_rot)
    d_rot = cos.size(-1)
    rot, rest = x[..., :d_rot], x[..., d_rot:]  # (B, nh, T, d_rot), (B, nh, T, hs - d_rot)
    x1, x2 = rot[..., : d_rot // 2], rot[..., d_rot // 2:]  # (B, nh, T, d_rot/2) each
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, nh, T, d_rot)
    out = rot * cos + rotated * sin
    return out if rest.size(-1) == 0 else torch.cat((out, rest), dim=-1)


def apply_rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of a [batch, heads, T, d_head] tensor in adjacent
    pairs (x_2i, x_2i+1), RoFormer's layout (Su et al. 2021, eq. 34; Cohere, GLM-4, GPT-J), where
    :func:`apply_rope` pairs dimension i with i + d_rot/2; features beyond d_rot pass through.

    Args:
        cos, sin: [batch, T, d_rot], each angle's value at both features of its pair.
    """
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_rot)
    d_rot = cos.size(-1)
    rot, rest = x[..., :d_rot], x[..., d_rot:]
    turned = torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)  # (-x_2i+1, x_2i) per pair
    out = rot * cos + turned * sin
    return out if rest.size(-1) == 0 else torch.cat((out, rest), dim=-1)
