"""Model types without a hand-written spec: discovered from one forward pass through probe's attention
function (probe/capture/discover.py), verified against their own eager function, analyzed; and the types whose
attention does not call the interface, refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from generic_models import ENCODER_TYPES, GENERIC, OWN_ATTENTION, generic_model

from conftest import (
    FAMILIES,
    OWN_ATTENTION_CANDIDATES,
    assert_statistics_close,
    invoke_cli,
    one_error,
    outside_interface,
    tiny_model,
    tolerance,
)
from probe.architectures import DISCOVERED, SPECS, get_spec, site_modules
from probe.capture import interface
from probe.capture.discover import discover
from probe.capture.maps import capture_attention
from probe.core import LoadedModel
from probe.errors import UnsupportedArchitectureError
from probe.runs.analysis import analyze
from probe.text.inputs import Text
from probe.verification import verify

TEXTS = ["The cat sat on the mat. It was warm.", "A dog ran to the park and back home again today."]


def texts_for(lm):
    return [Text(t, target=t[:18]) for t in TEXTS] if lm.kind == "encoder-decoder" else TEXTS


@pytest.mark.parametrize("model_type", GENERIC)
def test_generic_type_is_discovered_verified_and_analyzed(tiny_generic, model_type):
    lm = tiny_generic(model_type)
    assert lm.spec.discovered and get_spec(lm.model.config) is lm.spec and model_type not in SPECS
    assert lm.geometry.n_heads == 4 and lm.geometry.n_layers == 2
    result = verify(lm, cases=["right-padded"])
    assert result.passed, result.to_json()
    # probe's function and the model's own eager function do the same arithmetic: exactly equal
    assert all(r.attn_max_abs == 0.0 and r.hidden_max_abs == 0.0 for r in result.per_layer)
    assert next(c for c in result.cases if c.name == "right-padded").output_max_abs == 0.0
    heads = analyze(lm, texts_for(lm), batch_size=2).heads
    assert len(heads) == len(lm.sites) * 4
    assert np.isfinite(heads["entropy"].to_numpy(float)).all()
    assert not interface._EVERY and lm.model.config._attn_implementation == "eager"  # nothing left behind


def test_captured_maps_are_the_eager_modules_weights(tiny_generic):
    """Capture through the function equals the weights the eager modules return (output_attentions),
    real rows and keys; padded keys get exactly 0."""
    lm = tiny_generic("mixtral")
    captured = capture_attention(lm, TEXTS)
    real = captured.batch.real
    with torch.no_grad():
        out = lm.model(**captured.batch.model_inputs(), output_attentions=True, use_cache=False)
    for mine, theirs in zip(captured.probs, out.attentions):
        rows = real[:, None, :, None] & real[:, None, None, :]
        torch.testing.assert_close(mine[rows.expand_as(mine)], theirs[rows.expand_as(theirs)], atol=0, rtol=0)
        pad = ~real[:, None, None, :].expand_as(mine)
        assert bool((mine[pad] == 0).all())


def test_a_sink_whose_eager_function_renormalizes_is_compared_as_shares_of_the_keys(tiny_generic):
    """Granite-SWA's eager function returns the softmax over the keys alone and scales its output by the
    sink's share; probe's maps keep the sink's share (rows sum to less than 1, as gpt-oss's eager maps do).
    verify compares the two as shares of the keys and the sink's share through the outputs: it passes,
    and says so; the maps divided by their row sums are the eager function's weights."""
    from probe.verification.generic import SINK_NOTE

    lm = tiny_generic("granite_swa")
    assert [s.window for s in lm.sites] == [4, None]
    g = torch.Generator().manual_seed(0)
    for _, module in site_modules(lm.model, lm.spec):
        module.sinks.data = torch.randn(4, generator=g)  # the default (zeros) is one sink logit too
    result = verify(lm, cases=["right-padded"])
    assert result.passed and SINK_NOTE in result.notes, result.to_json()
    assert all(r.attn_max_abs <= 1e-6 and r.hidden_max_rel <= 1e-6 for r in result.per_layer)
    captured = capture_attention(lm, TEXTS)
    real = captured.batch.real
    with torch.no_grad():
        out = lm.model(**captured.batch.model_inputs(), output_attentions=True, use_cache=False)
    for mine, theirs in zip(captured.probs, out.attentions):
        rows = (real[:, None, :, None] & real[:, None, None, :]).expand_as(mine)
        sums = mine.sum(-1, keepdim=True)
        real_sums = sums[real[:, None, :, None].expand_as(sums)]
        assert float(real_sums.max()) <= 1 + 1e-6 and float(real_sums.min()) < 0.5  # the sink takes a share
        torch.testing.assert_close((mine / sums.clamp_min(1e-30))[rows], theirs[rows], **tolerance("probability"))
    assert SINK_NOTE not in verify(tiny_generic("gpt_oss"), cases=["sentence"]).notes  # keeps the share itself


