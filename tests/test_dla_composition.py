"""probe.effects.dla and probe.effects.composition: the direct-logit-attribution identity (every component
through the frozen final norm adds up to the model's logit difference) on tiny GPT-2 and LLaMA and on SmolLM2,
architectures it does not fit refused; composition scores against dense [d_model, d_model] products; the
random baseline's numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from conftest import tiny_model
from probe.architectures import site_block, site_outputs
from probe.capture.reference.swap import swap_attention
from probe.effects.composition import _qkv, baseline, composition_scores, top_partners
from probe.effects.dla import direct_logit_attribution, dla_by_layer, head_grid
from probe.effects.patching import Pair, builtin_pairs
from probe.errors import InputError, UnsupportedAnalysisError

PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
         Pair("When Mary and John went to the store, John gave a drink to",
              "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")]


def _identity(frame) -> None:
    """sum_c DLA_c + beta . u + b_U[a] - b_U[b] = the model's logit difference, to 1e-4 (1 + sum |DLA_c|)."""
    a = frame.attrs
    assert a["holds"], a
    comps = frame[~frame["component"].isin(["norm_bias", "unembed_bias"])]
    assert abs(frame["dla"].sum() - a["logit_diff"]) <= 1e-4 * (1 + comps["dla"].abs().sum())
    assert a["residual"] < 1e-5


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "gpt_neox", "phi3", "gemma", "falcon", "falcon-new"])
def test_dla_components_add_up_to_the_logit_difference(kind):
    lm = tiny_model(kind)
    frame = direct_logit_attribution(lm, PAIRS)
    _identity(frame)
    L, H = lm.geometry.n_layers, lm.geometry.n_heads
    assert (frame["component"] == "head").sum() == L * H
    by_layer = dla_by_layer(frame)
    grid = head_grid(frame, L, H)
    np.testing.assert_allclose(by_layer["heads"], np.nansum(grid, 1), rtol=1e-12)


def test_dla_of_gpt2_has_its_biases_and_llama_none():
    """GPT-2 (its biases drawn at random: a fresh model's are 0) has b_O and LayerNorm beta terms, and the
    identity still holds; LLaMA (RMSNorm, no biases) has 0 for all three."""
    gpt2 = tiny_model("gpt2")
    with torch.no_grad():
        for name, p in gpt2.model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    g = direct_logit_attribution(gpt2, PAIRS)
    _identity(g)
    ll = direct_logit_attribution(tiny_model("llama"), PAIRS)
    assert g.loc[g["component"] == "b_O", "dla"].abs().sum() > 0
    assert g.loc[g["component"] == "norm_bias", "dla"].abs().sum() > 0
    assert (ll.loc[ll["component"].isin(["b_O", "norm_bias", "unembed_bias"]), "dla"] == 0).all()


def test_dla_refuses_stacks_whose_components_do_not_add_up():
    """BLOOM adds the residual inside its attention module (Gemma 2's norms after each sub-layer are
    linearised: tests/test_circuit_families.py)."""
    with pytest.raises(UnsupportedAnalysisError, match="do not add up to the final norm's input"):
        direct_logit_attribution(tiny_model("bloom"), PAIRS)


def test_dla_refuses_post_ln_encoders():
    with pytest.raises(UnsupportedAnalysisError, match="needs a pre-LN model.*is post-LN"):
        direct_logit_attribution(tiny_model("bert"), PAIRS)


@pytest.mark.slow
def test_dla_identity_on_smollm2(smollm2):
    _identity(direct_logit_attribution(smollm2, builtin_pairs()[:4]))


def _dense(lm, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_QK, W_OV) [d_model, d_model] of one head from the module weights directly (nn.Linear, float64),
    the block's RMSNorm gamma folded into the rows of W_Q, W_K, W_V."""
    g = lm.geometry
    block = site_block(lm.model, lm.spec, lm.sites[layer])
    attn = block.self_attn
    gamma = torch.diag(block.input_layernorm.weight.detach().double())
    kv = head // (g.n_heads // g.n_kv_heads)
    rows = lambda w, i: w.weight.detach().double()[i * g.d_head:(i + 1) * g.d_head].T  # noqa: E731
    W_Q, W_K, W_V = gamma @ rows(attn.q_proj, head), gamma @ rows(attn.k_proj, kv), gamma @ rows(attn.v_proj, kv)
    W_O = attn.o_proj.weight.detach().double()[:, head * g.d_head:(head + 1) * g.d_head].T
    return W_Q @ W_K.T, W_V @ W_O


