"""Composition scores between heads, from the weights alone (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits": Q-, K- and V-composition).

Row convention (y = x W, as TransformerLens): per query head h, W_QK^h = W_Q^h W_K^g(h)T and
W_OV^h = W_V^g(h) W_O^h, both [d_model, d_model] of rank <= d_head (g(h): the key/value head the
query head reads). For a writer h1 in layer l1 and a reader h2 in a later layer l2:

    Q: |W_OV^h1 W_QK^h2|_F / (|W_OV^h1|_F |W_QK^h2|_F)
    K: |W_OV^h1 W_QK^h2T|_F / (...)
    V: |W_OV^h1 W_OV^h2|_F / (...)

(the paper's column convention transposes every matrix; the numbers are the same). The reader's
input-norm gamma is folded into the rows of its W_Q, W_K, W_V, and a norm on the attention's output
(Gemma 2 and 3) into the columns of W_O (its per-token scale, the same for every head of a token, is
left out as the input norm's is); with LayerNorm the writer is centred,
W_OV^h1 (I - 11^T / d_model); q/k norm gammas (Qwen3) scale W_Q / W_K columns; per-token scales and
biases are left out (the scores do not depend on a scale). Norms of products are computed factored:
|L_A M R_B|_F^2 = tr(M^T L_A^T L_A M R_B R_B^T) with M = R_A L_B, [d_head, d_head].

RoPE makes the query-key product position dependent: with the rotation written as a matrix on row
vectors, x -> x M(p) (``x cos + rotate_half(x) sin`` at position p, the model's frequencies, its
rotated dimensions only), the score of query i and key j is x_i W_Q M(i) M(j)^T W_K^T x_j^T =
x_i W_Q M(D) W_K^T x_j^T with D = i - j, so W_QK(D) = W_Q M(D) W_K^T. The default scores the content
term D = 0 (W_Q W_K^T, no rotation; ``rope`` ``"delta0"``); ``rope_offsets=K`` scores the mean over
D = 0 .. K-1 of the Q- and K-composition scores with W_QK(D) (``"mean D=0..K-1"``); V-composition
does not involve the rotation. Grouped-query attention: the query heads of one group
share W_K and W_V, so their K- and V-composition with a writer are correlated by construction.

The baseline: 200 pairs of random products of the same shapes, A = L1 R1, B = L2 R2 with L
[d_model, d_head], R [d_head, d_model] i.i.d. N(0, 1), seed 0; its mean is about 1/sqrt(d_model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..architectures import needs_weights, site_outputs, weights
from ..architectures.modules import site_block, site_spec
from ..capture.reference import Rope
from ..causal.heads import normalize_heads
from ..causal.parts import check_pre_ln, find_parts
from ..errors import InputError, UnsupportedAnalysisError
from .dla import head_out_weights
from .projections import module_projections

MODES = ("q", "k", "v")
BASELINE_PAIRS = 200


def _input_norm(lm, layer: int) -> tuple[torch.Tensor | None, bool]:
    """(gamma [d_model] float64 or None, is LayerNorm) of a block's attention input norm (the spec's
    :attr:`~probe.architectures.SiteSpec.input_norm`)."""
    norm = weights.input_norm(lm.model, lm.spec, lm.sites[layer])
    if norm is None or getattr(norm, "weight", None) is None:
        return None, False
    return weights.norm_gain(lm.spec, norm, torch.float64), lm.spec.norm == "layernorm"


def _post_norm_gain(lm, layer: int) -> torch.Tensor | None:
    """The gain [d_model] (float64) of the norm a hand-written spec names on the attention's output
    (:attr:`~probe.architectures.SiteSpec.attn_post`), or None."""
    site = lm.sites[layer]
    norm = weights.present_module(site_block(lm.model, lm.spec, site), site_spec(lm.spec, site).attn_post)
    return None if norm is None else weights.norm_gain(lm.spec, norm, torch.float64)


def _qkv(lm, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W_Q [heads, d_model, d_head], W_K and W_V [kv_heads, d_model, d_head] of ``layer`` (float64), the
    per-head q/k norms' gains folded in (:func:`probe.architectures.weights.attention_weights`)."""
    w = weights.attention_weights(lm.model, lm.spec, lm.sites[layer])
    q, k, v = (t.double() for t in (w.W_Q, w.W_K, w.W_V))
    q = q if w.q_gain is None else q * w.q_gain.double()  # not in place: a float64 model's W_Q is its weight
    k = k if w.k_gain is None else k * w.k_gain.double()
    return q, k, v


