"""Direct logit attribution per head (Elhage et al. 2021, "the residual stream"): how much of the
logit difference each component writes directly.

In a pre-norm decoder the final norm's input x_t at position t is a sum of components: the
embeddings (the first block's input), every head's z_h W_O^h (its slice of the output projection),
every layer's output-projection bias b_O, and every MLP output. With the final norm's per-token
scale frozen at the clean run's value, the norm is linear in its input, so each component c gets

    DLA_c = n(c) . u,   u = W_U[answer] - W_U[wrong]

with n(c) = gamma (c - mean_d c) / sigma_t for LayerNorm (sigma_t = sqrt(Var_d x_t + eps)) and
n(c) = gamma c / sqrt(mean_d x_t^2 + eps) for RMSNorm (Gemma: 1 + gamma); gamma is applied here, not
folded into the unembedding. The terms add up exactly: sum_c DLA_c + beta . u + b_U[a] - b_U[b] =
logit_a - logit_b. Every result is checked against the model's own logits (float32 tolerance
1e-4 (1 + sum_c |DLA_c|)); an architecture whose components do not add up to the final norm's input
(post-sublayer norms, parallel stacks probe does not model) gets no attribution, with a note.
Post-LN encoders (BERT) are not linear in this sense and are refused.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..architectures import site_block, weights
from ..architectures.modules import site_spec
from ..capture.hooks import input_device
from ..capture.intervene import Cache, intervening
from ..causal.parts import check_pre_ln, find_parts
from ..errors import InputError, UnsupportedAnalysisError
from .patching import EncodedPairs, Pair, builtin_pairs, check_patchable, encode_pairs, final_norm


def head_out_weights(lm, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_O [heads, d_head, d_model], b_O [d_model], zeros without a bias) of ``layer`` (float64), from
    :func:`probe.architectures.weights.output_weights`.

    Raises:
        InputError: no site ``layer`` (a negative number is refused, never wrapped).
    """
    n = len(lm.sites)
    if not (isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < n):
        raise InputError(f"layer {layer!r} out of range: {lm.name} has layers 0-{n - 1}")
    w, b = weights.output_weights(lm.model, lm.spec, lm.sites[layer])
    w = w.double()
    return w, b.double() if b is not None else torch.zeros(w.shape[-1], dtype=w.dtype)


def _parts(lm) -> tuple[list, list, nn.Module, list]:
    """(per layer the module whose output is the MLP's write, per layer the attention's post-norm or
    None, the final norm, the linear maps between the final norm and the unembedding): from the spec,
    or for a discovered spec found by a pass (:func:`probe.causal.parts.find_parts`).

    Raises:
        UnsupportedAnalysisError: no MLP or no final norm known.
    """
    if lm.spec.discovered:
        parts = find_parts(lm)
        writers = [post or out or mlp for mlp, out, post in zip(parts.mlp, parts.mlp_out, parts.mlp_post)]
        posts, norm, between = parts.attn_post, parts.final, parts.after_final
        if norm is None:
            raise UnsupportedAnalysisError(f"{lm.name}: probe found no final norm")
    else:
        writers, posts = [], []
        for site in lm.sites:
            block, paths = site_block(lm.model, lm.spec, site), site_spec(lm.spec, site)
            post = weights.present_module(block, paths.mlp_post)
            writers.append(post or weights.block_mlp(lm.model, lm.spec, site))
            posts.append(weights.present_module(block, paths.attn_post))
        norm, between = final_norm(lm), []
    if any(m is None for m in writers):
        raise UnsupportedAnalysisError(f"{lm.name}: probe does not know where its MLPs are")
    return writers, posts, norm, between


@torch.no_grad()
def _components(lm, enc: EncodedPairs):
    """One clean pass: the embeddings, z (per layer, last position), MLP writes, the post-norms'
    inputs, final-norm input and the unembedding's logits (before a final soft-cap or scale), each
    [pairs, ...] at each pair's last real position."""
    L = lm.geometry.n_layers
    writers, posts, norm, between = _parts(lm)
    blocks = [site_block(lm.model, lm.spec, s) for s in lm.sites]
    rows, got = torch.arange(len(enc)), {}

    def take(key, x: torch.Tensor) -> None:
        x = x[0] if isinstance(x, tuple) else x
        x = x.reshape(len(enc), -1, x.shape[-1])  # OPT's MLP: [pairs * T, d_model]
        got[key] = x[rows, enc.last.to(x.device)].detach().double().cpu()

    device, z = input_device(lm.model), Cache()
    unembed = lm.model.get_output_embeddings()
    with intervening(lm) as iv:
        iv.before(blocks[0], lambda a, k: take("embed", a[0] if a else k["hidden_states"]))
        iv.before(norm, lambda a, k: take("final", a[0] if a else k["hidden_states"]))
        iv.edit("output", lambda site: z.reader(site))
        for layer, mlp in enumerate(writers):
            iv.after(mlp, lambda out, layer=layer: take(("mlp", layer), out))
        for layer, post in enumerate(posts):
            if post is not None:
                iv.before(post, lambda a, k, layer=layer: take(("post_in", layer), a[0] if a else k["hidden_states"]))
        iv.after(unembed, lambda out: take("logits", out))
        lm.model(input_ids=enc.clean.to(device), attention_mask=enc.mask.to(device), use_cache=False)
    for layer, site in enumerate(lm.sites):
        take(("z", layer), z[site].flatten(2))  # [pairs, T, heads * d_head]
    at = got["logits"]
    return got, norm, (at[rows, enc.answer] - at[rows, enc.wrong]), L, posts, between


