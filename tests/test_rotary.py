"""RoPE from scratch (probe.capture.reference.rotary) against each tiny model's own rotary module.

Per layer, the settings come from ``get_spec(config).rope(config, layer)``; the frequencies,
the cos/sin scale and cos/sin themselves (at several sequence lengths, for the length-dependent
types as the Hugging Face module computes them) must equal the model's.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import ENCODERS, KINDS, family_of, tiny_model, tolerance
from probe.architectures import get_spec, head_geometry, site_modules
from probe.capture.reference import ROPE_TYPES, Rope, RopeError, apply_rope
from probe.capture.reference.swap import swap_attention
from probe.verification import verify

# decoders with rotary positions (GPT-2 and GPT-Neo have learned ones, BLOOM ALiBi, BART/Marian sinusoidal, T5 a bias)
ROTARY = tuple(k for k in KINDS if k not in ENCODERS and k != "falcon-alibi"
               and family_of(k) not in ("gpt2", "gpt_neo", "bloom", "bart", "marian", "t5"))

#: rope_type and rotated features per head of every rotary kind (d_head 16; Gemma's 24).
EXPECTED = {
    "llama": ("default", 16), "llama-linear": ("linear", 16), "llama-llama3": ("llama3", 16),
    "llama-dynamic": ("dynamic", 16), "llama-yarn": ("yarn", 16), "llama-longrope": ("longrope", 16),
    "qwen2": ("default", 16), "qwen2-window": ("default", 16), "qwen3": ("default", 16), "mistral": ("default", 16),
    "gpt_neox": ("default", 4), "phi3": ("default", 8), "gemma": ("default", 24), "gemma2": ("default", 24),
    "gemma3": ("default", 24), "falcon": ("default", 16), "falcon-new": ("default", 16),
}

_MODELS: dict = {}


def _model(kind):
    """The tiny model of ``kind`` (built once per module; the rotary tests never change it)."""
    if kind not in _MODELS:
        _MODELS[kind] = tiny_model(kind, wrap=False)[0]
    return _MODELS[kind]


def _rope(config, layer) -> Rope:
    return Rope.from_config(get_spec(config).rope(config, layer), head_geometry(config).d_head,
                            config.max_position_embeddings)


def _hf(rotary, config, layer):
    """(inv_freq, attention_scaling, layer_type or None) of the model's rotary module for one layer."""
    if isinstance(rotary.rope_type, dict):  # Gemma 3: one set of buffers per layer type
        t = config.layer_types[layer]
        return getattr(rotary, f"{t}_inv_freq"), getattr(rotary, f"{t}_attention_scaling"), t
    return rotary.inv_freq, rotary.attention_scaling, None


def _hf_cos_sin(rotary, position_ids, layer_type, d_head):
    x = torch.zeros(1, 1, d_head)
    with torch.no_grad():
        if layer_type is None:
            return rotary(x, position_ids)
        return rotary(x, position_ids, layer_type)


def test_every_rotary_kind_is_listed():
    assert set(ROTARY) == set(EXPECTED)


def test_falcon_with_alibi_has_no_rotation():
    """Falcon rotates q and k unless ``alibi=True``; the reference follows the config, not the family."""
    for kind, rotates in (("falcon", True), ("falcon-alibi", False)):
        lm = tiny_model(kind)
        with swap_attention(lm) as swapped:
            assert all((m.rope is not None) == rotates for m in swapped.modules)
        assert (get_spec(lm.model.config).rope(lm.model.config, 0) is None) == (not rotates)


@pytest.mark.parametrize("kind", ROTARY)
def test_frequencies_and_scale_match_the_model(kind):
    model = _model(kind)
    config, rotary = model.config, model.base_model.rotary_emb
    rope_type, rotary_dim = EXPECTED[kind]
    for layer in range(config.num_hidden_layers):
        rope = _rope(config, layer)
        assert rope.rope_type == rope_type and rope.rotary_dim == rotary_dim
        ours, scale = rope.inv_freq()
        theirs, their_scale, _ = _hf(rotary, config, layer)
        assert ours.dtype == torch.float32 and ours.shape == (rotary_dim // 2,) == theirs.shape
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=0), (layer, ours, theirs)
        assert scale == pytest.approx(their_scale, rel=1e-12)


