"""Head ablation effects on encoder-decoder models (tiny T5, BART, Marian): every encoder self,
decoder self and cross head, against weight surgery, explicit means and an independent loss."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from conftest import save_tiny, tiny_model
from probe.architectures import site_outputs
from probe.capture.maps import encode, forward
from probe.cli import main
from probe.effects import ablating, head_effects, head_means
from probe.effects.ablation import repeat_batch
from probe.effects.measure import effect_columns
from probe.text.inputs import Text

PAIRS = [("The cat sat on the mat.", "Le chat est assis."), ("A dog barked twice.", "Un chien a aboye."),
         ("Rain fell all night.", "Il a plu toute la nuit."), ("She read the letter.", "Elle a lu la lettre."),
         ("They built a house.", "Ils ont construit une maison."), ("Birds sing at dawn.", "Les oiseaux chantent.")]
TEXTS = [Text(s, target=t) for s, t in PAIRS]


def _site(lm, stack: str, kind: str) -> int:
    """Index in ``lm.sites`` of the last site of (stack, kind)."""
    return max(i for i, s in enumerate(lm.sites) if (s.stack, s.kind) == (stack, kind))


def _surgery(lm, i: int, head: int):
    """A copy of ``lm`` whose output projection at site ``i`` ignores ``head`` (its input columns zeroed)."""
    twin = copy.copy(lm)
    twin.model = copy.deepcopy(lm.model)
    o, dh = site_outputs(twin.model, twin.spec)[i][1], lm.geometry.d_head
    with torch.no_grad():
        o.weight[:, head * dh:(head + 1) * dh] = 0
    return twin


@pytest.mark.parametrize("kind", ["t5", "bart", "marian"])
def test_zero_ablation_equals_weight_surgery_at_every_site_kind(kind):
    lm = tiny_model(kind)
    batch = encode(lm, TEXTS[:3])
    heads = [(_site(lm, "encoder", "self"), 1), (_site(lm, "decoder", "self"), 3), (_site(lm, "decoder", "cross"), 2)]
    sets = torch.zeros(len(heads), len(lm.sites), lm.geometry.n_heads, dtype=torch.bool)
    for c, (i, h) in enumerate(heads):
        sets[c, i, h] = True
    rep = repeat_batch(batch, len(heads))
    with torch.no_grad(), ablating(lm, "zero") as state:
        state.arm(lm, sets, rep)
        ablated = forward(lm, rep).logits
        state.disarm()
        clean = forward(lm, batch).logits
    real, B = batch.target.real, len(batch)
    for c, (i, h) in enumerate(heads):
        with torch.no_grad():
            expected = forward(_surgery(lm, i, h), batch).logits
        got = ablated[c * B:(c + 1) * B]
        assert (got[real] - expected[real]).abs().max() <= 1e-6, lm.sites[i]
        assert (got[real] - clean[real]).abs().max() > 1e-4  # the head mattered: the test can fail


def _explicit(lm, batches, i: int):
    """The output projection's input at site ``i``, by a plain hook: [position 0 mean, t >= 1 mean, all mean]."""
    got = []
    o = site_outputs(lm.model, lm.spec)[i][1]
    handle = o.register_forward_pre_hook(lambda m, a: got.append(a[0].detach().double()))
    with torch.no_grad():
        for b in batches:
            forward(lm, b)
    handle.remove()
    H, dh = lm.geometry.n_heads, lm.geometry.d_head
    side = [b.target.real if lm.sites[i].stack == "decoder" else b.real for b in batches]
    xs = [x.reshape(*x.shape[:2], H, dh) for x in got]
    first = torch.cat([x[:, 0][r[:, 0]] for x, r in zip(xs, side)]).mean(0)
    rest = torch.cat([x[:, 1:][r[:, 1:]] for x, r in zip(xs, side)]).mean(0)
    every = torch.cat([x[r] for x, r in zip(xs, side)]).mean(0)
    return first.float(), rest.float(), every.float()