def probed(lm) -> bool:
    """Whether ``lm``'s q, k, v matrices are read from its attention modules
    (:func:`probe.effects.projections.module_projections`): a discovered spec that found the output
    projection but not (all of) q, k and v (OLMo2, Qwen3-MoE, DeepSeek's MLA, CodeGen)."""
    spec = lm.spec
    return bool(spec.discovered and not spec.capture_only and "o" not in spec.missing
                and any(p in spec.missing for p in ("q", "k", "v")))


def _found_norms(lm, parts, layer: int) -> tuple[torch.Tensor | None, bool, torch.Tensor | None]:
    """(input norm gain or None, is LayerNorm, post-norm gain or None) of ``layer`` from the norms
    :func:`probe.causal.parts.find_parts` found (float64)."""
    norm, post = parts.norm[layer], parts.attn_post[layer]
    gain = None if norm is None or getattr(norm, "weight", None) is None else weights.norm_gain(
        lm.spec, norm, torch.float64)
    layernorm = norm is not None and "rms" not in type(norm).__name__.lower()
    return gain, layernorm, None if post is None else weights.norm_gain(lm.spec, post, torch.float64)


def head_factors(lm) -> dict:
    """Per layer, the factors of W_QK and W_OV (float64), the reader's norm folded in:
    ``q``, ``k``, ``v`` [layers, heads, d_model, d_head] (k, v repeated per query head),
    ``o`` [layers, heads, d_head, d_model] (the writer's: centred for LayerNorm models) and
    ``o_reader`` (as stored, a post-norm's gain folded in). Where :func:`probed`, q, k and v are the
    matrices measured from the attention modules and the norms those :func:`~probe.causal.parts.find_parts`
    finds (MLA: q and k are d_qk wide, v d_v)."""
    g = lm.geometry
    out = {m: [] for m in ("q", "k", "v", "o", "o_reader")}
    from_modules = module_projections(lm) if probed(lm) else None
    parts = find_parts(lm) if from_modules is not None else None
    for layer in range(g.n_layers):
        if from_modules is None:
            q, k, v = _qkv(lm, layer)
            gamma, layernorm = _input_norm(lm, layer)
            post = _post_norm_gain(lm, layer)
        else:
            p = from_modules[layer]
            q, k, v = p.W_Q, p.W_K, p.W_V
            gamma, layernorm, post = _found_norms(lm, parts, layer)
        group = torch.arange(g.n_heads) // (g.n_heads // k.shape[0])
        k, v = k[group], v[group]
        if gamma is not None:
            q, k, v = (t * gamma[None, :, None] for t in (q, k, v))
        o_reader = head_out_weights(lm, layer)[0]
        if post is not None:  # a norm on the attention's output (Gemma 2, 3): its gain is part of W_O
            o_reader = o_reader * post
        o = o_reader - o_reader.mean(-1, keepdim=True) if layernorm else o_reader
        for name, t in zip(("q", "k", "v", "o", "o_reader"), (q, k, v, o, o_reader)):
            out[name].append(t)
    return {name: torch.stack(ts) for name, ts in out.items()}


def _reader(f: dict, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_B [layers, heads, d_model, d_head], R_B [layers, heads, d_head, d_model]) of the reader's matrix."""
    if mode == "q":
        return f["q"], f["k"].transpose(-1, -2)
    if mode == "k":
        return f["k"], f["q"].transpose(-1, -2)
    return f["v"], f["o_reader"]


def factored_scores(A_L, A_R, B_L, B_R) -> torch.Tensor:
    """|A B|_F / (|A|_F |B|_F) for A = A_L A_R [n, d, d] over writers and B = B_L B_R over readers:
    [writers, readers].

    Args:
        A_L: [n, d, r] left factors of the writers.
        A_R: [n, r, d] right factors of the writers.
        B_L: [m, d, r] left factors of the readers.
        B_R: [m, r, d] right factors of the readers.
    """
    G_A = A_L.transpose(-1, -2) @ A_L  # [n, r, r]
    G_B = B_R @ B_R.transpose(-1, -2)  # [m, r, r]
    norm_a = torch.einsum("nij,nji->n", G_A, A_R @ A_R.transpose(-1, -2)).clamp(min=0).sqrt()
    norm_b = torch.einsum("mij,mji->m", B_L.transpose(-1, -2) @ B_L, G_B).clamp(min=0).sqrt()
    M = torch.einsum("nrd,mds->nmrs", A_R, B_L)  # [n, m, r, r]
    P = torch.einsum("nrs,nmst->nmrt", G_A, M)
    Q = torch.einsum("nmrs,mst->nmrt", M, G_B)
    sq = (P * Q).sum((-1, -2)).clamp(min=0)
    return sq.sqrt() / (norm_a[:, None] * norm_b[None, :])


