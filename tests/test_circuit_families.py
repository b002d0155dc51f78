"""Circuits, path patching and direct logit attribution on the research families whose blocks are not
GPT-2's or LLaMA's: norms after each sub-layer (Gemma 2 and 3, GLM-4; OLMo2 with no norm before its
sub-layers and a q/k norm over the whole projection), per-head q/k norms (Qwen3, Qwen3-MoE), MLA's
low-rank projections and shared rotary key (DeepSeek-V2/V3), a rotation computed inside the module
(GPT-J, CodeGen: ``rotary_dim``, adjacent pairs; CodeGen's fused projection interleaved by shard), queries
scaled inside it and ``project_in``/``project_out`` (OPT), a stacked projection
(Phi-3) and experts (Mixtral). On each tiny model: every head's recomputed q, k, v equal what the
attention received and the stream before the final norm is the sum of the writes (the check's pass),
the complete circuit is the clean run exactly and the empty one the corrupted run, EAP's edge scores
equal finite differences within 2% (in float64), path patching a last-layer head into the logits is its activation
patching, and DLA's terms add up to the logit difference. Post-LN models (BERT, XLM-R, OPT with
``do_layer_norm_before=False``) are refused by DLA, composition, circuits and path patching in one
line naming post-LN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_dla_composition import PAIRS, _identity
from test_edge_circuits import PAIRS_TSV, _OneInput, random_pairs

from conftest import bpe_tokenizer, invoke_cli, one_error, tiny_model
from probe.circuits.attribution import capture_writes, edge_scores, logit_diff
from probe.circuits.checked import graph_of
from probe.circuits.evaluate import Evaluator
from probe.circuits.forward import split_pass
from probe.circuits.paths import path_patch
from probe.effects.composition import composition_scores
from probe.effects.dla import direct_logit_attribution
from probe.effects.patching import head_logit_diffs
from probe.errors import UnsupportedAnalysisError

#: family -> (hand-written kind of conftest.tiny_model, or "generic:<type>"), whether its MLP reads the
#: same stream as its attention, and whether its layers are rerun (q, k, v by the module's own code)
FAMILIES = {
    "gemma2": ("gemma2", False, False), "gemma3": ("gemma3", False, False), "qwen3": ("qwen3", False, False),
    "phi3": ("phi3", False, False), "olmo2": ("generic:olmo2", False, True),
    "qwen3_moe": ("generic:qwen3_moe", False, True), "gptj": ("generic:gptj", True, True),
    "codegen": ("generic:codegen", True, True),
    "opt": ("generic:opt", False, True), "opt-proj": ("generic:opt-proj", False, True),
    "glm4": ("generic:glm4", False, False), "mixtral": ("generic:mixtral", False, False),
    "deepseek_v2": ("generic:deepseek_v2", False, True), "deepseek_v3": ("generic:deepseek_v3", False, True),
}


def family_model(family: str):
    from generic_models import generic_lm

    kind = FAMILIES[family][0]
    return generic_lm(kind.split(":")[1]) if kind.startswith("generic:") else tiny_model(kind)


@pytest.fixture(scope="module", params=list(FAMILIES))
def wired(request):
    lm = family_model(request.param)
    with graph_of(lm) as (wiring, graph, check):
        yield request.param, lm, wiring, graph, check


def test_the_check_pass_proves_the_recomputed_inputs_and_the_sum(wired):
    family, lm, wiring, graph, check = wired
    _, parallel, rerun = FAMILIES[family]
    assert graph.parallel == parallel
    assert [layer.rerun for layer in wiring.layers] == [rerun] * graph.layers
    assert {"q", "k", "v"} <= set(check.errors) and max(check.errors.values()) <= 1e-6
    assert check.decomposition <= 1e-5
    posts = {layer.attn_post is not None for layer in wiring.layers}
    assert posts == {family in ("gemma2", "gemma3", "glm4", "olmo2")}


def test_complete_circuit_is_the_clean_run_and_empty_the_corrupted(wired):
    _, lm, wiring, graph, _ = wired
    ev = Evaluator(lm, wiring, graph, random_pairs(4), batch_size=3)
    assert ev.metric(np.ones(graph.n_edges, dtype=bool)) == ev.ld_clean
    assert ev.metric(np.zeros(graph.n_edges, dtype=bool)) == pytest.approx(ev.ld_corrupted, abs=1e-5)
    assert ev.ld_clean != pytest.approx(ev.ld_corrupted, abs=1e-3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_eap_edge_scores_equal_finite_differences(family):
    # in float64 (float32's rounding moves a difference by up to 3% on the tiny MoE models; DeepSeek-V3's
    # router still computes in float32, hence a step of 1e-3, not smaller)
    lm = family_model(family)
    if hasattr(lm.model, "set_experts_implementation"):
        lm.model.set_experts_implementation("eager")  # grouped matrix products take no float64
    lm.model.double()
    with graph_of(lm) as (wiring, graph, _):
        enc = random_pairs(3)
        scores = edge_scores(lm, wiring, graph, enc, method="eap")
        writes = capture_writes(lm, wiring, graph, enc, slice(0, len(enc)))
        up, down = graph.edge_index
        clean = float(writes.ld_clean.mean())
        eps, checked = 1e-3, set()
        for e in np.argsort(-np.abs(scores)):  # the largest edge into each kind of input
            kind = graph.downstream[down[e]][0]
            if kind in checked or abs(scores[e]) < 0.02:
                continue
            checked.add(kind)
            feed = _OneInput(graph, graph.downstream[down[e]], eps * (writes.corrupted - writes.clean)[up[e]])
            with torch.no_grad():
                moved = float(logit_diff(split_pass(lm, wiring, enc.clean, enc.mask, feed), enc, slice(0, 4)).mean())
            assert (moved - clean) / eps == pytest.approx(scores[e], rel=0.02), kind
        assert len(checked) >= 3


def test_path_patching_a_last_layer_head_into_the_logits_is_its_activation_patching(wired):
    _, lm, wiring, graph, _ = wired
    enc = random_pairs(7)
    last = graph.layers - 1
    patched, base, _ = head_logit_diffs(lm, enc, [(last, h, "all") for h in range(graph.heads)], run="clean",
                                        donor="corrupted")
    for h in range(graph.heads):
        effect = path_patch(lm, wiring, graph, enc, [(last, h)], [("logits", graph.layers, 0)])
        assert effect == pytest.approx(patched[h] - base[h], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dla_terms_add_up_to_the_logit_difference(family):
    lm = family_model(family)
    frame = direct_logit_attribution(lm, PAIRS)
    _identity(frame)
    assert (frame["component"] == "head").sum() == lm.geometry.n_layers * lm.geometry.n_heads


@pytest.mark.parametrize("family", ["gemma2", "glm4", "olmo2", "gptj", "deepseek_v2"])
def test_bfloat16_models_of_the_new_families_fit_the_graph(family):
    # post-norms linearised and modules rerun in the model's dtype: the check within bfloat16's 8 eps (as
    # for LLaMA), the complete circuit the clean run exactly (a discovered norm's kind is read in float32)
    lm = family_model(family)
    lm.model.to(torch.bfloat16)
    with graph_of(lm) as (wiring, graph, check):
        assert check.decomposition <= 0.0625 and max(check.errors.values()) <= 0.0625
        enc = random_pairs(4)
        ev = Evaluator(lm, wiring, graph, enc, batch_size=3)
        assert ev.metric(np.ones(graph.n_edges, dtype=bool)) == ev.ld_clean
        assert ev.metric(np.zeros(graph.n_edges, dtype=bool)) == pytest.approx(ev.ld_corrupted, abs=0.1)
        assert np.isfinite(edge_scores(lm, wiring, graph, enc, method="eap")).all()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3"])
def test_rerunning_the_attention_module_gives_the_scores_of_the_recomputation_from_weights(kind):
    # the two ways of feeding a head its own stream agree where both apply (GPT-2's fused Conv1D, LLaMA's
    # grouped heads and rotation, Qwen3's per-head q/k norms): EAP-IG's scores within float32 rounding
    lm = tiny_model(kind)
    enc = random_pairs(1)
    with graph_of(lm) as (wiring, graph, _):
        weights = edge_scores(lm, wiring, graph, enc, method="eap-ig", steps=3)
        for layer in wiring.layers:
            layer.rerun = True
        rerun = edge_scores(lm, wiring, graph, enc, method="eap-ig", steps=3)
    assert np.abs(weights).max() > 0.1
    np.testing.assert_allclose(rerun, weights, rtol=1e-5, atol=1e-6 * np.abs(weights).max())


# -- post-LN --------------------------------------------------------------------------------------


POST_LN = ("bert", "generic:xlm-roberta", "generic:opt-postln")


def _post_ln_model(kind: str):
    from generic_models import generic_lm

    return generic_lm(kind.split(":")[1]) if kind.startswith("generic:") else tiny_model(kind)


@pytest.mark.parametrize("kind", POST_LN)
def test_post_ln_models_are_refused_by_every_stream_analysis_naming_post_ln(kind):
    lm = _post_ln_model(kind)
    for run in (lambda: direct_logit_attribution(lm, PAIRS), lambda: composition_scores(lm),
                lambda: graph_of(lm).__enter__()):
        with pytest.raises(UnsupportedAnalysisError, match="post-LN") as refused:
            run()
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("command", ["circuit", "path"])
def test_the_cli_refuses_a_post_ln_model_in_one_line_without_a_run_folder(command, tmp_path):
    from generic_models import generic_model

    tok = bpe_tokenizer()
    generic_model("opt-postln", tok).save_pretrained(tmp_path / "opt")
    tok.save_pretrained(tmp_path / "opt")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    extra = {"circuit": [], "path": ["--senders", "L0H0", "--receivers", "logits"]}[command]
    result = invoke_cli(command, "--model", tmp_path / "opt", "--pairs", tmp_path / "pairs.tsv", *extra,
                        "--out", tmp_path / "run")
    one_error(result, 1, "post-LN")
    assert not (tmp_path / "run").exists()


def test_probe_patch_notes_why_a_post_ln_model_gets_no_dla_or_composition():
    # patching a post-LN model is sound; its run says in one line each why DLA and composition are left out
    from probe.effects.patch_run import measure

    run = measure(_post_ln_model("generic:opt-postln"), PAIRS)
    assert run.dla is None and run.composition is None
    assert [n.split(":")[0] for n in run.notes if "post-LN" in n] == ["dla", "composition"]


def _gemma2_drawn():
    """A tiny Gemma 2 whose norm gains are drawn at random (a fresh model's are 1) and whose final
    logits are soft-capped (cap 5), as Gemma 2's are (cap 30)."""
    lm = tiny_model("gemma2")
    lm.model.config.final_logit_softcapping = 5.0  # read at each forward
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return lm


def test_gemma2_with_drawn_gains_and_a_soft_cap_fits_circuits_and_dla():
    # the post-norms' gains are part of each head's write; DLA's sum is the logit difference before the cap
    lm = _gemma2_drawn()
    _identity(direct_logit_attribution(lm, PAIRS))
    with graph_of(lm) as (wiring, graph, check):
        assert max(check.errors.values()) <= 1e-6 and check.decomposition <= 1e-5
        ev = Evaluator(lm, wiring, graph, random_pairs(4), batch_size=3)
        assert ev.metric(np.ones(graph.n_edges, dtype=bool)) == ev.ld_clean
        assert ev.metric(np.zeros(graph.n_edges, dtype=bool)) == pytest.approx(ev.ld_corrupted, abs=1e-5)


def test_gemma2_composition_folds_the_post_attention_norms_gain_into_w_o():
    lm = _gemma2_drawn()
    frame = composition_scores(lm)
    g = lm.geometry
    blocks = [lm.model.model.layers[i] for i in range(g.n_layers)]
    gain = lambda norm: torch.diag(1 + norm.weight.detach().double())  # noqa: E731 - Gemma stores gain - 1

    def dense(layer, head):
        block, kv = blocks[layer], head // (g.n_heads // g.n_kv_heads)
        attn, gamma = block.self_attn, gain(block.input_layernorm)
        rows = lambda w, i: w.weight.detach().double()[i * g.d_head:(i + 1) * g.d_head].T  # noqa: E731
        W_Q, W_K, W_V = gamma @ rows(attn.q_proj, head), gamma @ rows(attn.k_proj, kv), gamma @ rows(attn.v_proj, kv)
        W_O = attn.o_proj.weight.detach().double()[:, head * g.d_head:(head + 1) * g.d_head].T
        return W_Q @ W_K.T, W_V @ W_O @ gain(block.post_attention_layernorm)

    norm = torch.linalg.matrix_norm
    for h1, h2 in [(0, 1), (2, 3)]:
        _, OV1 = dense(0, h1)
        QK2, OV2 = dense(1, h2)
        row = frame[(frame.writer_layer == 0) & (frame.writer_head == h1) & (frame.reader_head == h2)].iloc[0]
        for mode, B in (("q", QK2), ("k", QK2.T), ("v", OV2)):
            assert row[mode] == pytest.approx(float(norm(OV1 @ B) / (norm(OV1) * norm(B))), rel=1e-9), mode


@pytest.mark.parametrize("kind", ["gemma2", "generic:gptj"])
def test_probe_circuit_runs_on_a_saved_model_of_a_new_family(kind, tmp_path):
    # the command end to end: a complete run folder, every edge scored, the 10 of largest |score| kept
    import json

    import pandas as pd
    from generic_models import generic_model

    from conftest import save_tiny
    from probe.circuits.graph import edge_count

    if kind.startswith("generic:"):
        tok = bpe_tokenizer()
        generic_model(kind.split(":")[1], tok).save_pretrained(tmp_path / "model")
        tok.save_pretrained(tmp_path / "model")
        model = tmp_path / "model"
    else:
        model = save_tiny(kind, tmp_path / "model")
    (tmp_path / "pairs.tsv").write_text(PAIRS_TSV, encoding="utf-8")
    result = invoke_cli("circuit", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--steps", 1, "--edges", 10,
                        "--seeds", 1, "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "run.json").read_text())["circuit"]
    parallel, kv = (True, 4) if kind == "generic:gptj" else (False, 2)
    edges = pd.read_csv(tmp_path / "run" / "edges.csv")
    assert record["edges"] == len(edges) == edge_count(2, 4, kv, parallel) and np.isfinite(edges["score"]).all()
    circuit = pd.read_csv(tmp_path / "run" / "circuit.csv")
    assert set(circuit["score"].abs().round(5)) == set(edges["score"].abs().nlargest(10).round(5))
