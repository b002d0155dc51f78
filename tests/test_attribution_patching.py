"""Attribution patching per head (probe patch --method attribution): the gradient estimate against a
finite difference of activation patching, zero where there is nothing to patch, the model restored."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import invoke_cli, save_tiny, tiny_model
from probe.effects.attribution import attribute_heads, correlation
from probe.effects.pairs import EncodedPairs, Pair, encode_pairs
from probe.effects.patching import logit_diffs, patched_pass, run_z

PAIRS = [Pair("The cat and the dog ran to", "The dog and the cat ran to", " the", " a"),
         Pair("When Mary and John went to the store, John gave a drink to",
              "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_equals_a_finite_difference_of_patching(kind, direction):
    lm = tiny_model(kind)
    enc = encode_pairs(lm, PAIRS)
    frame = attribute_heads(lm, enc, direction)
    run, donor = (enc.corrupted, enc.clean) if direction == "denoise" else (enc.clean, enc.corrupted)
    base = float(logit_diffs(run_z(lm, run, enc.mask)[0], enc).mean())
    donor_z = run_z(lm, donor, enc.mask)[1]
    eps, H = 1e-3, lm.geometry.n_heads
    for row in frame.reindex(frame["attribution_raw"].abs().sort_values(ascending=False).index).head(3).itertuples():
        where = torch.zeros(len(enc), enc.clean.shape[1], H, dtype=torch.bool)
        where[:, :, row.head] = enc.mask.bool()
        logits = patched_pass(lm, run, enc.mask, {row.layer: where}, donor_z, alpha=eps)
        moved = (float(logit_diffs(logits, enc).mean()) - base) / eps
        assert moved == pytest.approx(row.attribution_raw, rel=0.02, abs=1e-4)


def test_clean_equal_to_corrupted_attributes_nothing():
    lm = tiny_model("llama")
    enc = encode_pairs(lm, PAIRS)
    same = EncodedPairs(enc.clean, enc.clean, enc.mask, enc.last, enc.answer, enc.wrong, source_last=enc.source_last)
    frame = attribute_heads(lm, same)
    assert (frame[["attribution_raw", "attribution_raw_last"]].to_numpy() == 0).all()
    assert not frame.attrs["normalized"]  # no gap: raw values, as activation patching does


def test_last_position_is_part_of_all_positions_and_the_model_is_restored():
    lm = tiny_model("gpt2")
    lm.model.train()
    flags = [p.requires_grad for p in lm.model.parameters()]
    frame = attribute_heads(lm, encode_pairs(lm, PAIRS))
    assert lm.model.training and [p.requires_grad for p in lm.model.parameters()] == flags
    assert len(frame) == 2 * 4 and frame["attribution_raw_last"].abs().sum() > 0
    layer0 = frame[frame["layer"] == 0]
    assert not np.allclose(layer0["attribution_raw"], layer0["attribution_raw_last"])


def test_correlation():
    assert correlation([1, 2, 3], [2, 4, 6.5]) == pytest.approx(np.corrcoef([1, 2, 3], [2, 4, 6.5])[0, 1])
    assert np.isnan(correlation([1, 1, 1], [1, 2, 3]))


def test_patch_command_with_attribution_reports_both_and_their_correlation(tmp_path):
    model = save_tiny("llama", tmp_path / "llama")
    (tmp_path / "pairs.tsv").write_text("\n".join("\t".join((p.clean, p.corrupted, p.answer, p.wrong)) for p in PAIRS),
                                        encoding="utf-8")
    result = invoke_cli("patch", "--model", model, "--pairs", tmp_path / "pairs.tsv", "--method", "attribution",
                        "--out", tmp_path / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    patch = pd.read_csv(tmp_path / "run" / "patch.csv")
    record = json.loads((tmp_path / "run" / "run.json").read_text())["patching"]["attribution"]
    assert record["correlation"] == pytest.approx(correlation(patch["effect"], patch["attribution"]), abs=1e-4)
    assert f"correlation {record['correlation']:.3f}" in result.output
    assert "attribution" in pd.read_csv(tmp_path / "run" / "heads.csv").columns
    assert 'data-fig="patch-attribution"' in (tmp_path / "run" / "index.html").read_text(encoding="utf-8")