def direct_logit_attribution(lm, pairs: list[Pair] | None = None) -> pd.DataFrame:
    """Direct logit attribution of every component on the clean prompts of ``pairs`` (mean over pairs).

    Args:
        lm: a decoder-only :class:`~probe.loading.models.LoadedModel` with its LM head.
        pairs: prompt pairs (default :func:`~probe.effects.patching.builtin_pairs`); only the clean
            prompt, answer and wrong answer are used.

    Returns:
        One row per component: ``component`` (``embed``, ``head``, ``b_O``, ``mlp``, ``norm_bias``,
        ``unembed_bias``), ``layer`` (-1 where none), ``head`` (-1 where none), ``dla`` (logits).
        ``attrs``: ``logit_diff`` (the model's, mean over pairs), ``total`` (sum of the rows),
        ``residual`` (max over pairs of |identity difference|), ``tolerance``.

    Raises:
        UnsupportedAnalysisError: not a decoder with an LM head, an unknown norm, or components that
            do not add up to the final norm's input (an architecture this linearisation does not fit).
    """
    check_pre_ln(lm, "direct logit attribution")
    if lm.kind != "decoder":
        raise UnsupportedAnalysisError(f"direct logit attribution is computed for decoder-only models here; "
                                       f"{lm.name} is an {lm.kind} model")
    lm.require_all_heads("direct logit attribution")
    check_patchable(lm)
    enc = encode_pairs(lm, builtin_pairs() if pairs is None else pairs)
    got, norm, ld, L, posts, between = _components(lm, enc)
    unembed = lm.model.get_output_embeddings()
    W_U = weights.unembedding(lm.model).double()  # [d_model, vocab]
    for linear in reversed(between):  # OPT's project_out: logits = project_out(norm(x)) W_U
        W_U = linear.weight.detach().double().T @ W_U
    u = (W_U[:, enc.answer] - W_U[:, enc.wrong]).T  # [pairs, d_model]
    fn, beta = weights.frozen_norm(lm.spec, norm, got["final"])
    rows, parts, total = [], [], got["embed"].clone()
    rows.append(("embed", -1, -1)), parts.append(got["embed"])
    for layer in range(L):
        W_O, b_O = head_out_weights(lm, layer)
        z = got[("z", layer)].reshape(len(enc), lm.geometry.n_heads, lm.geometry.d_head)
        heads = torch.einsum("nhd,hdm->hnm", z, W_O)  # [heads, pairs, d_model]
        if posts[layer] is not None:  # the attention's post-norm, its scale frozen at the clean run
            post, post_beta = weights.frozen_norm(lm.spec, posts[layer], got[("post_in", layer)])
            heads, b_O = post(heads), post(b_O.expand_as(got["embed"])) + post_beta
        for h in range(lm.geometry.n_heads):
            rows.append(("head", layer, h)), parts.append(heads[h])
        rows.append(("b_O", layer, -1)), parts.append(b_O.expand_as(got["embed"]))
        rows.append(("mlp", layer, -1)), parts.append(got[("mlp", layer)])
        total = total + heads.sum(0) + b_O + got[("mlp", layer)]
    scale = got["final"].abs().max().item() + 1.0
    if (total - got["final"]).abs().max().item() > 1e-4 * scale:
        raise UnsupportedAnalysisError(f"{lm.name} ({lm.model_type}): its embeddings, heads, biases and MLP outputs do "
                                       "not add up to the final norm's input, so direct logit attribution does not "
                                       "apply as probe computes it")
    dla = torch.stack([(fn(c) * u).sum(-1) for c in parts])  # [components, pairs]
    b_U = unembed.bias.detach().double() if getattr(unembed, "bias", None) is not None else None
    extra = [("norm_bias", (beta * u).sum(-1))]
    extra.append(("unembed_bias", (b_U[enc.answer] - b_U[enc.wrong]) if b_U is not None else torch.zeros(len(enc))))
    for name, v in extra:
        rows.append((name, -1, -1))
        dla = torch.cat([dla, v[None]])
    residual = (dla.sum(0) - ld).abs()
    tolerance = 1e-4 * (1 + dla[:-2].abs().sum(0))
    frame = pd.DataFrame(rows, columns=["component", "layer", "head"])
    frame["dla"] = dla.mean(1).numpy()
    frame.attrs.update(logit_diff=float(ld.mean()), total=float(dla.sum(0).mean()), residual=float(residual.max()),
                       tolerance=float(tolerance.min()), holds=bool((residual <= tolerance).all()), pairs=len(enc))
    return frame


def dla_by_layer(frame: pd.DataFrame) -> pd.DataFrame:
    """Per layer: ``heads`` (sum of its heads' DLA), ``b_O``, ``mlp`` and ``top_head`` (the head
    with the largest |DLA|), from a :func:`direct_logit_attribution` frame."""
    rows = []
    for layer, g in frame[frame["layer"] >= 0].groupby("layer"):
        heads = g[g["component"] == "head"]
        top = heads.loc[heads["dla"].abs().idxmax()]
        rows.append({"layer": int(layer), "heads": float(heads["dla"].sum()),
                     "b_O": float(g.loc[g["component"] == "b_O", "dla"].sum()),
                     "mlp": float(g.loc[g["component"] == "mlp", "dla"].sum()),
                     "top_head": int(top["head"]), "top_dla": float(top["dla"])})
    return pd.DataFrame(rows)


def head_grid(frame: pd.DataFrame, n_layers: int, n_heads: int) -> np.ndarray:
    """[layers, heads] DLA of the heads of a :func:`direct_logit_attribution` frame."""
    heads = frame[frame["component"] == "head"]
    grid = np.full((n_layers, n_heads), np.nan)
    grid[heads["layer"].to_numpy(), heads["head"].to_numpy()] = heads["dla"].to_numpy()
    return grid
