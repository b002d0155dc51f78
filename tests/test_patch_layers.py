"""probe.effects.patch_layers: patched passes that re-enter the unpatched run at the patched layer give the
whole passes' numbers bit for bit (tiny LLaMA, GPT-2, GPT-NeoX and more families, discovered types, a masked-LM
encoder, SmolLM2's first pair; passes of one layer and passes spanning layers; every component: q, k, v,
pattern, resid, mlp), compute only the blocks from the patched layer on (counted by the blocks' MLP calls),
fall back to whole passes where the model cannot be re-entered (T5, BART, ALBERT's shared block, a re-entered
run that differs), and the estimate line's numbers come from the passes it timed (a fake clock)."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import torch
from generic_models import generic_lm
from test_patching_encdec import MLM_PAIRS, T5_PAIRS, tiny_mlm

import probe.effects.patch_full as patch_full
import probe.effects.patch_layers as patch_layers
from conftest import tiny_model
from probe.architectures import site_block
from probe.effects.pairs import builtin_pairs, encode_pairs
from probe.effects.patch_full import full_head_logit_diffs
from probe.effects.patch_layers import PatchForecast, layer_head_logit_diffs, reentry_refusal
from probe.effects.patching import Pair, patch_heads

PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
         Pair("When Mary and John went to the store, John gave a drink to",
              "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")]


def _jobs(lm):
    return [(i, h, w) for i in range(len(lm.sites)) for w in ("all", "last") for h in range(lm.geometry.n_heads)]


def _both(lm, pairs, heads_per_pass, run="corrupted", donor="clean"):
    """(whole passes' result, re-entered result, info)."""
    enc = encode_pairs(lm, pairs)
    jobs = _jobs(lm)
    whole = full_head_logit_diffs(lm, enc, jobs, run=run, donor=donor, heads_per_pass=heads_per_pass)
    info: dict = {}
    layered = layer_head_logit_diffs(lm, enc, jobs, run=run, donor=donor, heads_per_pass=heads_per_pass, info=info)
    return whole, layered, info


def _assert_equal(whole, layered):
    assert np.array_equal(whole[0], layered[0]) and np.array_equal(whole[1], layered[1])
    assert whole[2] == layered[2]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gpt_neox", "bloom", "gemma2", "gemma3", "falcon", "gpt_neo",
                                  "qwen2-window", "phi3", "mistral"])
def test_reentered_passes_equal_whole_passes_bit_for_bit(kind):
    """4 layers; passes of one layer's jobs (2 x heads) and passes of 3 jobs spanning layers, both directions."""
    lm = tiny_model(kind, layers=4)
    H = lm.geometry.n_heads
    for k, (run, donor) in ((2 * H, ("corrupted", "clean")), (3, ("clean", "corrupted"))):
        whole, layered, info = _both(lm, PAIRS, k, run, donor)
        assert info["reentered"], info["why"]
        _assert_equal(whole, layered)
    assert info["starts"] == [min(j[0] for j in _jobs(lm)[s:s + 3]) for s in range(0, len(_jobs(lm)), 3)]


@pytest.mark.parametrize("model_type", ["opt", "mixtral", "olmo2", "starcoder2", "deepseek_v3", "gpt_oss"])
def test_discovered_types_are_reentered_with_the_same_numbers(model_type):
    lm = generic_lm(model_type)
    whole, layered, info = _both(lm, PAIRS, 5)
    assert info["reentered"], info["why"]
    _assert_equal(whole, layered)


def test_a_masked_lm_encoder_is_reentered_with_the_same_numbers():
    whole, layered, info = _both(tiny_mlm(), MLM_PAIRS, 8)
    assert info["reentered"], info["why"]
    _assert_equal(whole, layered)


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_encoder_decoder_models_run_whole_passes(kind):
    lm = tiny_model(kind)
    assert "encoder-decoder" in reentry_refusal(lm)
    whole, layered, info = _both(lm, T5_PAIRS, 8)
    assert not info["reentered"] and "encoder-decoder" in info["why"] and set(info["starts"]) == {0}
    _assert_equal(whole, layered)


def test_shared_blocks_run_whole_passes():
    lm = generic_lm("albert", masked_lm=True)
    assert reentry_refusal(lm) == "its blocks are shared between layers"


def test_a_reentered_run_that_differs_falls_back_to_whole_passes(monkeypatch):
    """A block reading state its recorded output does not carry is simulated by answering a perturbed
    output: the check (the unpatched run re-entered at its last block) sees it, the run takes whole passes."""
    lm = tiny_model("llama", layers=3)
    unpack = patch_layers._unpack
    monkeypatch.setattr(patch_layers, "_unpack", lambda value, k: unpack(value, k) * 1.001)
    whole, layered, info = _both(lm, PAIRS, 8)
    assert not info["reentered"] and "differs" in info["why"]
    _assert_equal(whole, layered)