@pytest.mark.parametrize("kind", ROTARY)
def test_cos_sin_match_the_model_at_every_length(kind):
    """Lengths 5 .. 200 in increasing order (the model's module grows its cache as in generation),
    then back to 5 (it resets); positions from a left-padding mask too."""
    model = _model(kind)
    config = model.config
    rotary = type(model.base_model.rotary_emb)(config=config)  # a fresh module: no history
    d_head = head_geometry(config).d_head
    for length in (5, 16, 17, 64, 65, 100, 200, 5):
        positions = torch.arange(length)[None]
        for layer in range(config.num_hidden_layers):
            rope = _rope(config, layer)
            _, _, layer_type = _hf(rotary, config, layer)
            cos, sin = _hf_cos_sin(rotary, positions, layer_type, d_head)
            our_cos, our_sin = rope.cos_sin(positions, torch.float32)
            assert our_cos.shape == cos.shape == (1, length, rope.rotary_dim)
            assert torch.allclose(our_cos, cos, atol=1e-6, rtol=0), (length, layer)
            assert torch.allclose(our_sin, sin, atol=1e-6, rtol=0), (length, layer)
    left = torch.tensor([[0, 0, 0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7, 8]])  # positions from a mask
    for layer in range(config.num_hidden_layers):
        _, _, layer_type = _hf(rotary, config, layer)
        cos, sin = _hf_cos_sin(rotary, left, layer_type, d_head)
        our_cos, our_sin = _rope(config, layer).cos_sin(left, torch.float32)
        assert torch.allclose(our_cos, cos, atol=1e-6, rtol=0) and torch.allclose(our_sin, sin, atol=1e-6, rtol=0)


def test_dynamic_frequencies_grow_with_the_length_beyond_the_trained_one():
    rope = _rope(_model("llama-dynamic").config, 0)  # factor 2, trained length 64
    default = _rope(_model("llama").config, 0).inv_freq()[0]
    for length in (1, 10, 64):
        assert torch.equal(rope.inv_freq(length)[0], default)  # unchanged up to the trained length
    d = 16
    for length in (100, 200):
        base = 10000.0 * (2.0 * length / 64 - 1.0) ** (d / (d - 2))
        expected = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
        assert torch.allclose(rope.inv_freq(length)[0], expected, rtol=1e-6, atol=0)
    assert bool((rope.inv_freq(200)[0][1:] < rope.inv_freq(100)[0][1:]).all())  # longer: slower rotation


def test_longrope_switches_factors_after_the_original_length():
    rope = _rope(_model("llama-longrope").config, 0)  # original length 16, factor 64 / 16 = 4
    short, long = rope.params["short_factor"], rope.params["long_factor"]
    exps = torch.arange(0, 16, 2).float() / 16
    for length, factors in ((1, short), (16, short), (17, long), (64, long)):
        inv, scale = rope.inv_freq(length)
        assert torch.allclose(inv, 1.0 / (torch.tensor(factors) * 10000.0 ** exps), rtol=1e-6, atol=0)
        assert scale == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))  # sqrt(1.5)


def test_yarn_scale_and_ramp():
    rope = _rope(_model("llama-yarn").config, 0)  # factor 4, original length 16
    inv, scale = rope.inv_freq()
    default = _rope(_model("llama").config, 0).inv_freq()[0]
    assert scale == pytest.approx(0.1 * math.log(4) + 1)
    ratio = (default / inv).tolist()
    assert ratio[0] == pytest.approx(1.0)  # fast dimensions: extrapolated (unchanged)
    assert ratio[-1] == pytest.approx(4.0)  # slow dimensions: interpolated (divided by factor)
    assert all(a <= b + 1e-9 for a, b in zip(ratio, ratio[1:]))  # a monotone ramp between


def test_llama3_has_three_regimes():
    ours = _rope(_model("llama-llama3").config, 0).inv_freq()[0]
    base = _rope(_model("llama").config, 0).inv_freq()[0]
    ratio = (base / ours).tolist()  # wavelengths 2*pi*10000^(i/8): 6.3, 20, 63, ... tokens
    assert ratio[0] == 1.0  # shorter than original_max / high_freq_factor = 8 tokens: unchanged
    assert 1.0 < ratio[1] < 8.0  # between 8 and 32 tokens: interpolated
    assert ratio[2:] == pytest.approx([8.0] * 6)  # longer than 32 tokens: divided by factor 8