def rotations(lm, layer: int, offsets: int) -> torch.Tensor:
    """[offsets, d_head, d_head] M(D) for D = 0 .. offsets-1 (float64): the rotation of ``layer``'s
    queries by D positions as a matrix on row vectors, x M(D) = x cos(D theta) + rotate_half(x) sin(D theta)
    on the rotated dimensions (the model's frequencies and scale), the identity on the others."""
    config, dh = lm.model.config, lm.geometry.d_head
    rope = Rope.from_config(lm.spec.rope(config, layer), dh, getattr(config, "max_position_embeddings", None))
    r, half = rope.rotary_dim, rope.rotary_dim // 2
    cos, sin = rope.cos_sin(torch.arange(offsets)[None], torch.float64)  # [1, offsets, r]
    swap = torch.zeros(r, r, dtype=torch.float64)  # rotate_half(x) = x @ swap
    swap[torch.arange(half) + half, torch.arange(half)] = -1.0
    swap[torch.arange(half), torch.arange(half) + half] = 1.0
    out = torch.eye(dh, dtype=torch.float64).repeat(offsets, 1, 1)
    out[:, :r, :r] = torch.diag_embed(cos[0]) + swap[None] @ torch.diag_embed(sin[0])
    return out


def baseline(d_model: int, d_head: int, mode: str = "k", n: int = BASELINE_PAIRS, seed: int = 0) -> dict:
    """Scores of ``n`` pairs of random rank-``d_head`` products (entries N(0, 1), seed ``seed``):
    ``mean``, ``std`` (ddof 1), ``n``."""
    gen = torch.Generator().manual_seed(seed)
    draw = [torch.randn(n, *shape, generator=gen, dtype=torch.float64)
            for shape in ((d_model, d_head), (d_head, d_model)) * 2]
    L1, R1, L2, R2 = draw
    if mode == "k":  # B^T = R2^T L2^T
        L2, R2 = R2.transpose(-1, -2), L2.transpose(-1, -2)
    scores = torch.stack([factored_scores(L1[i:i + 1], R1[i:i + 1], L2[i:i + 1], R2[i:i + 1])[0, 0]
                          for i in range(n)]).numpy()
    return {"mean": float(scores.mean()), "std": float(scores.std(ddof=1)), "n": n}


def check_composable(lm) -> None:
    """Raises UnsupportedAnalysisError unless ``lm`` is a complete pre-norm decoder-only model."""
    check_pre_ln(lm, "composition scores")
    if lm.kind != "decoder":
        raise UnsupportedAnalysisError(f"composition scores are computed for decoder-only (pre-norm) models; "
                                       f"{lm.name} is an {lm.kind} model")
    lm.require_all_heads("composition")
    needs_weights(lm.spec, "composition scores", ("o",) if probed(lm) else ("q", "k", "v", "o"))
    if len(site_outputs(lm.model, lm.spec)) != lm.geometry.n_layers:
        raise UnsupportedAnalysisError(f"{lm.name}: one attention site per layer expected")


def _reader_rotated(lm, f: dict, mode: str, offsets: int) -> list:
    """Per offset D, the reader factors (L_B, R_B) of ``mode`` with W_QK(D) (q, k); one entry, D = 0, otherwise."""
    B_L, B_R = _reader(f, mode)
    if mode == "v" or offsets == 1:
        return [(B_L, B_R)]
    M = torch.stack([rotations(lm, layer, offsets) for layer in range(lm.geometry.n_layers)])  # [L, K, dh, dh]
    M = M if mode == "q" else M.transpose(-1, -2)  # K: W_QK(D)^T = W_K M(D)^T W_Q^T
    return [(torch.einsum("lhdr,lrs->lhds", B_L, M[:, d]), B_R) for d in range(offsets)]


