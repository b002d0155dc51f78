"""Activation patching on encoder-decoder models (tiny T5, BART) and masked-LM encoders (a tiny
BertForMaskedLM): the invariants (the run's own value gives exactly 0; clean = corrupted gives 0 and
says it cannot normalise; the last block's whole input gives exactly 1), one head's effect against
an independent hook computation, the mask rules, and ``probe patch`` on both."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from click.testing import CliRunner

import probe.loading.models as pm
from conftest import make_tokenizer, save_tiny, tiny_config, tiny_model
from probe.architectures import site_outputs
from probe.cli import main
from probe.effects.pairs import encode_pairs
from probe.effects.patch_full import full_head_logit_diffs
from probe.effects.patching import Pair, patch_heads, patch_residual
from probe.errors import InputError

T5_PAIRS = [Pair("The cat sat on the mat.", "A dog ran in the park.", " cat", " dog", "Le"),
            Pair("The dog sat on the mat.", "A cat ran in the park.", " cat", " dog", "")]
MLM_PAIRS = [Pair("the capital of france is [MASK] .", "the river of england was [MASK] .", "paris", "london"),
             Pair("a cat sat on the [MASK] today .", "a dog ran to the [MASK] today .", "mat", "rug")]


def tiny_mlm(folder=None):
    """A tiny BertForMaskedLM (the conftest BERT config, MiniLM's wordpiece tokenizer); saved to ``folder`` if given."""
    tok = make_tokenizer("wordpiece")
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(tiny_config("bert", len(tok))).eval()
    if folder is not None:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        return folder
    return pm.from_pretrained_objects(model, tok, name="tiny-bert-mlm")


def _lm(kind: str):
    return tiny_mlm() if kind == "bert-mlm" else tiny_model(kind)


def _pairs(kind: str) -> list[Pair]:
    return MLM_PAIRS if kind == "bert-mlm" else T5_PAIRS


def _jobs(lm):
    return [(i, h, w) for i in range(len(lm.sites)) for w in ("all", "last") for h in range(lm.geometry.n_heads)]


@pytest.mark.parametrize("kind", ["t5", "bart", "bert-mlm"])
def test_patching_with_the_runs_own_value_gives_exactly_zero(kind):
    lm = _lm(kind)
    enc = encode_pairs(lm, _pairs(kind))
    for run in ("corrupted", "clean"):
        patched, base, _ = full_head_logit_diffs(lm, enc, _jobs(lm), run=run, donor=run, heads_per_pass=8)
        assert np.array_equal(patched, base)
    patched, base, _ = full_head_logit_diffs(lm, enc, _jobs(lm), heads_per_pass=8)
    assert np.abs(patched - base).max() > 1e-3  # the clean value does change something: the test can fail


@pytest.mark.parametrize("kind", ["t5", "bert-mlm"])
def test_clean_equal_to_corrupted_gives_zero_and_says_so(kind):
    lm = _lm(kind)
    same = [Pair(p.clean, p.clean, p.answer, p.wrong, p.prefix) for p in _pairs(kind)]
    frame = patch_heads(lm, same)
    assert (frame[["raw", "raw_last", "effect", "effect_last"]].to_numpy() == 0).all()
    assert not frame.attrs["normalized"] and "barely separate" in frame.attrs["notes"][0]


@pytest.mark.parametrize("kind", ["t5", "bart", "bert-mlm"])
def test_the_last_blocks_whole_input_gives_exactly_one(kind):
    lm = _lm(kind)
    n_blocks = len(dict.fromkeys(s.name.rsplit(".", 1)[0] for s in lm.sites))  # encoder.i / decoder.i
    assert patch_residual(lm, _pairs(kind), n_blocks - 1) == 1.0


def _manual_raw(lm, enc, i: int, head: int, where: str) -> float:
    """LD_p - LD_x of patching head ``head`` of site ``i`` with its clean value, by plain hooks, one pass each."""
    o = site_outputs(lm.model, lm.spec)[i][1]
    dh, decoder_side = lm.geometry.d_head, lm.sites[i].stack == "decoder" and enc.target is not None
    kw = {"attention_mask": enc.mask}
    if enc.target is not None:
        kw.update(decoder_input_ids=enc.target, decoder_attention_mask=enc.target_mask)
    got = []
    h = o.register_forward_pre_hook(lambda m, a: got.append(a[0].detach().clone()))
    with torch.no_grad():
        lm.model(input_ids=enc.clean, **kw)
    h.remove()
    clean_z = got[0]
    rows = torch.arange(len(enc))
    last = enc.last if decoder_side or enc.target is None else enc.source_last

    def paste(module, args):
        x = args[0].clone()
        cols = slice(head * dh, (head + 1) * dh)
        if where == "all":
            x[:, :, cols] = clean_z[:, :, cols]  # padded positions too: they reach no real one
        else:
            x[rows, last, cols] = clean_z[rows, last, cols]
        return (x,)

    def ld(patch: bool) -> float:
        handle = o.register_forward_pre_hook(paste) if patch else None
        with torch.no_grad():
            logits = lm.model(input_ids=enc.corrupted, **kw).logits.double()
        if handle:
            handle.remove()
        at = logits[rows, enc.last]
        return float((at[rows, enc.answer] - at[rows, enc.wrong]).mean())

    return ld(True) - ld(False)


@pytest.mark.parametrize("kind", ["t5", "bert-mlm"])
def test_one_heads_effect_against_plain_hooks(kind):
    lm = _lm(kind)
    frame = patch_heads(lm, _pairs(kind))
    enc = encode_pairs(lm, _pairs(kind))
    S, H = len(lm.sites), lm.geometry.n_heads
    assert len(frame) == S * H and list(frame["stack"].unique()) == sorted({s.stack for s in lm.sites}, reverse=True)
    checks = [(0, 1)] + ([(S - 1, 2), (S - 2, 3)] if lm.kind == "encoder-decoder" else [(S - 1, 2)])  # enc, cross, dec
    for i, h in checks:
        row = frame.iloc[i * H + h]
        for where, column in (("all", "raw"), ("last", "raw_last")):
            assert row[column] == pytest.approx(_manual_raw(lm, enc, i, h, where), abs=1e-5), (lm.sites[i], where)
    gap = frame.attrs["ld_clean"] - frame.attrs["ld_corrupted"]
    assert frame.attrs["normalized"] and np.allclose(frame["effect"], frame["raw"] / gap)


def test_encoder_decoder_pairs_read_the_decoder_after_the_prefix():
    lm = tiny_model("t5")
    enc = encode_pairs(lm, T5_PAIRS)
    prefix = lm.tokenizer(text_target="Le", add_special_tokens=False)["input_ids"]
    assert enc.target[0, : 1 + len(prefix)].tolist() == [lm.model.config.decoder_start_token_id, *prefix]
    assert enc.last.tolist() == [len(prefix), 0] and enc.target_mask.sum(1).tolist() == [1 + len(prefix), 1]
    with pytest.raises(InputError, match="encoder-decoder models only"):
        encode_pairs(tiny_model("gpt2"), [Pair("a b", "a c", " a", " b", "x")])


def test_masked_lm_pairs_need_the_mask_at_one_position():
    lm = tiny_mlm()
    assert encode_pairs(lm, MLM_PAIRS).last.tolist() == [6, 6]
    with pytest.raises(InputError, match=r"pair 1: the first \[MASK\] is at token 3 of the clean prompt and at "
                                         r"token 4"):
        encode_pairs(lm, [Pair("the cat [MASK] on the mat", "the cat sat [MASK] the mat", "sat", "ran")])
    with pytest.raises(InputError, match=r"pair 1: the clean prompt has no \[MASK\]"):
        encode_pairs(lm, [Pair("the cat sat on the mat", "the dog sat on the mat", "sat", "ran")])


def test_cli_patch_on_t5_and_a_masked_lm(tmp_path):
    for name, folder, pairs in (("t5", save_tiny("t5", tmp_path / "t5"), T5_PAIRS),
                                ("mlm", tiny_mlm(tmp_path / "mlm"), MLM_PAIRS)):
        tsv = tmp_path / f"{name}.tsv"
        tsv.write_text("\n".join("\t".join([p.clean, p.corrupted, p.answer, p.wrong] + ([p.prefix] if name == "t5"
                                                                                          else [])) for p in pairs),
                       encoding="utf-8")
        out = tmp_path / f"run-{name}"
        res = CliRunner().invoke(main, ["patch", "--model", str(folder), "--pairs", str(tsv), "--out", str(out),
                                        "--no-progress"])
        assert res.exit_code == 0, res.output
        patch = pd.read_csv(out / "patch.csv")
        lm = _lm("t5" if name == "t5" else "bert-mlm")
        assert len(patch) == len(lm.sites) * 4 and set(patch["kind"]) == {s.kind for s in lm.sites}
        assert ("dla: direct logit attribution is computed for decoder-only models" if name == "t5"  # the BERT
                else "direct logit attribution needs a pre-LN model") in res.output  # MLM is post-LN: said first
        res = CliRunner().invoke(main, ["patch", "--model", str(folder), "--out", str(tmp_path / f"x-{name}")])
        assert res.exit_code == 1 and res.output.count("Error:") == 1 and "give --pairs FILE" in res.output


@pytest.mark.slow
def test_minilm_is_refused_in_one_line_saying_why(tmp_path, minilm):
    res = CliRunner().invoke(main, ["patch", "--model", "minilm", "--out", str(tmp_path / "run")])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "BertModel without a masked-LM head" in errors[0]