def test_means_per_site_kind_t5():
    lm = tiny_model("t5")
    ref = [encode(lm, TEXTS[:3]), encode(lm, TEXTS[3:])]
    means = head_means(lm, ref)
    assert means.shape == (len(lm.sites), 2, 4, lm.geometry.d_head)
    for i, site in enumerate(lm.sites):
        first, rest, every = _explicit(lm, ref, i)
        if site.causal:  # decoder self-attention: position 0 apart
            assert torch.allclose(means[i, 0], first, atol=1e-6) and torch.allclose(means[i, 1], rest, atol=1e-6)
        else:  # encoder and cross heads: one mean over every real token
            assert torch.allclose(means[i, 0], every, atol=1e-6) and torch.allclose(means[i, 1], every, atol=1e-6)
    i, h, dh = _site(lm, "decoder", "cross"), 2, lm.geometry.d_head
    batch = encode(lm, TEXTS[:2])
    sets = torch.zeros(1, len(lm.sites), 4, dtype=torch.bool)
    sets[0, i, h] = True
    with torch.no_grad(), ablating(lm, "mean", means) as state:
        state.arm(lm, sets, batch)
        got = forward(lm, batch).logits

    def replace(module, args):  # independent: the cross head's slice is its mean at every target position
        x = args[0].clone()
        x[:, :, h * dh:(h + 1) * dh] = means[i, 1, h]
        return (x,)

    handle = site_outputs(lm.model, lm.spec)[i][1].register_forward_pre_hook(replace)
    with torch.no_grad():
        expected = forward(lm, batch).logits
    handle.remove()
    real = batch.target.real
    assert (got[real] - expected[real]).abs().max() <= 1e-6


def _heads(lm, labels: dict) -> pd.DataFrame:
    H = lm.geometry.n_heads
    return pd.DataFrame([{"stack": s.stack, "kind": s.kind, "layer": s.layer, "head": h,
                          "labels": labels.get((s.stack, s.kind, s.layer, h), "")} for s in lm.sites for h in range(H)])


def test_head_effects_t5_every_site_and_the_seq2seq_loss():
    lm = tiny_model("t5")
    heads = _heads(lm, {("decoder", "cross", 1, 2): "x", ("encoder", "self", 0, 1): "x"})
    r = head_effects(lm, TEXTS * 2, heads=heads, kinds=("zero", "mean", "resample"), seeds=5, copies=4)
    assert r.objective == "seq2seq" and r.unit == "nats/target token"
    assert len(r.heads) == len(lm.sites) * 4 and list(r.heads.columns[4:]) == list(effect_columns())
    assert list(r.heads[["stack", "kind"]].drop_duplicates().itertuples(index=False, name=None)) == [
        ("encoder", "self"), ("decoder", "self"), ("decoder", "cross")]
    assert (r.heads["effect_zero"].abs() > 0).all()  # every head of every kind changes the loss
    x = r.labels[(r.labels["label"] == "x") & (r.labels["ablation"] == "zero")].iloc[0]
    assert x["n_heads"] == 2 and x["heads"] == "enc L0H1 cross L1H2"
    # the clean loss, independently: the library's own loss with labels = the target after the start token
    held = [TEXTS[i % 6] for i in sorted(np.random.default_rng(0).permutation(12)[:6])]
    batch = encode(lm, held)
    labels = batch.target.input_ids[:, 1:].masked_fill(~batch.target.real[:, 1:], -100)
    with torch.no_grad():
        loss = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    assert r.clean == pytest.approx(float(loss), abs=1e-5)
    # one head's effect, independently: zero it by surgery and take the same loss
    row = r.heads[(r.heads["stack"] == "decoder") & (r.heads["kind"] == "self") & (r.heads["layer"] == 2)
                  & (r.heads["head"] == 0)].iloc[0]
    twin = _surgery(lm, _site(lm, "decoder", "self"), 0)
    with torch.no_grad():
        ablated = twin.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    # float32 losses (~29 nats per token on this random model), summed over other batch shapes: agreement to 5e-5
    assert abs(row["effect_zero"]) > 1e-2 and row["effect_zero"] == pytest.approx(float(ablated - loss), abs=5e-5)
    with torch.no_grad():
        logits = forward(lm, batch).logits
    assert float(F.cross_entropy(logits[:, :-1][batch.target.real[:, 1:]],
                           batch.target.input_ids[:, 1:][batch.target.real[:, 1:]])) == pytest.approx(float(loss))


def test_cli_effects_on_an_encoder_decoder_model(tmp_path):
    model = save_tiny("bart", tmp_path / "model")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(f"{s}\t{t}" for s, t in PAIRS * 2), encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--pairs", str(pairs), "--seeds", "5",
                                    "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    effects = pd.read_csv(out / "effects.csv")
    assert len(effects) == len(tiny_model("bart").sites) * 4
    heads = pd.read_csv(out / "heads.csv")
    merged = heads.merge(effects, on=["stack", "kind", "layer", "head"], suffixes=("", "_e"))
    assert len(merged) == len(effects) and np.allclose(merged["effect_mean"], merged["effect_mean_e"], atol=1e-5)
    assert "Head ablation effects" in (out / "index.html").read_text(encoding="utf-8")
    res = CliRunner().invoke(main, ["effects", "--model", str(model), "--out", str(tmp_path / "run2")])
    assert res.exit_code == 1 and res.output.count("Error:") == 1 and "--pairs" in res.output, res.output