@torch.no_grad()
def composition_scores(lm, rope_offsets: int = 1) -> pd.DataFrame:
    """Q-, K- and V-composition of every writer head with every head of a later layer.

    Args:
        lm: a complete pre-norm decoder-only model.
        rope_offsets: RoPE models: Q and K scores averaged over the relative offsets D = 0 .. K-1
            (W_QK(D), see the module docstring); 1 (default): D = 0 only. Ignored without RoPE.

    Returns:
        One row per (writer, reader) with l1 < l2: ``writer_layer``, ``writer_head``, ``reader_layer``,
        ``reader_head``, ``q``, ``k``, ``v`` and ``q_z``, ``k_z``, ``v_z`` (z-scores against the
        random baseline). ``attrs``: ``baseline`` (mode -> mean, std, n), ``rope`` (``"delta0"``,
        ``"mean D=0..K-1"`` or None without RoPE), ``notes`` (where the matrices were read from the
        modules: :func:`probed`).

    Raises:
        UnsupportedAnalysisError: not a complete decoder-only model.
        InputError: rope_offsets below 1.
    """
    check_composable(lm)
    if rope_offsets < 1:
        raise InputError(f"rope_offsets must be at least 1 (D = 0 only), got {rope_offsets}")
    if rope_offsets > 1 and lm.spec.discovered:
        raise UnsupportedAnalysisError(f"rope_offsets > 1 needs a hand-written spec's RoPE settings; {lm.model_type} "
                                       "was discovered (use rope_offsets=1, D = 0)")
    g, f = lm.geometry, head_factors(lm)
    L, H = g.n_layers, g.n_heads
    rotary = lm.spec.rotary and lm.spec.rope(lm.model.config, 0) is not None  # Falcon with ALiBi: no rotation
    offsets = rope_offsets if rotary else 1
    out = []
    for mode in MODES:
        readers = _reader_rotated(lm, f, mode, offsets)
        per = []
        for l1 in range(L - 1):
            s = sum(factored_scores(f["v"][l1], f["o"][l1], B_L[l1 + 1:].flatten(0, 1), B_R[l1 + 1:].flatten(0, 1))
                    for B_L, B_R in readers) / len(readers)
            per.append(s.reshape(H, L - l1 - 1, H))
        out.append(per)
    rows = []
    for l1 in range(L - 1):
        w, l2, r = np.meshgrid(np.arange(H), np.arange(l1 + 1, L), np.arange(H), indexing="ij")
        rows.append(pd.DataFrame({"writer_layer": l1, "writer_head": w.ravel(), "reader_layer": l2.ravel(),
                                  "reader_head": r.ravel(),
                                  **{m: out[i][l1].numpy().ravel() for i, m in enumerate(MODES)}}))
    frame = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        columns=["writer_layer", "writer_head", "reader_layer", "reader_head", *MODES])
    base = {m: baseline(g.d_model, g.d_head, m) for m in MODES}
    for m in MODES:
        frame[f"{m}_z"] = (frame[m] - base[m]["mean"]) / base[m]["std"]
    rope = None if not rotary else "delta0" if offsets == 1 else f"mean D=0..{offsets - 1}"
    notes = [] if not probed(lm) else [
        f"{lm.model_type}'s q, k and v matrices are read from its attention modules (probe.effects.projections), "
        "the norms inside them taken linear: their per-token scales are left out, as the input norm's are"]
    frame.attrs.update(baseline=base, rope=rope, notes=notes)
    return frame


def top_partners(frame: pd.DataFrame, layer: int, head: int, mode: str = "k", n: int = 3) -> pd.DataFrame:
    """The ``n`` writers with the strongest ``mode``-composition into reader (``layer``, ``head``).

    Args:
        frame: :func:`composition_scores`' table.
        layer: the reader's layer (layer 0 reads nothing: no rows).
        head: the reader's head.
        mode: ``q``, ``k`` or ``v`` (or a z-score column).
        n: how many writers.

    Raises:
        InputError: a reader outside the model the table was measured on (naming its ranges).
    """
    n_layers = int(max(frame["writer_layer"].max(), frame["reader_layer"].max())) + 1
    normalize_heads([(layer, head)], n_layers, int(frame["reader_head"].max()) + 1)
    rows = frame[(frame["reader_layer"] == layer) & (frame["reader_head"] == head)]
    return rows.sort_values(mode, ascending=False).head(n)