def test_only_the_blocks_from_the_patched_layer_on_compute():
    """Each block's MLP counts its calls: the unpatched and donor runs (whole), the check (the last block),
    then one pass per layer (2 x heads jobs a pass) computing blocks L..end."""
    lm = tiny_model("llama", layers=4)
    calls = [0] * 4
    handles = [site_block(lm.model, lm.spec, s).mlp.register_forward_hook(
        lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1)) for i, s in enumerate(lm.sites)]
    try:
        enc = encode_pairs(lm, PAIRS)
        layer_head_logit_diffs(lm, enc, _jobs(lm), heads_per_pass=2 * lm.geometry.n_heads)
    finally:
        for h in handles:
            h.remove()
    assert calls == [2 + 1, 2 + 2, 2 + 3, 2 + 1 + 4]


def test_patch_heads_frame_is_unchanged_by_reentry(monkeypatch):
    lm = tiny_model("gpt2", layers=3)
    new = patch_heads(lm, PAIRS)
    monkeypatch.setattr("probe.effects.patching.head_logit_diffs",
                        lambda *a, estimate=None, **kw: full_head_logit_diffs(*a, **kw))
    old = patch_heads(lm, PAIRS)
    assert new.equals(old) and new.attrs == old.attrs


def test_the_estimate_line_comes_from_the_timed_passes():
    """Fake clock: the whole pass takes 10 s and the pass from the last block 3.7 s (4 blocks): a block
    (10 - 3.7) / 3 = 2.1 s, a pass 1.6 s besides; passes from blocks 0..3 cost 4 x 1.6 + 2.1 x (4+3+2+1) = 27.4 s."""
    ticks = itertools.count()
    times = {0: 0.0}
    f = PatchForecast(clock=lambda: times.get(next(ticks), 40.0))
    line, left = f.line(10.0, 3.7, 4, [0, 1, 2, 3])
    assert left == pytest.approx(4 * 1.6 + 2.1 * 10)
    assert line == ("estimate from the first passes (40.0 s; 2.10 s a block, 1.60 s a pass besides): about 27 s for "
                    "4 patched passes (2.5 whole passes' blocks) on this machine as loaded now")
    line, left = PatchForecast(clock=lambda: 0.0).line(10.0, None, 4, [0, 1, 2, 3])
    assert left == pytest.approx(40.0) and "10.00 s a whole pass" in line and "4.0 whole passes' blocks" in line


def test_the_estimate_is_said_once_with_the_measured_passes():
    """The run's clock is read at the forecast's start, around the whole unpatched pass (10 s) and around the
    check from the last block (3.7 s), then for the elapsed time: the line's costs are those passes'."""
    lm = tiny_model("llama", layers=4)
    enc = encode_pairs(lm, PAIRS)
    reads = iter([0.0, 100.0, 110.0, 131.0, 134.7, 140.0])
    lines = []
    layer_head_logit_diffs(lm, enc, _jobs(lm), heads_per_pass=8, estimate=lines.append, clock=lambda: next(reads))
    assert lines == ["estimate from the first passes (140.0 s; 2.10 s a block, 1.60 s a pass besides): about 27 s "
                     "for 4 patched passes (2.5 whole passes' blocks) on this machine as loaded now"]


def test_smollm2_first_pair_is_reentered_with_the_same_numbers(smollm2):
    """The embedded decoder (30 layers, 9 heads), the first built-in pair: whole passes and re-entered passes
    agree bit for bit (slow: about 35 whole passes' work of 18 rows)."""
    whole, layered, info = _both(smollm2, builtin_pairs()[:1], 2 * smollm2.geometry.n_heads)
    assert info["reentered"], info["why"]
    assert info["starts"] == list(range(30))
    _assert_equal(whole, layered)


def _spy(starts: list, own):
    """``reentering`` noting (re-entered, start) of each pass."""
    def spy(lm, recorded, start):
        starts.append((recorded is not None, start))
        return own(lm, recorded, start)
    return spy


