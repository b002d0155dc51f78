"""Physical pruning of the real embedded models at 50% of their heads (slow): fewer parameters,
the same outputs as the gated model, identical after save and reload, and verification passes;
load_model's task heads."""

from __future__ import annotations

import pytest
import torch

from conftest import bert_tokenizer, tiny_config
from probe.architectures import base_model
from probe.capture.intervene import intervening
from probe.capture.maps import encode, forward
from probe.causal.gates import gated, ones
from probe.errors import ModelLoadError
from probe.loading.models import load_model
from probe.pruning.experiment import copy_model
from probe.pruning.removal import parameter_count, remove_heads
from probe.pruning.saving import save_pruned
from probe.verification import verify

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention heads can be pruned.",
         "She said that the report, which was late, had been sent."]


def half_of_the_heads(lm, seed: int = 0) -> dict[int, list[int]]:
    g = lm.geometry
    perm = torch.randperm(g.n_layers * g.n_heads, generator=torch.Generator().manual_seed(seed))
    heads: dict[int, list[int]] = {}
    for i in perm[: g.n_layers * g.n_heads // 2].tolist():
        heads.setdefault(i // g.n_heads, []).append(i % g.n_heads)
    return heads


def _hidden_and_output(lm, batch):
    inputs = batch.model_inputs()
    if lm.kind == "decoder":
        inputs["use_cache"] = False
    hidden = base_model(lm.model)(**inputs).last_hidden_state[batch.real]
    out = forward(lm, batch)
    t = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
    return hidden, t[batch.real]


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["minilm", "smollm2"])
def test_real_model_pruned_to_half_its_heads(fixture, request, tmp_path):
    lm = request.getfixturevalue(fixture)
    heads = half_of_the_heads(lm)
    mask = ones(lm)
    for layer, hs in heads.items():
        mask[layer, hs] = 0.0
    batch = encode(lm, TEXTS)
    with torch.no_grad(), gated(lm, mask):
        want_hidden, want_out = _hidden_and_output(lm, batch)
    pruned = copy_model(lm)
    removal = remove_heads(pruned, heads)
    with torch.no_grad():
        hidden, out = _hidden_and_output(pruned, batch)
    # in float64 removing the heads is exactly gating them to 0 (their terms were exact zeros)
    gated64, pruned64 = copy_model(lm), copy_model(pruned)
    gated64.model.double()
    pruned64.model.double()
    with torch.no_grad(), gated(gated64, mask.double()):
        true_hidden, true_out = _hidden_and_output(gated64, batch)
    with torch.no_grad(), intervening(pruned64):  # the attention function the gates run under (probe's)
        hidden64, out64 = _hidden_and_output(pruned64, batch)
    torch.testing.assert_close(hidden64, true_hidden, atol=1e-9, rtol=0)
    torch.testing.assert_close(out64, true_out, atol=1e-9, rtol=0)
    # in float32 the smaller matrix products add in another order: the pruned model is as close to
    # the float64 result as the gated one (SmolLM2's 30 layers: both ~3e-4 on hidden states of ~40)
    for got, gated32, truth in ((hidden, want_hidden, true_hidden), (out, want_out, true_out)):
        own_error = float((gated32.double() - truth).abs().max())
        error = float((got.double() - truth).abs().max())
        assert error <= 3 * own_error + 1e-5, (error, own_error)
    assert removal.params_after < removal.params_before == parameter_count(lm.model)
    assert pruned.pruned.mask().sum() == lm.geometry.n_layers * lm.geometry.n_heads // 2 + \
        (lm.geometry.n_layers * lm.geometry.n_heads) % 2
    again = load_model(str(save_pruned(pruned, tmp_path / "pruned")))
    assert again.pruned == pruned.pruned and parameter_count(again.model) == removal.params_after
    with torch.no_grad():
        h2, o2 = _hidden_and_output(again, batch)
    assert torch.equal(h2, hidden) and torch.equal(o2, out)
    assert verify(again, cases=["sentence", "right-padded"]).passed


def test_load_model_heads(tmp_path):
    import transformers as tr

    tok = bert_tokenizer()
    torch.manual_seed(0)
    tr.BertForMaskedLM(tiny_config("bert", len(tok))).save_pretrained(tmp_path / "mlm")
    tok.save_pretrained(tmp_path / "mlm")
    assert type(load_model(str(tmp_path / "mlm"), head="auto").model).__name__ == "BertForMaskedLM"
    assert type(load_model(str(tmp_path / "mlm")).model).__name__ == "BertModel"
    tr.BertModel(tiny_config("bert", len(tok))).save_pretrained(tmp_path / "bare")
    tok.save_pretrained(tmp_path / "bare")
    assert type(load_model(str(tmp_path / "bare"), head="auto").model).__name__ == "BertModel"
    with pytest.raises(ModelLoadError, match="has no MaskedLM head in its weights"):
        load_model(str(tmp_path / "bare"), head="mlm")
    with pytest.raises(ModelLoadError, match="unknown head"):
        load_model(str(tmp_path / "bare"), head="seq2seq")