def test_discovered_paths_heads_and_windows(tiny_generic):
    opt = tiny_generic("opt").spec
    (s,) = opt.site_specs
    assert (s.layers, s.attention, s.o, s.q, s.k, s.v) == ("decoder.layers", "self_attn", "self_attn.out_proj",
                                                            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    assert opt.missing == () and opt.kind == "decoder"
    assert [site.window for site in tiny_generic("starcoder2").sites] == [4, 4]
    assert [site.window for site in tiny_generic("gpt_oss").sites] == [4, None]  # sliding, then full
    mixtral = tiny_generic("mixtral")
    assert (mixtral.geometry.n_heads, mixtral.geometry.n_kv_heads) == (4, 2)
    modern = tiny_generic("modernbert")
    assert modern.spec.qkv_layout == "stacked" and modern.spec.site_specs[0].qkv == "attn.Wqkv"
    assert modern.kind == "encoder" and not any(site.causal for site in modern.sites)
    # its local layers' bidirectional window (local_attention 64: 32 keys each side) is in their sites
    assert [(site.window, site.ahead) for site in modern.sites] == [(None, 0), (65, 32)]


def test_t5_family_layers_are_the_blocks_not_each_blocks_sub_layers(tiny_generic):
    lm = tiny_generic("mt5")
    assert lm.kind == "encoder-decoder"
    paths = {(s.stack, s.kind): (s.layers, s.attention) for s in lm.spec.site_specs}
    assert paths == {("encoder", "self"): ("encoder.block", "layer.0.SelfAttention"),
                     ("decoder", "self"): ("decoder.block", "layer.0.SelfAttention"),
                     ("decoder", "cross"): ("decoder.block", "layer.1.EncDecAttention")}
    assert [(s.stack, s.layer, s.kind, s.causal) for s in lm.sites] == [
        ("encoder", 0, "self", False), ("encoder", 1, "self", False), ("decoder", 0, "self", True),
        ("decoder", 0, "cross", False), ("decoder", 1, "self", True), ("decoder", 1, "cross", False)]


def test_a_layer_shared_by_every_site_serves_each_in_turn(tiny_generic):
    """ALBERT runs one layer module num_hidden_layers times: two sites, one module, different maps."""
    lm = tiny_generic("albert")
    assert len(lm.sites) == 2 and len(set(lm.spec.site_paths)) == 1
    captured = capture_attention(lm, TEXTS)
    assert not torch.equal(captured.probs[0], captured.probs[1])
    with torch.no_grad():
        out = lm.model(**captured.batch.model_inputs(), output_attentions=True)
    real = captured.batch.real
    for mine, theirs in zip(captured.probs, out.attentions):
        rows = (real[:, None, :, None] & real[:, None, None, :]).expand_as(mine)
        torch.testing.assert_close(mine[rows], theirs[rows], atol=0, rtol=0)


def test_without_an_output_projection_analyze_and_verify_run_and_the_head_output_analyses_refuse(tmp_path):
    """Differential attention (DiffLlama) combines two maps per head before any linear map reads
    [batch, T, heads x d_head]: no output projection is found. verify and analyze still run (the
    value-weighted columns left out, a note says why); labels by norm, ablation and patching refuse in one
    line each, before any work."""
    from generic_models import generic_lm

    from conftest import bpe_tokenizer

    lm = generic_lm("diffllama")
    assert "o" in lm.spec.missing  # (its value projection is not found either)
    assert verify(lm, cases=["sentence"]).passed
    result = analyze(lm, TEXTS)
    plain = analyze(lm, TEXTS, value_weighted=False)
    assert not any(c.endswith("_by_norm") or c == "norm_mass" for c in result.heads)
    assert_statistics_close(result.heads, plain.heads)  # the attention statistics as without the columns
    assert result.settings["value_weighted"] is False
    assert sum("value-weighted statistics (the _by_norm columns, norm_mass) left out" in n for n in result.notes) == 1
    with pytest.raises(UnsupportedArchitectureError, match="labels by norm .* needs the o projection"):
        analyze(lm, TEXTS, labels_by="norm")
    tok = bpe_tokenizer()
    generic_model("diffllama", tok).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("clean\tcorrupted\tanswer\twrong\n"
                     "The cat and the dog ran to\tThe dog and the cat ran to\t the\t a\n")
    one_error(invoke_cli("effects", "--model", tmp_path / "m", "-n", "4", "--out", tmp_path / "e"), 1,
              "ablation", "o projection weights of diffllama")
    one_error(invoke_cli("patch", "--model", tmp_path / "m", "--pairs", pairs, "--out", tmp_path / "p"), 1,
              "patching", "o projection weights of diffllama")
    assert not (tmp_path / "e").exists() and not (tmp_path / "p").exists()


def test_roberta_numbering_is_found():
    """XLM-RoBERTa numbers positions from padding_idx + 1: its limit is the table's rows minus that."""
    lm_type = "xlm-roberta"
    from generic_models import generic_lm
    lm = generic_lm(lm_type)
    assert lm.spec.position_offset(lm.model.config) == 1  # pad id 0
    assert lm.max_length == lm.model.config.max_position_embeddings - 1


def test_projections_not_found_refuse_the_analyses_that_need_them(tiny_generic):
    """DeepSeek-V3's multi-head latent attention has no per-head q/k/v projection; capture, statistics
    and verification work, composition reads its matrices from the modules (tests/test_composition_modules.py)
    and says so; a model whose output projection was not found (DiffLlama) is refused composition in one line."""
    from probe.effects.composition import composition_scores

    lm = tiny_generic("deepseek_v3")
    assert set(lm.spec.missing) == {"q", "k", "v"} and lm.geometry.d_head == 12  # value heads: v_head_dim
    assert "read from its attention modules" in composition_scores(lm).attrs["notes"][0]
    with pytest.raises(UnsupportedArchitectureError, match="composition .* o projection weights of diffllama"):
        composition_scores(tiny_generic("diffllama"))
    heads = analyze(lm, TEXTS).heads
    assert "norm_mass" in heads  # value-weighted statistics: values from the function, o found


def test_row_blocks_equal_whole_maps(tiny_generic):
    for model_type in ("opt", "gpt_oss", "mt5", "albert"):
        lm = tiny_generic(model_type)
        dense = analyze(lm, texts_for(lm), batch_size=2, query_block=0)
        blocked = analyze(lm, texts_for(lm), batch_size=2, query_block=3)
        cols = [c for c in dense.heads.select_dtypes("number").columns if c != "cluster"]
        for c in cols:
            np.testing.assert_allclose(blocked.heads[c].to_numpy(float), dense.heads[c].to_numpy(float),
                                       atol=1e-5, rtol=1e-6, err_msg=f"{model_type} {c}")


#: Hand families whose modules compute attention themselves in the installed release (measured: Falcon did
#: until transformers 5.24, BLOOM, DeBERTa-v2, GPT-Neo and MPNet still do in 5.25).
OWN_ATTENTION_HAND = outside_interface(tuple(k for k in FAMILIES if k in OWN_ATTENTION_CANDIDATES))


@pytest.mark.parametrize("kind", [k for k in FAMILIES if k not in OWN_ATTENTION_HAND])
def test_hand_families_discovered_give_the_eager_paths_statistics(kind):
    """A hand family's modules called through probe's function (a spec discovered for it; the families that
    compute their own attention in the installed release are left out) give the statistics of the eager
    path the hand spec measures: the function is one capture point for both."""
    lm = tiny_model(kind)
    try:
        spec = discover(lm.model, lm.tokenizer)
    finally:
        DISCOVERED.pop(lm.model_type, None)
    assert [(s.stack, s.layer, s.kind, s.causal, s.window) for s in spec.fixed_sites] == \
        [(s.stack, s.layer, s.kind, s.causal, s.window) for s in lm.sites]
    generic = LoadedModel(lm.model, lm.tokenizer, spec, lm.geometry, lm.name, lm.source, lm.max_length)
    texts = [Text(t, target=t[:18]) for t in TEXTS] if lm.kind == "encoder-decoder" else TEXTS
    assert_statistics_close(analyze(generic, texts).heads, analyze(lm, texts).heads, err_msg=kind)


def _tie_queries_and_keys(model) -> None:
    """Give every layer's key projection its query projection's weights (one parameter, two modules)."""
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            module.k_proj.weight = module.q_proj.weight


def test_query_and_key_projections_holding_the_same_weights_are_told_apart():
    """Two projections of equal weights give equal outputs, which discovery compared alone: it named the
    query projection for the keys too (a LLaMA), or refused the model. Nudging each one's output in one
    more pass tells them apart by what they feed: the spec names q_proj and k_proj, and the discovered
    model measures what the hand spec measures."""
    import transformers as tr
    from generic_models import generic_config

    from conftest import bpe_tokenizer
    from probe.loading.models import from_pretrained_objects

    lm = tiny_model("llama", kv_heads=4)
    _tie_queries_and_keys(lm.model)
    try:
        spec = discover(lm.model, lm.tokenizer)
    finally:
        DISCOVERED.pop(lm.model_type, None)
    assert [(s.q, s.k, s.v) for s in spec.site_specs] == [("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")]
    generic = LoadedModel(lm.model, lm.tokenizer, spec, lm.geometry, lm.name, lm.source, lm.max_length)
    assert_statistics_close(analyze(generic, TEXTS).heads, analyze(lm, TEXTS).heads)
    tok = bpe_tokenizer()  # a type without a hand-written spec, discovered as it loads
    config = generic_config("olmo", len(tok))
    config.num_key_value_heads = config.num_attention_heads
    torch.manual_seed(0)
    model = tr.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    _tie_queries_and_keys(model)
    try:
        olmo = from_pretrained_objects(model, tok, name="tiny-olmo-tied")
        assert [(s.q, s.k) for s in olmo.spec.site_specs] == [("self_attn.q_proj", "self_attn.k_proj")]
        result = verify(olmo, cases=["right-padded"])
        assert result.passed, result.to_json()
    finally:
        DISCOVERED.pop("olmo", None)


@pytest.mark.parametrize("kind", OWN_ATTENTION_HAND)
def test_hand_families_that_compute_their_own_attention_cannot_be_discovered(kind):
    """The hand families left out above never call the interface: discovery says so, so their hand
    specs (which :func:`get_spec` reads first) are the only way in."""
    lm = tiny_model(kind)
    try:
        with pytest.raises(UnsupportedArchitectureError, match="never called transformers' AttentionInterface"):
            discover(lm.model, lm.tokenizer)
    finally:
        DISCOVERED.pop(lm.model_type, None)
    assert get_spec(lm.model.config) is SPECS[lm.model_type] and not lm.spec.discovered


@pytest.mark.parametrize("model_type", OWN_ATTENTION)
def test_a_type_whose_attention_does_not_call_the_interface_is_captured_only(tmp_path, model_type):
    """A type whose attention is its own code is analysed from the maps its eager path returns (a run folder),
    and probe verify refuses it in one line naming it."""
    from conftest import bert_tokenizer, bpe_tokenizer

    tok = bert_tokenizer() if model_type in ENCODER_TYPES else bpe_tokenizer()
    generic_model(model_type, tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    result = invoke_cli("analyze", "--model", tmp_path, "--text", "Hi there, a short text.", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "heads.csv").exists()
    one_error(invoke_cli("verify", "--model", tmp_path), 1, "probe verify does not run on", repr(model_type)[1:-1],
              "its attention is its own code")


def test_discovering_a_model_that_keeps_its_own_attention_says_so():
    from conftest import bpe_tokenizer

    tok = bpe_tokenizer()
    with pytest.raises(UnsupportedArchitectureError, match="never called transformers' AttentionInterface"):
        discover(generic_model("gpt_neox_japanese", tok), tok)


def test_mutants_and_removal_need_a_hand_spec(tiny_generic):
    from probe.errors import ProbeError
    from probe.pruning.removal import removal_unsupported

    lm = tiny_generic("olmo")
    with pytest.raises(ProbeError, match="hand-written spec"):
        verify(lm, mutant="no-scale")
    assert "hand-written spec" in removal_unsupported(lm)


def test_cli_analyze_and_verify_a_saved_generic_model(tmp_path):
    import pandas as pd

    from conftest import bpe_tokenizer

    tok = bpe_tokenizer()
    folder = tmp_path / "tiny-olmo"
    generic_model("olmo", tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    result = invoke_cli("verify", "--model", folder, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout and "right-padded (sdpa)" in result.stdout and "output (logits)" in result.stdout
    lines = result.stdout.splitlines()
    cases = lines[lines.index("cases:") + 1:]
    cases = [ln for ln in cases if ln.startswith("  ") and "max abs" in ln]
    assert len(cases) > 3 and len({ln.index("max abs") for ln in cases}) == 1, cases  # the (sdpa) rows aligned too
    result = invoke_cli("analyze", "--model", folder, "--text", "The cat sat on the mat.", "--text",
                        "A dog ran home.", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    heads = pd.read_csv(tmp_path / "run" / "heads.csv")
    assert len(heads) == 8 and set(heads["layer"]) == {0, 1}
    one_error(invoke_cli("verify", "--model", folder, "--mutant", "no-scale", "--no-progress"), 1,
              "hand-written spec")


def test_generic_verify_chooses_cases_as_the_hand_specs_do(tiny_generic):
    """One case selection for both batteries (verification.battery.select_cases): a name, a list, an
    unknown name and an empty list behave alike."""
    from probe.errors import ProbeError
    from probe.verification import verify

    lm = tiny_generic("opt")
    # the sentence case, against eager and against sdpa
    assert [c.name for c in verify(lm, cases="sentence").cases] == ["sentence", "sentence (sdpa)"]
    with pytest.raises(ProbeError, match="unknown case"):
        verify(lm, cases=["sentence-pair"])  # encoders only
    with pytest.raises(ProbeError, match="no verification case"):
        verify(lm, cases=[])