def test_composition_scores_equal_dense_frobenius_norms():
    lm = tiny_model("llama", layers=3)
    frame = composition_scores(lm)
    H = lm.geometry.n_heads
    assert len(frame) == H * H * (2 + 1)  # writer layer 0 -> readers in layers 1, 2; layer 1 -> layer 2
    for (l1, h1, l2, h2) in [(0, 0, 1, 3), (0, 2, 2, 1), (1, 3, 2, 0)]:
        _, OV1 = _dense(lm, l1, h1)
        QK2, OV2 = _dense(lm, l2, h2)
        row = frame[(frame.writer_layer == l1) & (frame.writer_head == h1) & (frame.reader_layer == l2)
                    & (frame.reader_head == h2)].iloc[0]
        norm = torch.linalg.matrix_norm
        for mode, B in (("q", QK2), ("k", QK2.T), ("v", OV2)):
            expected = float(norm(OV1 @ B) / (norm(OV1) * norm(B)))
            assert row[mode] == pytest.approx(expected, rel=1e-9), mode
    assert frame.attrs["rope"] == "delta0"
    top = top_partners(frame, 2, 0, "k", n=3)
    assert list(top["k"]) == sorted(frame[(frame.reader_layer == 2) & (frame.reader_head == 0)]["k"],
                                    reverse=True)[:3]


def test_composition_centres_the_writer_under_layernorm():
    """GPT-2 (LayerNorm): the writer's W_OV is centred, (W_V W_O)(I - 11^T/d), before the product."""
    lm = tiny_model("gpt2")
    frame = composition_scores(lm)
    g = lm.geometry
    d, dh = g.d_model, g.d_head
    blocks = [site_block(lm.model, lm.spec, s) for s in lm.sites]
    c_attn = [b.attn.c_attn.weight.detach().double() for b in blocks]
    gam = [torch.diag(b.ln_1.weight.detach().double()) for b in blocks]
    o = site_outputs(lm.model, lm.spec)[0][1].weight.detach().double()
    h1, h2 = 1, 2
    OV1 = c_attn[0][:, 2 * d + h1 * dh:2 * d + (h1 + 1) * dh] @ o[h1 * dh:(h1 + 1) * dh]
    OV1 = OV1 @ (torch.eye(d, dtype=torch.float64) - 1.0 / d)
    QK2 = (gam[1] @ c_attn[1][:, h2 * dh:(h2 + 1) * dh]) @ (gam[1] @ c_attn[1][:, d + h2 * dh:d + (h2 + 1) * dh]).T
    norm = torch.linalg.matrix_norm
    row = frame[(frame.writer_head == h1) & (frame.reader_head == h2)].iloc[0]
    assert row["q"] == pytest.approx(float(norm(OV1 @ QK2) / (norm(OV1) * norm(QK2))), rel=1e-9)


@pytest.mark.parametrize("shape,mean", [((768, 64), 0.0360), ((576, 64), 0.0416), ((384, 32), 0.0510)])
def test_composition_baseline_of_random_matrices(shape, mean):
    """200 random pairs, seed 0: the mean is about 1/sqrt(d_model); std under 1.2e-3."""
    b = baseline(*shape)
    assert b["n"] == 200
    assert b["mean"] == pytest.approx(mean, abs=5e-4)
    assert 2e-4 < b["std"] < 1.2e-3
    assert baseline(*shape) == b  # seeded


