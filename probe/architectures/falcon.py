"""Falcon's behaviour rules (the spec's ``rope``, ``kv_heads``, ``position_bias`` and ``note`` fields): its
configs choose rotary positions or ALiBi (``alibi``), and multi-head, multi-query (``multi_query``) or
grouped (``new_decoder_architecture``, ``num_kv_heads``) key/value heads.

How often transformers' eager Falcon attention adds its ALiBi bias is not assumed: it changed between
releases (5.24's module added a / sqrt(d) inside the scaled scores and again through the attention mask,
twice; 5.25's adds it once, through the mask, as its sdpa path and the original Falcon code do), so
:func:`eager_alibi_count` measures it on a tiny model of the installed release, once per process, and
the reference attention (:data:`FALCON_ALIBI`) and the loaded model's
note follow what it measured."""

from __future__ import annotations

import functools
import math

import torch

from ..errors import UnsupportedArchitectureError
from ..util import quiet_transformers
from .position_bias import PositionBias, alibi_slopes
from .spec import _query_heads, _rope_single

#: The tiny model the count is measured on: 2 heads of 8 dimensions, 4 tokens.
_HEADS, _D_HEAD, _TOKENS = 2, 8, 4


def rope_unless_alibi(config, layer: int) -> dict | None:
    """Falcon: RoPE unless the config asks for ALiBi (``alibi=True``; then no rotation, None)."""
    return None if getattr(config, "alibi", False) else _rope_single(config, layer)


def kv_heads_multi_query(config) -> int:
    """Falcon: ``num_kv_heads`` groups with ``new_decoder_architecture``, one shared key/value head
    with ``multi_query`` (Shazeer 2019), else one per query head."""
    if getattr(config, "new_decoder_architecture", False):
        return config.num_kv_heads
    return 1 if getattr(config, "multi_query", False) else _query_heads(config)


@functools.cache
def eager_alibi_count(config_class: type) -> int:
    """How many times the installed transformers' eager Falcon attention adds the ALiBi bias a / sqrt(d)
    to a score (a = m_h * j, Press et al. 2022, sec. 3), measured once per process.

    A one-layer model of ``config_class`` with ALiBi (2 heads, d_head 8, no biases) reads inputs of
    zeros: its input norm maps them to 0, so q = k = 0 and every score is the position bias alone.
    Then ln(A[i, 1] / A[i, 0]) = c * m_h / sqrt(d) for the last query row i, and c is read off both
    heads (transformers' own ``output_attentions`` maps of the eager implementation).

    Returns:
        c: 1 (transformers >= 5.25, its sdpa path, the original Falcon code) or 2 (transformers 5.0-5.24's
        eager path: inside the scaled scores and again through the mask).

    Raises:
        UnsupportedArchitectureError: the measured count is not a whole number of 1 or 2 (a release
            whose Falcon the reference does not know).
    """
    from transformers import AutoModel  # deferred: transformers takes ~1.5 s to import


    config = config_class(hidden_size=_HEADS * _D_HEAD, num_attention_heads=_HEADS, num_hidden_layers=1,
                          vocab_size=8, bos_token_id=0, eos_token_id=0, alibi=True, multi_query=False,
                          new_decoder_architecture=False, bias=False)
    with quiet_transformers(), torch.no_grad():
        model = AutoModel.from_config(config, attn_implementation="eager").eval()
        probs = model(inputs_embeds=torch.zeros(1, _TOKENS, _HEADS * _D_HEAD), output_attentions=True).attentions[0]
    row = probs[0, :, -1].double()  # [heads, key]
    slopes = alibi_slopes(_HEADS).bfloat16().double()  # Falcon rounds its slopes to bfloat16
    counts = torch.log(row[:, 1] / row[:, 0]) * math.sqrt(_D_HEAD) / slopes
    count = round(float(counts.mean()))
    if count not in (1, 2) or float((counts - count).abs().max()) > 1e-2:
        raise UnsupportedArchitectureError(
            f"this transformers release's eager Falcon attention adds its ALiBi bias {float(counts.mean()):.3g} "
            "times (measured); probe's reference attention knows once or twice")
    return count


def alibi_note(config) -> str | None:
    """Falcon with ALiBi whose eager attention adds the bias twice (measured, :func:`eager_alibi_count`):
    what the captured maps are (docs/verification.md, "Falcon with ALiBi"); None otherwise."""
    if not getattr(config, "alibi", False) or eager_alibi_count(type(config)) != 2:
        return None
    return ("falcon with alibi=True: this transformers release's eager attention, whose probabilities probe captures, "
            "adds the ALiBi bias twice (measured on a tiny model); the model's sdpa outputs add it once, so its maps "
            "show twice the sdpa recency bias")


def _alibi_values(module, n_key, key_positions, device) -> torch.Tensor | None:
    """Falcon's a = m_h * j [batch|1, heads, 1, key] (float32 holding bfloat16 values: its
    ``build_alibi_tensor`` rounds the slopes and the products to bfloat16), None without ALiBi."""
    if not getattr(module.config, "alibi", False):
        return None
    if key_positions is None:
        key_positions = torch.arange(n_key, device=device)[None]  # (1, Tk)
    slopes = alibi_slopes(module.n_head).to(device).bfloat16()[None, :, None, None]
    return (module.alibi_sign * slopes * key_positions[:, None, None, :]).float()  # bf16 product, as float32


def _alibi_after(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor | None:
    """Falcon's ALiBi as transformers adds it through the attention mask, after the scaling: + a / sqrt(d)."""
    a = _alibi_values(module, n_key, key_positions, device)
    return None if a is None else a / math.sqrt(module.d_head)


def _alibi_inner(module, n_query, n_key, past, key_positions, device, content=None) -> torch.Tensor | None:
    """Falcon's a added to q k^T before the scaling, (q k^T + a) / sqrt(d), where the installed release's
    eager attention adds it a second time so (:func:`eager_alibi_count` 2); else None."""
    if not getattr(module.config, "alibi", False) or eager_alibi_count(type(module.config)) != 2:
        return None
    return _alibi_values(module, n_key, key_positions, device)


#: Falcon's optional ALiBi, as the installed transformers' eager attention adds it: through the mask, and
#: where :func:`eager_alibi_count` measures 2 also inside the scaled scores.
FALCON_ALIBI = PositionBias("falcon-alibi", _alibi_after, inner=_alibi_inner)
