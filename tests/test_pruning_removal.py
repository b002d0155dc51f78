"""probe.pruning.removal and saving: heads really removed from the weights of every family; the
removed model equals the gated model; no module keeps the old head count after removal, and no head
number goes stale after save and reload (pruning again uses the original numbering); save and reload; a layer
with every head pruned; grouped key/value heads; analysis and verification of a pruned model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import FAMILIES, SEQ2SEQ, assert_statistics_close, hook_snapshot, tiny_model, tolerance
from probe.architectures import base_model, site_block, site_modules, site_outputs
from probe.capture.intervene import intervening
from probe.capture.maps import capture_attention, encode, forward
from probe.causal.gates import gated, ones
from probe.errors import InputError, UnsupportedAnalysisError
from probe.loading.models import from_pretrained_objects, load_model
from probe.loading.pruned import PRUNED_FILE
from probe.measures.stats import STATISTICS
from probe.pruning.experiment import copy_model
from probe.pruning.removal import parameter_count, remove_heads
from probe.pruning.saving import save_pruned
from probe.runs.analysis import analyze
from probe.verification import verify

TEXTS = ["The cat sat on the mat.", "A dog barked at the moon tonight, twice."]
#: Sliding-window models give NaN outputs in float64 in transformers itself (unpruned, ungated) on a
#: batch whose padded row is shorter than the longest by more than the window (Mistral's 8 tokens
#: here; Gemma 2/3's 4): float32 check only.
FLOAT64_NAN = ("gemma2", "gemma3", "mistral")
#: Layer 1 loses every head; layers 0, 2, 3 lose some (grouped key/value heads: partly pruned groups).
HEADS = {0: [1], 1: [0, 1, 2, 3], 2: [0, 3], 3: [2]}


def _out(lm, batch):
    """The model's output (logits, or the last hidden state of a bare encoder) at real positions."""
    out = forward(lm, batch)
    t = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return t[batch.real]


def _hidden(lm, batch):
    """The last hidden state (what a language-model head reads) at real positions."""
    inputs = batch.model_inputs()
    if lm.kind == "decoder":
        inputs["use_cache"] = False
    return base_model(lm.model)(**inputs).last_hidden_state[batch.real]


def _mask(lm, heads):
    m = ones(lm)
    for layer, hs in heads.items():
        m[layer, hs] = 0.0
    return m


@pytest.mark.parametrize("kind", ["bloom", "bart", "t5", "falcon", "falcon-new", "deberta-v2-unshared", "mpnet"])
def test_removal_refuses_alibi_and_encoder_decoder_models(kind):
    """BLOOM computes its ALiBi slopes from the head count (removing heads would change the others'
    slopes); encoder-decoder models are out of scope; Falcon's projections are fused per key/value
    group; DeBERTa with separate position projections would keep their heads; MPNet's one position bias of
    all heads serves every layer: one clear error, the model untouched."""
    if kind == "deberta-v2-unshared":  # its own pos_key_proj / pos_query_proj
        model, tok = tiny_model("deberta-v2", wrap=False)
        model.config.share_att_key = False
        lm = from_pretrained_objects(type(model)(model.config).eval(), tok)
    else:
        lm = tiny_model(kind)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    why = "ALiBi|encoder-decoder|key/value group|pos_key_proj|shared by every layer"
    with pytest.raises(UnsupportedAnalysisError, match=f"cannot remove heads: .*({why})"):
        remove_heads(lm, {0: [1]})
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())


