"""Composition scores on the families whose q, k, v projections are their attention module's own code
(OLMo2's q/k norm over the whole projection, Qwen3-MoE's per-head q/k norm, DeepSeek-V2/V3's low-rank
MLA projections and shared rotary key, CodeGen's fused projection interleaved by shard): the matrices
probe measures from the modules (probe.effects.projections) against each family's weights read by hand,
and every score against the Frobenius ratio of the whole [d_model, d_model] matrices built from them."""

from __future__ import annotations

import pytest
import torch
from generic_models import generic_lm

from probe.effects.composition import composition_scores, probed
from probe.effects.projections import module_projections

FAMILIES = ("olmo2", "qwen3_moe", "deepseek_v2", "deepseek_v3", "codegen")


def _randomise_norms(model) -> None:
    """Gains (and biases) away from 1 (0) so that folding them in, or not, changes every score."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if "norm" in type(m).__name__.lower() and getattr(m, "weight", None) is not None:
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


def _codegen():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from tiny_models import build  # the models table's tiny CodeGen (rotary_dim 8, 4 shards)

    from probe.loading.models import from_pretrained_objects

    model, tok = build("codegen", "decoder")
    return from_pretrained_objects(model, tok, name="tiny-codegen")


def _hand(lm, layer: int) -> dict:
    """Per head: W_Q [d, d_qk], W_K, W_V [d, d_v] (query-head order), W_O [d_v, d] and the input norm's gain,
    the post-norm's gain and whether the writer is centred, read from the family's own modules."""
    cfg, model = lm.model.config, lm.model
    H, d = lm.geometry.n_heads, lm.geometry.d_model
    if lm.model_type == "codegen":
        block = model.transformer.h[layer]
        attn, dh = block.attn, d // H
        W = attn.qkv_proj.weight.detach().double().T.reshape(d, 4, 3, d // 4)  # 4 shards of (q, v, k)
        q, v, k = (W[:, :, i].reshape(d, H, dh).permute(1, 0, 2) for i in range(3))
        o = attn.out_proj.weight.detach().double().T.reshape(H, dh, d)
        return dict(q=q, k=k, v=v, o=o, gamma=block.ln_1.weight.detach().double(), post=None, centred=True)
    block = model.model.layers[layer]
    attn = block.self_attn
    gamma = block.input_layernorm.weight.detach().double() if hasattr(block, "input_layernorm") else None
    if lm.model_type.startswith("deepseek"):
        nope, rope, dv, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        q = (attn.q_a_proj.weight.detach().double().T * attn.q_a_layernorm.weight.detach().double()) @ \
            attn.q_b_proj.weight.detach().double().T
        q = q.reshape(d, H, nope + rope).permute(1, 0, 2)
        a = attn.kv_a_proj_with_mqa.weight.detach().double().T  # [d, r + rope]
        latent, pe = a[:, :r] * attn.kv_a_layernorm.weight.detach().double(), a[:, r:]
        kv = (latent @ attn.kv_b_proj.weight.detach().double().T).reshape(d, H, nope + dv).permute(1, 0, 2)
        k = torch.cat([kv[..., :nope], pe[None].expand(H, d, rope)], -1)
        if getattr(cfg, "rope_interleave", False):  # DeepSeek-V3: the rotary dims as (even, odd) before turning
            order = torch.cat([torch.arange(nope), nope + torch.arange(0, rope, 2), nope + torch.arange(1, rope, 2)])
            q, k = q[..., order], k[..., order]
        v = kv[..., nope:]
        o = attn.o_proj.weight.detach().double().T.reshape(H, dv, d)
        return dict(q=q, k=k, v=v, o=o, gamma=gamma, post=None, centred=False)
    dh, kv_heads = lm.geometry.d_head, cfg.num_key_value_heads
    q = attn.q_proj.weight.detach().double().T.reshape(d, H, dh).permute(1, 0, 2)
    k = attn.k_proj.weight.detach().double().T.reshape(d, kv_heads, dh).permute(1, 0, 2)
    v = attn.v_proj.weight.detach().double().T.reshape(d, kv_heads, dh).permute(1, 0, 2)
    qn, kn = attn.q_norm.weight.detach().double(), attn.k_norm.weight.detach().double()
    q = q * qn.reshape(-1, 1, dh) if qn.numel() == H * dh else q * qn  # OLMo2: over the whole projection
    k = k * kn.reshape(-1, 1, dh) if kn.numel() == kv_heads * dh else k * kn
    group = torch.arange(H) // (H // kv_heads)
    o = attn.o_proj.weight.detach().double().T.reshape(H, dh, d)
    post = block.post_attention_layernorm.weight.detach().double() if lm.model_type == "olmo2" else None
    return dict(q=q, k=k[group], v=v[group], o=o, gamma=gamma, post=post, centred=False)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    lm = _codegen() if request.param == "codegen" else generic_lm(request.param)
    _randomise_norms(lm.model)
    return request.param, lm


def test_the_measured_matrices_are_the_family_s_own(family):
    """W_Q, W_K, W_V measured by running each module on a basis equal the weights read by hand (norm gains
    folded in, per-token scales left out), to float32 precision; the linearity check held."""
    name, lm = family
    assert probed(lm)
    for layer, p in enumerate(module_projections(lm)):
        hand = _hand(lm, layer)
        H = lm.geometry.n_heads
        group = torch.arange(H) // (H // p.W_K.shape[0])
        for mine, theirs in ((p.W_Q, hand["q"]), (p.W_K[group], hand["k"]), (p.W_V[group], hand["v"])):
            assert mine.shape == theirs.shape
            scale = theirs.abs().max().item()
            assert (mine - theirs).abs().max().item() <= 1e-5 * scale, name
        assert p.error <= 1e-5


def _ratio(A: torch.Tensor, B: torch.Tensor) -> float:
    return (torch.linalg.norm(A @ B) / (torch.linalg.norm(A) * torch.linalg.norm(B))).item()


def test_every_score_is_the_frobenius_ratio_of_the_whole_matrices(family):
    """Q-, K- and V-composition of every writer and later reader equal |W_OV W|_F / (|W_OV|_F |W|_F) with
    W_QK = W_Q W_K^T and W_OV = W_V W_O built in full from the hand-read weights, the reader's input-norm
    gain on the rows of its W_Q, W_K, W_V and the writer's post-norm gain on W_O's columns (LayerNorm
    models: the writer centred)."""
    name, lm = family
    frame = composition_scores(lm)
    assert frame.attrs["notes"] and "per-token scales are left out" in frame.attrs["notes"][0]
    hands = [_hand(lm, layer) for layer in range(lm.geometry.n_layers)]

    def mats(h, head):
        g = h["gamma"][:, None] if h["gamma"] is not None else 1.0
        q, k, v = (h[m][head] * g for m in ("q", "k", "v"))
        o = h["o"][head] * (h["post"] if h["post"] is not None else 1.0)
        return q @ k.T, v @ o, o

    checked = 0
    for row in frame.itertuples():
        w, r = hands[row.writer_layer], hands[row.reader_layer]
        _, _, o_w = mats(w, row.writer_head)
        o_w = o_w - o_w.mean(-1, keepdim=True) if w["centred"] else o_w
        ov_w = (w["v"][row.writer_head] * (w["gamma"][:, None] if w["gamma"] is not None else 1.0)) @ o_w
        qk, ov, _ = mats(r, row.reader_head)
        assert row.q == pytest.approx(_ratio(ov_w, qk), rel=1e-4), (name, row)
        assert row.k == pytest.approx(_ratio(ov_w, qk.T), rel=1e-4), (name, row)
        assert row.v == pytest.approx(_ratio(ov_w, ov), rel=1e-4), (name, row)
        checked += 1
    assert checked == len(frame) == lm.geometry.n_heads ** 2


def test_a_hand_written_family_reads_its_weights_as_before():
    """A spec that found its projections (LLaMA) is not read from its modules: nothing changes there."""
    from conftest import tiny_model

    lm = tiny_model("llama")
    assert not probed(lm)
    assert composition_scores(lm).attrs["notes"] == []


def test_probe_patch_on_olmo2_writes_composition_and_says_how_it_was_read():
    """probe patch's run on OLMo2 (composition was refused: projections not found) holds the scores of
    composition_scores and one note naming the modules' matrices."""
    from test_dla_composition import PAIRS

    from probe.effects.patch_run import measure

    lm = generic_lm("olmo2")
    run = measure(lm, PAIRS)
    assert run.composition is not None
    alone = composition_scores(lm)
    assert run.composition[["q", "k", "v"]].to_numpy().tolist() == alone[["q", "k", "v"]].to_numpy().tolist()
    assert [n for n in run.notes if n.startswith("composition:")] == [f"composition: {alone.attrs['notes'][0]}"]
