"""One weight convention (probe.architectures.weights and .layout): for every family, W_Q, W_K, W_V
[heads, d_model, d_head] and their biases reproduce the model's own projections, W_O [heads, d_head, d_model]
its output projection, the spec's norms, MLPs and final norm are the model's modules, and a gate that
scales a head equals scaling that head's rows of W_O by hand."""

from __future__ import annotations

import pytest
import torch

from conftest import ONE_STACK, tiny_model, tolerance
from probe.architectures import site_block, site_spec, weights
from probe.capture.maps import encode, forward
from probe.causal.gates import gated


def _projections(lm, site, x):
    """The model's own q, k, v [batch, n, T, d_head] of ``x`` (the layout's split of its modules' outputs)."""
    block, paths = site_block(lm.model, lm.spec, site), site_spec(lm.spec, site)
    g = lm.geometry
    return lm.spec.layout.project(lambda role: block.get_submodule(getattr(paths, role)), x, g.n_heads,
                                  g.n_kv_heads, g.d_head)


@pytest.mark.parametrize("kind", ONE_STACK)
def test_qkv_weights_and_biases_reproduce_the_models_projections(kind):
    lm = tiny_model(kind)
    site = lm.sites[1]
    w = weights.attention_weights(lm.model, lm.spec, site)
    g = lm.geometry
    assert w.W_Q.shape == (g.n_heads, g.d_model, g.d_head) and w.W_O.shape == (g.n_heads, g.d_head, g.d_model)
    assert w.W_K.shape == w.W_V.shape == (g.n_kv_heads, g.d_model, g.d_head)
    x = torch.randn(2, 5, g.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = _projections(lm, site, x)
        for W, b, t in zip((w.W_Q, w.W_K, w.W_V), (w.b_Q, w.b_K, w.b_V), want):
            got = torch.einsum("btd,hde->bhte", x, W) + (0 if b is None else b[None, :, None, :])
            assert torch.allclose(got, t, **tolerance("scaled")), kind


@pytest.mark.parametrize("kind", ONE_STACK)
def test_output_weights_reproduce_the_output_projection(kind):
    lm = tiny_model(kind)
    site = lm.sites[0]
    W_O, b_O = weights.output_weights(lm.model, lm.spec, site)
    o = site_block(lm.model, lm.spec, site).get_submodule(site_spec(lm.spec, site).o)
    g = lm.geometry
    z = torch.randn(3, g.n_heads, g.d_head, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = o(z.reshape(3, -1))
        got = torch.einsum("nhd,hdm->nm", z, W_O) + (0 if b_O is None else b_O)
    assert torch.allclose(got, want, **tolerance("scaled"))


@pytest.mark.parametrize("kind,final,block_norm,offset", [
    ("gpt2", "transformer.ln_f", "ln_1", 0.0), ("llama", "model.norm", "input_layernorm", 0.0),
    ("gpt_neox", "gpt_neox.final_layer_norm", "input_layernorm", 0.0), ("gemma", "model.norm", "input_layernorm", 1.0),
    ("bloom", "transformer.ln_f", "input_layernorm", 0.0), ("phi3", "model.norm", "input_layernorm", 0.0),
])
def test_the_specs_norms_and_mlps_are_the_models_modules(kind, final, block_norm, offset):
    lm = tiny_model(kind)
    assert weights.final_norm(lm.model, lm.spec) is lm.model.get_submodule(final)
    block = site_block(lm.model, lm.spec, lm.sites[1])
    norm = weights.input_norm(lm.model, lm.spec, lm.sites[1])
    assert norm is getattr(block, block_norm) and weights.block_mlp(lm.model, lm.spec, lm.sites[1]) is block.mlp
    assert torch.equal(weights.norm_gain(lm.spec, norm), norm.weight.detach() + offset)
    W_U = weights.unembedding(lm.model)
    assert W_U.shape == (lm.geometry.d_model, lm.model.config.vocab_size)
    assert torch.equal(W_U, lm.model.get_output_embeddings().weight.detach().t())


def test_encoders_name_no_final_norm_and_refuse_an_unembedding():
    lm = tiny_model("bert")
    assert weights.final_norm(lm.model, lm.spec) is None and weights.input_norm(lm.model, lm.spec, lm.sites[0]) is None
    with pytest.raises(ValueError, match="no language-model head"):
        weights.unembedding(lm.model)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_gate_that_scales_a_head_equals_scaling_its_output_rows_by_hand(kind):
    lm = tiny_model(kind)
    batch = encode(lm, ["The cat sat on the mat and looked at the dog."])
    gates = torch.ones(lm.geometry.n_layers, lm.geometry.n_heads)
    gates[1, 2] = 0.5
    with torch.no_grad(), gated(lm, gates):
        gated_logits = forward(lm, batch).logits
    site = lm.sites[1]
    o = site_block(lm.model, lm.spec, site).get_submodule(site_spec(lm.spec, site).o)
    d = lm.geometry.d_head
    with torch.no_grad():
        rows = slice(2 * d, 3 * d)
        saved = o.weight.detach().clone()
        if lm.spec.conv1d:
            o.weight[rows] *= 0.5
        else:
            o.weight[:, rows] *= 0.5
        by_hand = forward(lm, batch).logits
        o.weight.copy_(saved)
    assert torch.allclose(gated_logits, by_hand, **tolerance("scaled"))