@pytest.mark.parametrize("kind", [k for k in FAMILIES if k not in ("bloom", "falcon", "mpnet", *SEQ2SEQ)])
def test_removed_model_equals_gated_model_and_survives_save_and_reload(kind, tmp_path):
    """Removed == gated: the last hidden state within float32 atol 1e-5, and in float64 the outputs
    (logits, both under probe's attention function, where the gates act) within 1e-9, so what is
    left is float32 summation order (dropping zero columns changes the order of the output
    projection's sums), not a different computation."""
    lm = tiny_model(kind, layers=4)
    batch = encode(lm, TEXTS)
    before = hook_snapshot(lm.model)
    with torch.no_grad(), gated(lm, _mask(lm, HEADS)):
        gated_out, gated_hidden = _out(lm, batch), _hidden(lm, batch)
    assert hook_snapshot(lm.model) == before
    pruned = copy_model(lm)
    removal = remove_heads(pruned, HEADS)
    with torch.no_grad():
        removed_out = _out(pruned, batch)
        torch.testing.assert_close(_hidden(pruned, batch), gated_hidden, **tolerance("scaled"))
        plain = _out(lm, batch)
    assert (plain - gated_out).abs().max() > 1e-3  # the gates did something
    if kind not in FLOAT64_NAN:
        lm64, pruned64 = copy_model(lm), copy_model(pruned)
        lm64.model.double()
        pruned64.model.double()
        with torch.no_grad():
            with gated(lm64, _mask(lm, HEADS)):
                want = _out(lm64, batch)
            with intervening(pruned64):  # the attention function the gates run under (probe's)
                got = _out(pruned64, batch)
            torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    assert pruned.pruned.heads_per_layer() == [3, 0, 2, 3]
    assert removal.params_after == parameter_count(pruned.model) < removal.params_before == parameter_count(lm.model)
    # physical widths: query projection and output-projection input = slots x d_head
    d = lm.geometry.d_head
    for layer, o in enumerate([o for _, o in site_outputs(pruned.model, pruned.spec)]):
        slots = len(pruned.pruned.layouts[layer].q)
        width = o.weight.shape[0] if pruned.spec.conv1d else o.weight.shape[1]
        assert width == slots * d
    # the same under sdpa (against the gated model under sdpa: sdpa and eager differ by ~1e-5 themselves;
    # Gemma 2 has no sdpa path in transformers)
    if lm.model._supports_sdpa:
        for m in (lm, pruned):
            m.model.set_attn_implementation("sdpa")
        with torch.no_grad():
            with gated(lm, _mask(lm, HEADS)):
                gated_sdpa = _hidden(lm, batch)
            torch.testing.assert_close(_hidden(pruned, batch), gated_sdpa, **tolerance("scaled"))
        for m in (lm, pruned):
            m.model.set_attn_implementation("eager")
    # save, reload: identical outputs, same layouts, original config
    folder = save_pruned(pruned, tmp_path / "pruned")
    again = load_model(str(folder))
    assert again.pruned == pruned.pruned
    assert again.geometry == lm.geometry
    with torch.no_grad():
        assert torch.equal(_out(again, batch), removed_out)
    record = json.loads((folder / PRUNED_FILE).read_text())
    assert record["pruned_heads"] == {str(k): v for k, v in HEADS.items()}


def test_prune_4_of_12_heads_in_layer_0():
    """head count 8; q/k/v output width and output-projection input width 8 x d_head; the
    forward runs; that layer's attention probabilities are [batch, 8, T, T]."""
    lm = tiny_model("bert", heads=12, hidden=96)
    d = lm.geometry.d_head
    assert (lm.geometry.n_heads, d) == (12, 8)
    remove_heads(lm, {0: [0, 5, 6, 11]})
    attn = [m for _, m in site_modules(lm.model, lm.spec)][0]
    assert attn.num_attention_heads == 8 and attn.all_head_size == 8 * d
    for proj in (attn.query, attn.key, attn.value):
        assert proj.weight.shape == (8 * d, 96) and proj.bias.shape == (8 * d,) and proj.out_features == 8 * d
    o = [o for _, o in site_outputs(lm.model, lm.spec)][0]
    assert o.weight.shape == (96, 8 * d) and o.in_features == 8 * d
    captured = capture_attention(lm, TEXTS)
    T = captured.batch.input_ids.shape[1]
    assert captured[0].shape == (2, 8, T, T) and captured[1].shape == (2, 12, T, T)
    assert captured.outputs.last_hidden_state.isfinite().all()


def test_save_reload_and_prune_again_in_original_numbering(tmp_path):
    """tiny GPT-2 4 x 4: prune {0: [1], 1: [2, 3]}, save, reload -> heads [3, 2, 4, 4] and
    identical outputs; prune {1: [1]} in original numbering; an already-removed head is an error."""
    lm = tiny_model("gpt2", layers=4)
    remove_heads(lm, {0: [1], 1: [2, 3]})
    batch = encode(lm, TEXTS)
    with torch.no_grad():
        before = _out(lm, batch)
    again = load_model(str(save_pruned(lm, tmp_path / "p")))
    assert again.pruned.heads_per_layer() == [3, 2, 4, 4]
    assert [a.num_heads for a in [m for _, m in site_modules(again.model, again.spec)]] == [3, 2, 4, 4]
    with torch.no_grad():
        assert torch.equal(_out(again, batch), before)
    with pytest.raises(InputError, match=r"heads L1H2, L1H3 .*were already removed"):
        remove_heads(again, {1: [2, 3]})
    # original head 1 of layer 1 now sits in slot 1 (slots hold 0, 1); removing it must hit that head
    mask = _mask(again, {1: [1]})
    with torch.no_grad(), gated(again, mask):
        want = _hidden(again, batch)
    remove_heads(again, {1: [1]})
    assert again.pruned.heads_per_layer() == [3, 1, 4, 4]
    assert again.pruned.present(1) == (0,)
    with torch.no_grad():
        torch.testing.assert_close(_hidden(again, batch), want, **tolerance("scaled"))
    with pytest.raises(InputError, match=r"head L1H1 .*was already removed"):
        remove_heads(again, {1: [1]})


