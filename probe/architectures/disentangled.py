"""DeBERTa's disentangled attention bias (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with
Disentangled Attention", sec. 3.1), with the log-bucketed relative positions of DeBERTa-v2/v3.

Each head's score of query i and key j is the sum of three terms, each divided by
sqrt(d_head * s), s = 1 + the number of position terms the config lists in ``pos_att_type``:

* content-to-content q_i . k_j (the ordinary score; the spec's ``scaling`` rule gives its divisor);
* content-to-position ("c2p") q_i . Kr[d(i, j)]: the query against the key projection of the
  embedding of the relative position d(i, j) = i - j;
* position-to-content ("p2c") k_j . Qr[-d(j, i)]: the key against the query projection of the
  embedding of the relative position seen from the key.

The embeddings Kr, Qr project the stack's relative position table ([2 * span, d_model], shared by all
layers, LayerNorm'd first when ``norm_rel_ebd`` names ``layer_norm``) with the layer's own key and
query projections (``share_att_key``) or with separate ``pos_key_proj`` / ``pos_query_proj``.
A relative position r indexes row ``clamp(r + span, 0, 2 * span - 1)``; span is
``position_buckets`` when positive, else ``max_relative_positions`` (or ``max_position_embeddings``
when that is below 1). With buckets, |r| <= buckets / 2 keeps its own row, and larger distances
share logarithmically wider rows: sign(r) * (mid + ceil((mid - 1) * log(|r| / mid) /
log((max_position - 1) / mid))), mid = buckets / 2, reaching the last row at ``max_position - 1``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def position_terms(config) -> tuple[str, ...]:
    """The position terms a DeBERTa-v2 config asks for, of ``("c2p", "p2c")`` (``pos_att_type``: a
    list, or an older config's ``"p2c|c2p"`` string)."""
    types = getattr(config, "pos_att_type", None) or ()
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|")]
    return tuple(t for t in ("c2p", "p2c") if t in types)


def disentangled_scale(config, d_head: int) -> float:
    """The divisor of every term, sqrt(d_head * s), s = 1 + the number of position terms (sec. 3.1:
    "scaling by 1/sqrt(3d)" with both)."""
    return math.sqrt(d_head * (1 + len(position_terms(config))))


def disentangled_scaling(config, d_head: int, layer: int) -> float:
    """DeBERTa-v2/v3's multiplier of q k^T (the spec's ``scaling`` rule): 1/sqrt(d_head * s), s = 1 +
    the number of position terms in ``pos_att_type`` (He et al. 2021, sec. 3.1: 1/sqrt(3 d) with c2p
    and p2c)."""
    return 1.0 / disentangled_scale(config, d_head)


def separate_position_projections(config) -> str | None:
    """DeBERTa-v2/v3's refusal of head removal (the spec's ``removal_refusal`` rule): why heads cannot
    be removed where the relative positions have their own ``pos_key_proj`` / ``pos_query_proj``
    (``share_att_key=False``), whose heads head removal does not cut; None otherwise."""
    if getattr(config, "relative_attention", False) and not getattr(config, "share_att_key", False):
        return ("projects its relative positions with separate pos_key_proj / pos_query_proj "
                "(share_att_key=False), which head removal does not cut")
    return None


def relative_span(config) -> int:
    """Rows on each side of the relative position table: ``position_buckets`` if positive, else
    ``max_relative_positions`` (``max_position_embeddings`` when below 1)."""
    buckets = getattr(config, "position_buckets", None) or -1
    if buckets > 0:
        return int(buckets)
    return int(_max_relative(config))


def _max_relative(config) -> int:
    value = getattr(config, "max_relative_positions", None) or -1
    return value if value >= 1 else config.max_position_embeddings


def log_buckets(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's bucket of each relative position (an integer tensor, any shape), same shape, long.

    |r| <= buckets // 2 stays r; beyond, sign(r) * (mid + ceil((mid - 1) * log(|r| / mid) /
    log((max_position - 1) / mid))), computed in float32. Without buckets (``buckets`` or
    ``max_position`` below 1) r itself.
    """
    if buckets <= 0 or max_position <= 0:
        return relative.long()
    mid = buckets // 2
    distance = relative.abs()
    far = distance > mid
    ratio = torch.log(distance.clamp(min=1).float() / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    log_row = torch.ceil(ratio * (mid - 1)) + mid  # float32, as the published code
    return torch.where(far, log_row * torch.sign(relative).float(), relative.float()).long()


def relative_table(embedding: torch.nn.Embedding, norm: torch.nn.LayerNorm | None, config) -> torch.Tensor:
    """The relative position embeddings the layers project, [2 * span, d_model]: the stack's table
    (its first 2 * span rows), layer-normalised with the stack's LayerNorm weights when
    ``norm_rel_ebd`` names ``layer_norm``."""
    table = embedding.weight[:2 * relative_span(config)]
    names = [n.strip() for n in str(getattr(config, "norm_rel_ebd", None) or "none").lower().split("|")]
    if "layer_norm" in names and norm is not None:
        table = F.layer_norm(table, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return table


def relative_rows(from_positions: torch.Tensor, to_positions: torch.Tensor, config, sign: int = 1) -> torch.Tensor:
    """Row of the relative table for every pair, [from, to] long: clamp(sign * d(a, b) + span, 0,
    2 * span - 1), d(a, b) the bucket of a - b for a in ``from_positions`` [from] and b in
    ``to_positions`` [to]. ``sign`` -1 reads the opposite direction (p2c's -d(j, i); also the
    ``c2p-sign`` bug)."""
    span = relative_span(config)
    buckets = getattr(config, "position_buckets", None) or -1
    d = log_buckets(from_positions[:, None] - to_positions[None, :], buckets, _max_relative(config))
    return (sign * d + span).clamp(0, 2 * span - 1)


def disentangled_bias(q: torch.Tensor, k: torch.Tensor, pos_query: torch.Tensor | None,
                      pos_key: torch.Tensor | None, config, past: int, c2p_sign: int = 1) -> torch.Tensor:
    """The c2p and p2c terms, divided by sqrt(d_head * s): [batch, heads, query, key].

    Args:
        q: [batch, heads, query, d_head]; k: [batch, heads, key, d_head] (projected, split into heads).
        pos_query: the relative table through the p2c query projection, [heads, 2 * span, d_head]
            (None without p2c); pos_key: through the c2p key projection (None without c2p).
        config: the model's config (``pos_att_type``, ``position_buckets``, ``max_relative_positions``).
        past: position of the first query among the keys.
        c2p_sign: +1; -1 flips the relative position of the c2p term (the ``c2p-sign`` mutant).
    """
    B, nh, Tq, hs = q.shape
    Tk = k.size(-2)
    scale = disentangled_scale(config, hs)
    bias = torch.zeros(B, nh, Tq, Tk, dtype=q.dtype, device=q.device)
    terms = position_terms(config)
    queries = torch.arange(Tq, device=q.device) + past  # positions of the queries among the keys
    keys = torch.arange(Tk, device=q.device)
    if "c2p" in terms:  # q_i . Kr[d(i, j)]
        rows = relative_rows(queries, keys, config, c2p_sign)  # (Tq, Tk)
        c2p = q @ pos_key.transpose(-1, -2)[None]  # (B, nh, Tq, 2*span)
        bias = bias + torch.gather(c2p, -1, rows[None, None].expand(B, nh, Tq, Tk)) / scale
    if "p2c" in terms:  # k_j . Qr[-d(j, i)]
        rows = relative_rows(keys, queries, config, -1)  # (Tk, Tq)
        p2c = k @ pos_query.transpose(-1, -2)[None]  # (B, nh, Tk, 2*span)
        bias = bias + torch.gather(p2c, -1, rows[None, None].expand(B, nh, Tk, Tq)).transpose(-1, -2) / scale
    return bias
