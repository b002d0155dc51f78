"""Activation and attribution patching of every component (probe patch --component): z as patch_heads,
0 for a patch with the run's own value and for clean = corrupted, attribution = a finite difference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_patching_encdec import MLM_PAIRS, tiny_mlm

from conftest import tiny_model
from probe.capture.hooks import native
from probe.capture.intervene import intervening
from probe.effects import components as comps
from probe.effects.pairs import EncodedPairs, Pair, encode_pairs
from probe.effects.patch_full import model_inputs, positions
from probe.effects.patching import patch_heads
from probe.errors import InputError, UnsupportedAnalysisError

PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
         Pair("When Mary and John went to the store, John gave a drink to",
              "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")]
KINDS = ["gpt2", "llama", "gpt_neox"]  # llama: grouped key/value heads; gpt_neox: parallel attention and MLP
#: With a masked-LM encoder (the metric at the clean prompt's [MASK]); BERT's spec names no MLP of its own.
ALL = [*KINDS, "bert-mlm"]


def _model(kind):
    return tiny_mlm() if kind == "bert-mlm" else tiny_model(kind)


def _pairs(kind):
    return MLM_PAIRS if kind == "bert-mlm" else PAIRS


def _names(kind):
    """The components of ``kind``: all but the MLP on BERT (test_bert_mlp_is_refused_in_one_line)."""
    return [n for n in comps.COMPONENTS if not (kind == "bert-mlm" and n == "mlp")]


def _same(enc: EncodedPairs) -> EncodedPairs:
    return EncodedPairs(enc.clean, enc.clean, enc.mask, enc.last, enc.answer, enc.wrong, source_last=enc.source_last)


@pytest.mark.parametrize("kind", KINDS)
def test_z_equals_patch_heads_and_units_follow_the_architecture(kind):
    lm = tiny_model(kind)
    enc = encode_pairs(lm, PAIRS)
    z, heads = comps.patch_component(lm, enc, "z"), patch_heads(lm, PAIRS)
    np.testing.assert_array_equal(z["raw"].to_numpy(), heads["raw"].to_numpy())
    np.testing.assert_array_equal(z["effect_last"].to_numpy(), heads["effect_last"].to_numpy())
    g = lm.geometry
    assert comps.units(lm, "k") == ((g.n_kv_heads, "kv_head") if kind == "llama" else (g.n_heads, "head"))
    assert len(comps.patch_component(lm, enc, "v")) == g.n_layers * comps.units(lm, "v")[0]


@pytest.mark.parametrize("kind", ALL)
def test_clean_equal_to_corrupted_gives_zero_for_both_methods(kind):
    lm = _model(kind)
    same = _same(encode_pairs(lm, _pairs(kind)))
    for name in _names(kind):
        frame = comps.patch_component(lm, same, name)
        # 0, to float32 rounding of the logits: exactly 0 where a CPU's kernels add a batch of patched
        # copies as they add the single run (an Intel CPU); 2e-6 for BERT's on an AMD EPYC
        assert (frame[["raw", "raw_last"]].abs().to_numpy() <= 1e-5).all() and not frame.attrs["normalized"]
        attr = comps.attribute_component(lm, same, name)
        assert (attr[["attribution_raw", "attribution_raw_last"]].to_numpy() == 0).all()


@pytest.mark.parametrize("kind", ["llama", "bert-mlm"])
def test_patching_a_component_with_its_own_value_gives_zero(kind):
    lm = _model(kind)
    enc = encode_pairs(lm, _pairs(kind))
    own = EncodedPairs(enc.corrupted, enc.corrupted, enc.mask, enc.last, enc.answer, enc.wrong,
                       source_last=enc.source_last)
    for name in _names(kind):
        frame = comps.patch_component(lm, enc, name, direction="noise")  # donor: the corrupted run
        assert frame["raw"].abs().sum() > 0  # the runs differ
        # the run patched from itself: the donor pass has the run's shape, so every raw difference is 0 (to
        # float32 rounding of the logits where the patched copies' batch rounds otherwise, as above)
        assert (comps.patch_component(lm, own, name)[["raw", "raw_last"]].abs().to_numpy() <= 1e-5).all()


def test_the_residual_stream_at_every_position_restores_everything():
    lm = tiny_model("gpt2")
    frame = comps.patch_component(lm, encode_pairs(lm, PAIRS), "resid")
    # the whole input of any block from the clean run: the rest of the pass is the clean pass
    assert frame["effect"].to_numpy() == pytest.approx(1.0, abs=1e-5)


def _finite_difference(lm, enc, name, layer, unit, eps):
    """(LD(run + eps d) - LD(run - eps d)) / 2 eps, d = donor - run on one unit at every position, denoising
    (a central difference: LLaMA's RMSNorm computes in float32 even in a float64 model)."""
    donor: dict = {}
    with torch.no_grad():
        with intervening(lm) as iv:
            comps.install(iv, lm, name, comps.record(donor))
            lm.model(**model_inputs(lm, enc, enc.clean))
        lds = []
        for step in (-eps, eps):
            def nudge(i, t, step=step):
                if i != layer:
                    return t
                T = t.shape[comps.COMPONENTS[name].pos_axis]
                sel = torch.zeros(len(enc), comps.units(lm, name)[0], T, dtype=torch.bool)
                sel[:, unit] = positions(lm, enc, i, "all")
                return t + step * comps.to_layout(sel, name, t).to(t.dtype) * (donor[i] - t)
            with intervening(lm) as iv:
                comps.install(iv, lm, name, nudge)
                logits = lm.model(**model_inputs(lm, enc, enc.corrupted)).logits.double()
            rows = torch.arange(len(enc))
            at = logits[rows, enc.last]
            lds.append(float((at[rows, enc.answer] - at[rows, enc.wrong]).mean()))
    return (lds[1] - lds[0]) / (2 * eps)


@pytest.mark.parametrize("kind,name", [(k, n) for k in ALL for n in _names(k) if n != "z"])
def test_attribution_equals_a_finite_difference(kind, name):
    lm = _model(kind)
    lm.model.double()
    enc = encode_pairs(lm, _pairs(kind))
    frame = comps.attribute_component(lm, enc, name)
    top = frame.reindex(frame["attribution_raw"].abs().sort_values(ascending=False).index).head(2)
    for row in top.itertuples():
        moved = _finite_difference(lm, enc, name, int(row.layer), max(int(row.head), 0), 1e-4)
        assert moved == pytest.approx(row.attribution_raw, rel=0.02)


def test_attribution_restores_flags_and_parse_refuses_unknown_names():
    lm = tiny_model("gpt2")
    lm.model.train()
    flags = [p.requires_grad for p in lm.model.parameters()]
    comps.attribute_component(lm, encode_pairs(lm, PAIRS), "q")
    assert lm.model.training and [p.requires_grad for p in lm.model.parameters()] == flags
    assert comps.parse_components("q, k,q,mlp") == ("q", "k", "mlp")
    with pytest.raises(InputError, match="--component"):
        comps.parse_components("z,attn")


def test_bert_mlp_is_refused_in_one_line():
    with pytest.raises(UnsupportedAnalysisError, match="MLP"):
        comps.check_components(tiny_mlm(), ["z", "mlp"])


def test_components_other_than_z_are_refused_where_the_reference_does_not_reproduce_the_model(monkeypatch):
    # BLOOM computes attention inside its module: q is patched through probe's reference module where that
    # reproduces the model, refused where not (z is patched either way)
    lm = tiny_model("bloom")
    comps.check_components(lm, ["z", "q"])
    monkeypatch.setattr(comps, "reference_agrees", lambda lm: False)
    comps.check_components(lm, ["z"])
    with pytest.raises(UnsupportedAnalysisError, match="attention interface"):
        comps.check_components(lm, ["z", "q"])


def test_patch_command_writes_every_component_with_its_correlation(tmp_path):
    import pandas as pd

    from conftest import invoke_cli, save_tiny

    model = save_tiny("llama", tmp_path / "llama")
    (tmp_path / "pairs.tsv").write_text("\n".join("\t".join((p.clean, p.corrupted, p.answer, p.wrong)) for p in PAIRS),
                                        encoding="utf-8")
    result = invoke_cli("patch", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--component", "k,mlp,resid",
                        "--method", "attribution", "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "run" / "components.csv")
    assert list(dict.fromkeys(table["component"])) == ["z", "k", "mlp", "resid"]  # z always
    # resid at every position restores everything in every layer: a constant column, its correlation undefined
    text = (tmp_path / "run" / "run.json").read_text(encoding="utf-8")
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in run.json"))["patching"]
    rows = {c["component"]: c for c in record["components"]}
    assert rows["resid"]["correlation"] is None and "correlation undefined (all positions)" in result.output
    lm = tiny_model("llama")
    k = comps.patch_component(lm, encode_pairs(lm, PAIRS), "k")
    got = table[table["component"] == "k"]
    assert (got["unit"] == "kv_head").all()
    np.testing.assert_allclose(got["effect"].to_numpy(), k["effect"].to_numpy(), rtol=1e-4, atol=1e-6)
    corr = comps.correlation(got["effect"], got["attribution"])
    assert "component k (4 kv_head units)" in result.output  # 2 layers x 2 key/value heads
    assert f"correlation {corr:.3f}" in result.output
    assert "<h3>Components</h3>" in (tmp_path / "run" / "index.html").read_text(encoding="utf-8")


def test_bad_components_are_one_error_line(tmp_path, monkeypatch):
    from conftest import invoke_cli, one_error, save_tiny

    one_error(invoke_cli("patch", "--model", tmp_path / "none", "--component", "z,attn"), 2, "--component")
    model = save_tiny("bloom", tmp_path / "bloom")
    (tmp_path / "pairs.tsv").write_text("\n".join("\t".join((p.clean, p.corrupted, p.answer, p.wrong)) for p in PAIRS),
                                        encoding="utf-8")
    monkeypatch.setattr(comps, "reference_agrees", lambda lm: False)  # a BLOOM the reference does not reproduce
    one_error(invoke_cli("patch", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--component", "q",
                         "--out", tmp_path / "run"), 1, "attention interface")
    assert not (tmp_path / "run").exists()


def test_falcon_heads_are_patched_by_key_value_head_wherever_its_attention_runs(monkeypatch):
    # Falcon's attention runs probe's function directly where the installed release calls the interface
    # (5.25 on), else through probe's reference module, swapped in where it reproduces the model (refused
    # where not); units follow multi-query heads (one key/value head) either way
    lm = tiny_model("falcon")
    enc = encode_pairs(lm, PAIRS)
    assert comps.units(lm, "k") == (1, "kv_head")
    for name in ("q", "k", "v", "pattern"):
        frame = comps.patch_component(lm, enc, name)
        assert len(frame) == lm.geometry.n_layers * comps.units(lm, name)[0] and frame["raw"].abs().sum() > 0
        same = comps.patch_component(lm, _same(enc), name)
        assert (same[["raw", "raw_last"]].abs().to_numpy() <= 1e-5).all()
    monkeypatch.setattr(comps, "reference_agrees", lambda lm: False)  # a model the reference does not reproduce
    if native(lm.model):
        comps.check_components(lm, ["z", "q"])  # the reference is not needed
    else:
        with pytest.raises(UnsupportedAnalysisError, match="q cannot be patched"):
            comps.check_components(lm, ["z", "q"])
