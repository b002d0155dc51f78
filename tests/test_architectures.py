"""Per-architecture behaviour lives in one place: the spec table, sites and their windows."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import KINDS, family_of, tiny_config, tiny_model
from probe.architectures import (
    MODEL_KINDS,
    SPECS,
    get_spec,
    head_geometry,
    site_block,
    site_modules,
    site_outputs,
    site_spec,
    sites,
)
from probe.errors import UnsupportedArchitectureError
from probe.sites import Site, causal_keep, visible_keys


@pytest.mark.parametrize("kind", KINDS)
def test_every_spec_path_exists_and_fits_the_head_geometry(kind):
    lm = tiny_model(kind)
    spec, geo = lm.spec, lm.geometry
    mods = site_modules(lm.model, spec)
    outs = site_outputs(lm.model, spec)
    assert [site for site, _ in mods] == [site for site, _ in outs] == lm.sites
    for (site, attn), (_, o) in zip(mods, outs):
        paths = site_spec(spec, site)
        block = site_block(lm.model, spec, site)
        assert block.get_submodule(paths.attention) is attn and block.get_submodule(paths.o) is o
        for role in ("q", "k", "v", "qkv", "q_norm", "k_norm"):  # every path the site spec names exists
            if getattr(paths, role) is not None:
                block.get_submodule(getattr(paths, role))
        in_width = o.weight.shape[0] if spec.conv1d else o.weight.shape[1]
        assert in_width == geo.n_heads * geo.d_head  # the output projection's input: heads * d_head
        for name in spec.head_count_attrs:
            assert getattr(attn, name) == geo.n_heads, name
        for name in spec.width_attrs:
            assert getattr(attn, name) == geo.n_heads * geo.d_head, name
        if spec.kv_group_attr:
            assert getattr(attn, spec.kv_group_attr) == geo.n_heads // geo.n_kv_heads
    if spec.kind != "encoder-decoder":
        assert len(mods) == geo.n_layers


def test_every_spec_names_its_model_kind_and_its_site_kinds_fit_it():
    kinds = {t: spec.kind for t, spec in SPECS.items()}
    assert {t for t, k in kinds.items() if k == "encoder-decoder"} == {"bart", "marian", "t5"}
    assert {t for t, k in kinds.items() if k == "encoder"} == {"bert", "roberta", "electra", "distilbert", "deberta-v2",
                                                               "mpnet"}
    assert all(k in MODEL_KINDS for k in kinds.values()) and len(MODEL_KINDS) == 3
    for spec in SPECS.values():
        causal = {(s.stack, s.kind): s.causal for s in spec.site_specs}
        assert causal == {"encoder": {("encoder", "self"): False}, "decoder": {("decoder", "self"): True},
                          "encoder-decoder": {("encoder", "self"): False, ("decoder", "self"): True,
                                              ("decoder", "cross"): False}}[spec.kind], spec.family
    bert = SPECS["bert"]
    with pytest.raises(ValueError, match=r"bert \(decoder\) needs the site kinds \[\('decoder', 'self'\)\]"):
        replace(bert, kind="decoder")  # an encoder's sites under the decoder kind
    with pytest.raises(ValueError, match="kind must be one of"):
        replace(bert, kind="seq2seq")


@pytest.mark.parametrize("kind,expected", [
    ("gpt2", [0.25, 0.25]), ("gpt2-layer-scaled", [0.25, 0.125]), ("gpt2-unscaled", [1.0, 1.0]),
    ("gpt2-unscaled-layer-scaled", [1.0, 0.5]), ("llama", [0.25, 0.25]), ("gemma", [24 ** -0.5] * 2),
    ("gemma2", [20 ** -0.5] * 2), ("gemma3", [20 ** -0.5] * 2), ("bert", [0.25, 0.25]), ("gpt_neo", [1.0, 1.0]),
    ("mpnet", [0.25, 0.25]),
])
def test_scaling_rule_matches_the_models_own_attribute(kind, expected):
    lm = tiny_model(kind)
    spec, geo = lm.spec, lm.geometry
    got = [spec.scaling(lm.model.config, geo.d_head, i) for i in range(geo.n_layers)]
    assert got == pytest.approx(expected, rel=1e-12)
    own = [getattr(m, "scaling", None) for m in [m for _, m in site_modules(lm.model, spec)]]
    assert all(o is None or math.isclose(o, g, rel_tol=1e-9) for o, g in zip(own, got))


@pytest.mark.parametrize("kind,windows", [("mistral", [8, 8]), ("qwen2-window", [None, 4]), ("gemma2", [4, None]),
                                          ("gemma3", [4, None]), ("llama", [None, None]), ("phi3", [None, None])])
def test_windows_per_layer_match_the_model(kind, windows):
    lm = tiny_model(kind)
    assert [s.window for s in lm.sites] == windows
    for site, module in zip(lm.sites, [m for _, m in site_modules(lm.model, lm.spec)]):
        own = getattr(module, "sliding_window", getattr(lm.model.config, "sliding_window", None))
        assert own == site.window


def test_gpt_neo_windows_its_local_layers_as_its_own_mask_does():
    """GPT-Neo's global layer sees every earlier key; its local layer the window_size (4) latest, the
    query's own included: the rows of the model's own mask buffer (``bias``, [1, 1, max, max])."""
    import torch

    lm = tiny_model("gpt_neo")
    assert lm.model.config.attention_layers == ["global", "local"]
    assert [s.window for s in lm.sites] == [None, 4]
    for site, module in zip(lm.sites, [m for _, m in site_modules(lm.model, lm.spec)]):
        own = module.bias[0, 0, :10, :10]  # the model's keep-mask of the first 10 positions
        assert torch.equal(own, causal_keep(10, 10, window=site.window)), site.name


def test_sites_are_named_and_carry_causality():
    enc = sites(tiny_config("bert", 100))
    dec = sites(tiny_config("mistral", 100))
    assert [s.name for s in enc] == ["encoder.0.self", "encoder.1.self"] and not enc[0].causal
    assert [s.name for s in dec] == ["decoder.0.self", "decoder.1.self"] and dec[0].causal and dec[0].window == 8
    with pytest.raises(ValueError):
        Site("middle", 0)


def test_visible_keys_is_the_one_rule():
    import torch

    lengths = torch.tensor([5, 3])
    assert visible_keys(Site("encoder", 0), lengths, 5).tolist() == [[5] * 5, [3] * 5]
    assert visible_keys(Site("decoder", 0, causal=True), lengths, 5)[0].tolist() == [1, 2, 3, 4, 5]
    windowed = Site("decoder", 0, causal=True, window=2)
    assert visible_keys(windowed, lengths, 5)[0].tolist() == [1, 2, 2, 2, 2]
    keep = causal_keep(5, 5, window=2)
    assert keep.sum(-1).tolist() == visible_keys(windowed, lengths, 5)[0].tolist()


def test_every_supported_family_has_a_tiny_kind():
    families = {get_spec(tiny_config(k, 100)).family for k in KINDS}
    assert families >= {"bert", "roberta", "distilbert", "deberta-v2", "mpnet", "gpt2", "llama", "qwen2", "qwen3",
                        "mistral", "gpt_neox", "phi3", "gemma", "gemma2", "gemma3", "bloom", "falcon", "gpt_neo",
                        "bart", "t5"}  # Marian: the bart family
    assert set(SPECS) == {"bert", "roberta", "electra", "distilbert", "deberta-v2", "mpnet", "gpt2", "llama", "qwen2",
                          "qwen3", "mistral", "gpt_neox", "phi3", "gemma", "gemma2", "gemma3_text", "bloom", "falcon",
                          "gpt_neo", "bart", "marian", "t5"}
    assert {family_of(k) for k in KINDS} <= {
        "bert", "roberta", "electra", "distilbert", "deberta-v2", "mpnet", "gpt2", "llama", "qwen2", "qwen3", "mistral",
        "gpt_neox", "phi3", "gemma", "gemma2", "gemma3", "bloom", "falcon", "gpt_neo", "bart", "marian", "t5"}


def test_unsupported_type_names_the_supported_ones():
    class Config:
        model_type = "xlnet"

    with pytest.raises(UnsupportedArchitectureError, match="unsupported architecture 'xlnet'.*gpt_neox.*phi3.*t5"):
        get_spec(Config())


def test_head_geometry_reads_every_family():
    assert head_geometry(tiny_config("gemma", 100)).d_head == 24
    assert head_geometry(tiny_config("phi3", 100)).n_kv_heads == 2
    # Falcon: one shared key/value head (multi_query), num_kv_heads groups (new_decoder_architecture), else one each
    falcons = ("falcon", "falcon-new", "falcon-alibi")
    assert [head_geometry(tiny_config(k, 100)).n_kv_heads for k in falcons] == [1, 2, 4]
    assert head_geometry(tiny_config("distilbert", 100)).n_heads == 4


def test_behaviour_the_attention_branches_on_is_chosen_once_in_the_spec():
    import torch

    from probe.architectures import ALIBI, DISENTANGLED, FALCON_ALIBI, MPNET_RELATIVE, NO_POSITION_BIAS, T5_RELATIVE
    from probe.capture.reference import ReferenceAttention

    biases = {t: spec.position_bias for t, spec in SPECS.items()}
    assert biases["bloom"] is ALIBI and ALIBI.fused and biases["t5"] is T5_RELATIVE and not T5_RELATIVE.fused
    assert biases["deberta-v2"] is DISENTANGLED and biases["falcon"] is FALCON_ALIBI and FALCON_ALIBI.inner
    assert biases["mpnet"] is MPNET_RELATIVE and not MPNET_RELATIVE.fused
    assert {t for t, b in biases.items() if b is NO_POSITION_BIAS} == set(SPECS) - {"bloom", "t5", "deberta-v2",
                                                                                    "falcon", "mpnet"}
    y, p, b = torch.ones(1), torch.full((1, 2, 3, 4), 0.25), None
    assert SPECS["t5"].probs((y, b, p)) is p and SPECS["llama"].probs((y, p)) is p
    assert SPECS["llama"].probs((y,)) is None and SPECS["llama"].probs(y) is None
    assert SPECS["llama"].pack(y, p, b) == (y, p)
    packed = SPECS["t5"].pack(y, p, b)  # T5 hands the next layer its bias: zeros where none
    assert packed[0] is y and packed[2] is p and torch.equal(packed[1], torch.zeros(1, 2, 3, 4))
    assert torch.equal(SPECS["bloom"].residual(y, {"residual": y}), 2 * y) and SPECS["gpt2"].residual(y, {}) is y

    # a spec's rules are what the reference module calls: another rule changes its output
    lm = tiny_model("llama")
    layer, original = site_modules(lm.model, lm.spec)[0]
    x = torch.randn(2, 5, lm.geometry.d_model, generator=torch.Generator().manual_seed(0))
    plain = ReferenceAttention(original, lm.spec, lm.model.config, 0, site=layer)
    spec = replace(lm.spec, residual=lambda out, kw: out + 1.0, pack=lambda out, probs, bias: ("packed", out, probs))
    ruled = ReferenceAttention(original, spec, lm.model.config, 0, site=layer)
    with torch.no_grad():
        out, probs = plain(x)
        tag, out2, probs2 = ruled(x)
    assert tag == "packed" and torch.equal(out2, out + 1.0) and torch.equal(probs2, probs)


def test_falcon_with_alibi_says_what_its_maps_are():
    """Where the installed release's eager Falcon attention adds ALiBi twice (measured: transformers
    5.0-5.24), the loaded ALiBi model's notes say so; where it adds it once (5.25 on), nothing is said
    about twice. A rotary Falcon and other families have no such note."""
    from transformers import FalconConfig

    from probe.architectures.falcon import eager_alibi_count

    notes = {k: tiny_model(k).notes for k in ("falcon-alibi", "falcon", "bloom")}
    twice = [n for n in notes["falcon-alibi"] if "adds the ALiBi bias twice" in n]
    assert len(twice) == (eager_alibi_count(FalconConfig) == 2) == len(notes["falcon-alibi"])
    assert notes["falcon"] == [] and notes["bloom"] == []