def _rotated_qk(lm, layer: int, head: int, D: int) -> torch.Tensor:
    """W_QK(D) [d_model, d_model] from the model's own rotary embedding: every row of W_Q rotated as a query at
    position D and every row of W_K as a key at position 0 (transformers' apply_rotary_pos_emb), then Q K^T."""
    g = lm.geometry
    block = site_block(lm.model, lm.spec, lm.sites[layer])
    attn, rope = block.self_attn, lm.model.model.rotary_emb
    gamma = torch.diag(block.input_layernorm.weight.detach().double())
    kv = head // (g.n_heads // g.n_kv_heads)
    rows = lambda w, i: w.weight.detach().double()[i * g.d_head:(i + 1) * g.d_head].T  # noqa: E731
    W_Q, W_K = gamma @ rows(attn.q_proj, head), gamma @ rows(attn.k_proj, kv)
    x = torch.zeros(1, g.d_model, g.d_head)

    def at(p: int):
        cos, sin = rope(x, torch.full((1, g.d_model), p))
        return cos.double(), sin.double()  # [1, d_model, d_head]: apply_rotary_pos_emb adds the head axis

    (cq, sq), (ck, sk) = at(D), at(0)
    q, _ = apply_rotary_pos_emb(W_Q[None, None], W_Q[None, None], cq, sq)
    _, k = apply_rotary_pos_emb(W_K[None, None], W_K[None, None], ck, sk)
    return q[0, 0] @ k[0, 0].T


def test_composition_rope_mean_over_offsets_equals_the_models_rotation():
    lm = tiny_model("llama", layers=3)
    K = 6
    frame = composition_scores(lm, rope_offsets=K)
    plain = composition_scores(lm)
    assert frame.attrs["rope"] == "mean D=0..5" and plain.attrs["rope"] == "delta0"
    norm = torch.linalg.matrix_norm
    for (l1, h1, l2, h2) in [(0, 0, 1, 3), (0, 2, 2, 1), (1, 3, 2, 0)]:
        _, OV1 = _dense(lm, l1, h1)
        QKs = [_rotated_qk(lm, l2, h2, D) for D in range(K)]
        assert torch.allclose(QKs[0], _dense(lm, l2, h2)[0], atol=1e-10)  # D = 0 is the unrotated product
        pick = (frame.writer_layer == l1) & (frame.writer_head == h1) & (frame.reader_layer == l2) & (
            frame.reader_head == h2)
        row, row0 = frame[pick].iloc[0], plain[pick].iloc[0]
        for mode, mats in (("q", QKs), ("k", [B.T for B in QKs])):
            expected = np.mean([float(norm(OV1 @ B) / (norm(OV1) * norm(B))) for B in mats])
            assert row[mode] == pytest.approx(expected, rel=1e-6), mode
            assert row[mode] != pytest.approx(row0[mode], rel=1e-6)  # the offsets change the score
        assert row["v"] == pytest.approx(row0["v"], rel=1e-12)  # V-composition does not see the rotation
    with pytest.raises(InputError, match="rope_offsets"):
        composition_scores(lm, rope_offsets=0)


@pytest.mark.parametrize("kind", ["falcon", "falcon-new"])
def test_grouped_projection_factors_equal_the_reference_projections(kind):
    """Falcon's projection fused per key/value group: W_Q, W_K, W_V read from it equal the q, k, v the
    reference attention projects (multi-query: one key/value head; new_decoder_architecture: 2)."""
    lm = tiny_model(kind)
    x = torch.randn(2, 5, lm.geometry.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), swap_attention(lm) as swapped:
        for layer, module in enumerate(swapped.modules):
            w_q, w_k, w_v = _qkv(lm, layer)  # [heads | kv_heads, d_model, d_head]
            q, k, v = module.project(x)  # (B, nh, T, hs), (B, nkv, T, hs) x2
            assert k.shape[1] == lm.geometry.n_kv_heads == {"falcon": 1, "falcon-new": 2}[kind]
            for ours, w in ((q, w_q), (k, w_k), (v, w_v)):
                torch.testing.assert_close(ours.double(), torch.einsum("btd,hde->bhte", x.double(), w),
                                           atol=1e-5, rtol=0)


def test_composition_of_falcon_with_alibi_has_no_rotation():
    frame = composition_scores(tiny_model("falcon-alibi"), rope_offsets=4)
    assert frame.attrs["rope"] is None and len(frame) == 4 * 4 and frame[["q", "k", "v"]].notna().all().all()