def test_linear_divides_every_frequency_by_the_factor():
    ours = _rope(_model("llama-linear").config, 0).inv_freq()[0]
    base = _rope(_model("llama").config, 0).inv_freq()[0]
    assert torch.allclose(base / ours, torch.full((8,), 2.0), rtol=1e-6)


def test_gemma3_rope_differs_by_layer_type():
    config = _model("gemma3").config
    assert config.layer_types == ["sliding_attention", "full_attention"]
    local, full = _rope(config, 0), _rope(config, 1)
    assert local.params["rope_theta"] == 10000.0 and full.params["rope_theta"] == 1_000_000.0
    assert not torch.allclose(local.inv_freq()[0], full.inv_freq()[0])
    with swap_attention(_model("gemma3")) as swapped:
        assert [m.rope.params["rope_theta"] for m in swapped.modules] == [10000.0, 1_000_000.0]


def test_proportional_matches_transformers():
    """No tiny kind uses ``proportional``; compare with transformers' own init function."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 2.0}
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_parameters=dict(params))
    theirs, their_scale = ROPE_INIT_FUNCTIONS["proportional"](config, None)
    rope = Rope.from_config(params, 16, 64)
    ours, scale = rope.inv_freq()
    assert rope.rotary_dim == 16 and ours.shape == theirs.shape == (8,)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0) and scale == their_scale
    assert torch.count_nonzero(ours[4:]) == 0 and bool((ours[:4] > 0).all())  # half the pairs do not rotate


def test_every_rope_type_is_covered():
    used = {_rope(_model(k).config, layer).rope_type for k in ROTARY for layer in range(2)}
    assert used | {"proportional"} == set(ROPE_TYPES)


@pytest.mark.parametrize("kind", ["gpt_neox", "phi3"])
def test_partial_rotary_matches_the_model_and_leaves_the_rest(kind):
    import transformers

    module = getattr(transformers.models, kind)
    hf_apply = getattr(module, f"modeling_{kind}").apply_rotary_pos_emb
    model = _model(kind)
    rope = _rope(model.config, 0)
    torch.manual_seed(8)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    positions = torch.arange(9)[None].expand(2, -1)
    cos, sin = rope.cos_sin(positions, torch.float32)
    hf_cos, hf_sin = model.base_model.rotary_emb(q, positions)
    assert cos.shape[-1] == rope.rotary_dim < 16
    q2, k2 = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    hq, hk = hf_apply(q, k, hf_cos, hf_sin)
    assert torch.allclose(q2, hq, **tolerance("scaled")) and torch.allclose(k2, hk, **tolerance("scaled"))
    d = rope.rotary_dim
    assert torch.equal(q2[..., d:], q[..., d:])  # the rest passes through
    pairs = lambda x: x[..., :d // 2] ** 2 + x[..., d // 2:d] ** 2  # noqa: E731
    assert torch.allclose(pairs(q2), pairs(q), atol=1e-5)  # each pair is rotated, not scaled
    assert not torch.allclose(q2[:, :, 1:, :d], q[:, :, 1:, :d], atol=1e-3)  # positions > 0 do turn


def test_scores_depend_only_on_the_position_difference():
    rope = _rope(_model("llama").config, 0)
    torch.manual_seed(9)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        cq, sq = rope.cos_sin(torch.tensor([[m]]), torch.float64)
        ck, sk = rope.cos_sin(torch.tensor([[n]]), torch.float64)
        return float((apply_rope(q.double(), cq, sq) * apply_rope(k.double(), ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(27, 23), abs=1e-5)  # angles are float32
    assert score(7, 3) == pytest.approx(score(4, 0), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_unknown_rope_type_is_an_error_never_a_fallback():
    with pytest.raises(RopeError, match=r"rope_type 'mystery' is not computed by probe's reference attention; "
                                        r"supported: default, linear, dynamic, llama3, yarn, longrope, proportional"):
        Rope.from_config({"rope_type": "mystery", "rope_theta": 10000.0}, 16, 64)
    lm = tiny_model("llama")
    lm.model.config.rope_parameters = {"rope_type": "mystery", "rope_theta": 10000.0}
    originals = [m for _, m in site_modules(lm.model, lm.spec)]
    with pytest.raises(RopeError, match="'mystery'"):
        with swap_attention(lm):
            pass
    with pytest.raises(RopeError, match="'mystery'"):
        verify(lm, cases=["sentence"])
    assert [m for _, m in site_modules(lm.model, lm.spec)] == originals