@pytest.mark.parametrize("kind", ["llama", "gpt2", "gpt_neox"])
def test_components_reentered_equal_whole_passes_bit_for_bit(kind, monkeypatch):
    """Every component (q, k, v, pattern, the residual stream, the MLP's output), 3 jobs a pass (spanning
    layers): re-entered passes against whole passes (re-entry refused by a stand-in refusal)."""
    import probe.effects.components as components

    lm = tiny_model(kind, layers=4)
    enc = encode_pairs(lm, PAIRS)
    for name in ("q", "k", "v", "pattern", "resid", "mlp"):
        U = components.units(lm, name)[0]
        jobs = [(i, u, w) for i in range(len(lm.sites)) for w in ("all", "last") for u in range(U)]
        starts: list = []
        with monkeypatch.context() as m:
            m.setattr(components, "reentering", _spy(starts, components.reentering))
            layered = components.component_logit_diffs(lm, enc, name, jobs, run="corrupted", donor="clean", per_pass=3)
        assert starts == [(True, min(j[0] for j in jobs[s:s + 3])) for s in range(0, len(jobs), 3)], name
        with monkeypatch.context() as m:
            m.setattr(components, "reentry_refusal", lambda lm: "whole passes")
            m.setattr(components, "reentering", lambda lm, recorded, start: contextlib.nullcontext(
                None if recorded is None else pytest.fail("re-entered")))
            whole = components.component_logit_diffs(lm, enc, name, jobs, run="corrupted", donor="clean", per_pass=3)
        _assert_equal(whole, layered)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma2", "mlm", "t5"])
def test_logits_at_the_metric_positions_only_are_the_full_logits_rows(kind, monkeypatch):
    """A patched pass gives its LM head the metric position's hidden state only ([B, 1, d]): the logits there
    equal those the head computes over every position to float32's rounding (the product of one row by the
    head, in a matrix product of another height: here bit for bit at 2 copies, 1 ulp at 1 and 3; on
    SmolLM2's 20 built-in pairs bit for bit at 1 and 18 copies, measured), for decoders, a masked-LM
    encoder's mask position and an encoder-decoder's last target position; patch_heads' effects the same
    to 1e-5."""
    lm, pairs = {"mlm": (tiny_mlm, MLM_PAIRS), "t5": (lambda: tiny_model("t5"), T5_PAIRS)}.get(
        kind, (lambda: tiny_model(kind, layers=3), PAIRS))
    lm = lm()
    enc = encode_pairs(lm, pairs)
    inputs = patch_full.model_inputs(lm, enc, enc.corrupted, 2)
    shapes = []
    handle = lm.model.get_output_embeddings().register_forward_hook(lambda m, a, o: shapes.append(tuple(o.shape)))
    try:
        picked = patch_full.full_pass(lm, enc, inputs, 2)[0]
        monkeypatch.setattr(patch_full, "METRIC_ROWS_ONLY", False)
        every = patch_full.full_pass(lm, enc, inputs, 2)[0]
    finally:
        handle.remove()
    B, T = inputs["input_ids"].shape if enc.target is None else inputs["decoder_input_ids"].shape
    assert shapes[0][:2] == (B, 1) and shapes[1][:2] == (B, T)  # the head ran on one position, then on all
    assert torch.equal(picked, every) and picked.shape == (B, lm.model.get_output_embeddings().out_features)
    plain = patch_heads(lm, pairs)
    monkeypatch.setattr(patch_full, "METRIC_ROWS_ONLY", True)
    new = patch_heads(lm, pairs)
    for column in ("effect", "effect_last", "raw", "raw_last"):
        np.testing.assert_allclose(new[column], plain[column], rtol=0, atol=1e-5)
    # one copy of the pairs: the rows of a product of another height, equal to float32's rounding
    one = patch_full.model_inputs(lm, enc, enc.clean, 1)
    rows = patch_full.full_pass(lm, enc, one, 1)[0]
    monkeypatch.setattr(patch_full, "METRIC_ROWS_ONLY", False)
    torch.testing.assert_close(rows, patch_full.full_pass(lm, enc, one, 1)[0], rtol=1e-6, atol=5e-6)


def test_a_head_not_called_as_a_module_gets_every_position_and_the_same_rows(monkeypatch):
    """A model whose output embedding is never called as a module (here: no get_output_embeddings): the
    pass computes every position's logits and takes the metric rows from them."""
    lm = tiny_model("gpt2", layers=2)
    enc = encode_pairs(lm, PAIRS)
    inputs = patch_full.model_inputs(lm, enc, enc.clean, 1)
    monkeypatch.setattr(patch_full, "METRIC_ROWS_ONLY", False)
    want = patch_full.full_pass(lm, enc, inputs, 1)[0]
    monkeypatch.setattr(patch_full, "METRIC_ROWS_ONLY", True)
    monkeypatch.setattr(type(lm.model), "get_output_embeddings", lambda self: None)
    with patch_full.metric_logits(lm, enc.last) as state:
        pass
    assert state == {"picked": False}
    assert torch.equal(patch_full.full_pass(lm, enc, inputs, 1)[0], want)