def test_grouped_key_value_heads_go_only_with_their_whole_group():
    lm = tiny_model("llama", layers=2)  # 4 query heads, 2 key/value heads: groups {0, 1}, {2, 3}
    d, dm = lm.geometry.d_head, lm.geometry.d_model
    removal = remove_heads(lm, {0: [2, 3], 1: [1]})
    attn0, attn1 = [m for _, m in site_modules(lm.model, lm.spec)]
    assert attn0.k_proj.weight.shape[0] == d  # group {2, 3} gone with its key/value head
    assert attn0.q_proj.weight.shape[0] == 2 * d and attn0.num_key_value_groups == 2
    # layer 1 keeps 0, 2, 3: both key/value heads stay; equal groups need one placeholder query slot
    assert lm.pruned.layouts[1].q == (0, None, 2, 3) and lm.pruned.layouts[1].kv == (0, 1)
    assert attn1.k_proj.weight.shape[0] == 2 * d
    assert torch.equal(attn1.o_proj.weight[:, d:2 * d], torch.zeros(dm, d))
    assert removal.kv_kept_params == 2 * d * dm  # one partly pruned group's key and value rows
    assert removal.layout_params == 2 * d * dm  # the placeholder's query rows and output columns
    assert any("partly pruned" in n for n in removal.notes)


def test_a_layer_with_every_head_pruned_passes_the_residual_through():
    lm = tiny_model("llama", layers=2)
    batch = encode(lm, TEXTS)
    remove_heads(lm, {0: [0, 1, 2, 3]})
    outputs = {}
    block = site_block(lm.model, lm.spec, lm.sites[0])
    block.self_attn.register_forward_hook(lambda m, a, out: outputs.setdefault("attn", out[0]))
    with torch.no_grad():
        out = _out(lm, batch)
    assert out.isfinite().all()
    assert outputs["attn"].eq(0).all()  # the attention block adds exactly nothing


@pytest.mark.parametrize("kind", ["bert", "llama", "phi3"])
def test_verify_passes_on_a_pruned_model(kind):
    lm = tiny_model(kind, layers=3)
    remove_heads(lm, {0: [1], 1: [0, 1, 2, 3], 2: [3]})
    result = verify(lm, cases=["sentence", "right-padded"])
    assert result.passed, result.max_abs_diff


def test_analysis_of_a_pruned_model_marks_removed_heads():
    lm = tiny_model("bert")
    full = analyze(lm, TEXTS)
    gates = ones(lm)
    gates[0, [1, 2]] = 0
    with gated(lm, gates):
        switched_off = analyze(lm, TEXTS)
    remove_heads(lm, {0: [1, 2]})
    res = analyze(lm, TEXTS)
    heads = res.heads.set_index(["layer", "head"])
    assert res.model["removed_heads"] == 2
    for h in (1, 2):
        assert heads.loc[(0, h), "label"] == "removed" and heads.loc[(0, h), "cluster"] == -1
        assert heads.loc[(0, h), ["self", "entropy", "max_weight"]].isna().all()
    # layer 0's other heads see the same input: their statistics equal the complete model's
    full_heads = full.heads.set_index(["layer", "head"])
    for h in (0, 3):
        assert_statistics_close(heads.loc[(0, h), list(STATISTICS)], full_heads.loc[(0, h), list(STATISTICS)])
    # layer 1 sees layer 0 without those heads: its statistics equal those with the heads gated to 0
    gated_heads = switched_off.heads.set_index(["layer", "head"])
    assert_statistics_close(heads.loc[1, list(STATISTICS)], gated_heads.loc[1, list(STATISTICS)])
    assert not np.allclose(heads.loc[1, "entropy"].to_numpy(), full_heads.loc[1, "entropy"].to_numpy(), atol=1e-6)


TREES = ("# text = The cat sat.\n1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_\n"
         "3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No\n4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_\n\n")


def _every_analysis(lm, tmp_path):
    """A run with every analysis probe has (statistics, distances and groups, pattern types, health,
    coreference, syntax, decoder circuits), written to a run folder."""
    from probe.linguistic import annotated_input
    from probe.patterns import circuit_probe, pattern_accumulators
    from probe.report import write_run

    tmp_path.mkdir()
    (tmp_path / "trees.conllu").write_text(TREES, encoding="utf-8")
    annotated = annotated_input("builtin", str(tmp_path / "trees.conllu"), 12)
    res = analyze(lm, annotated.texts, accumulators=pattern_accumulators(lm) + annotated.accumulators(lm),
                  finished=[circuit_probe(lm, sink_texts=annotated.texts)])
    return res, write_run(res, lm.tokenizer, tmp_path / "run")


def test_a_pruned_model_through_every_analysis(tmp_path):
    """Removed heads (NaN probabilities) get NaN, never a made-up number, from every analysis, and
    stay out of the head map and groups; the heads left in layer 0, whose probabilities removal does
    not change, get the complete model's values; the report's figure data are strict JSON."""
    import re

    full, _ = _every_analysis(tiny_model("llama"), tmp_path / "full")
    lm = tiny_model("llama")
    remove_heads(lm, {0: [1, 2], 1: [0, 1, 2, 3]})
    res, path = _every_analysis(lm, tmp_path / "pruned")
    heads, full_heads = res.heads.set_index(["layer", "head"]), full.heads.set_index(["layer", "head"])
    gone = [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    numeric = [c for c in heads.columns if heads[c].dtype.kind == "f"]
    assert {"coref_accuracy", "induction", "type_vertical"} <= set(numeric)
    assert heads.loc[gone, numeric].isna().all().all()
    assert (heads.loc[gone, "group"] == -1).all() and (heads.loc[gone, "pattern"] == "").all()
    kept = [(0, 0), (0, 3)]
    types = [c for c in numeric if c.startswith("type_")]
    columns = ["coref_accuracy", "induction", "duplicate", "prev_random", *types]
    np.testing.assert_allclose(heads.loc[kept, columns].to_numpy(float), full_heads.loc[kept, columns].to_numpy(float),
                               atol=1e-9)
    assert heads.loc[kept, "pattern"].tolist() == full_heads.loc[kept, "pattern"].tolist()
    layer0 = res.results["distances"].layer[0]
    assert layer0[0, 3] == pytest.approx(full.results["distances"].layer[0][0, 3], abs=1e-9)
    layer1 = res.results["distances"].layer[1]
    assert np.isnan(layer0[0, 1]) and np.isnan(layer1[~np.eye(4, dtype=bool)]).all()
    assert res.results["health"]["padding_max"] == 0.0  # the heads left attend no padding
    sinks = res.results["circuits"].sinks
    assert np.isfinite(sinks.loc[0, "without_bos"]) and np.isnan(sinks.loc[1, "without_bos"])
    coref = res.results["coreference"].table
    assert coref[(coref["kind"] == "head") & (coref["layer"] == 1)]["accuracy"].isna().all()
    syntax = res.results["syntax"].table
    assert syntax[(syntax["kind"] == "head") & (syntax["layer"] == 1)]["accuracy"].isna().all()
    html = (path / "index.html").read_text(encoding="utf-8")
    for data in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.S):
        json.loads(data, parse_constant=lambda name: pytest.fail(f"{name} in the report's data"))
    figures = json.loads(re.search(r'id="probe-data">(.*?)</script>', html, re.S).group(1))["figures"]
    assert len(figures["map-group"]["xs"]) == 2  # the two heads left


def test_prune_on_bloom_gates_heads_but_removes_none_and_says_why():
    """The experiment runs on gates (ALiBi is untouched); the physical copy is skipped with a note."""
    from probe.pruning import prune

    lm = tiny_model("bloom")
    texts = [f"Sentence number {i} is about a cat that sat on mat {i}." for i in range(12)]
    result = prune(lm, texts, steps=1, fraction=0.25, seeds=3, batch_size=4)
    assert result.pruned_params is None and result.speedup is None
    assert any("heads not physically removed" in n and "ALiBi" in n for n in result.notes)
    assert set(result.curves["order"]) == {"importance", "redundancy", "random"}
