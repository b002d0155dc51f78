"""Resample ablation (probe.effects, kind ``resample``): one head's effect against an independent
computation with plain hooks: the donor drawn by the stated rule, its head output captured on its own,
pasted into the held-out text, the loss taken from the model's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model
from probe.architectures import site_outputs
from probe.causal.split import split_corpus
from probe.effects import head_effects

TEXTS = ["The cat sat on the mat.", "A dog barked at the mailman twice.", "Rain fell all night long.",
         "She read the letter and smiled.", "They built a small house by the river.", "Birds sing at dawn.",
         "Snow.", "The old man walked slowly down the long and winding road toward the sea at night.",
         "We ate.", "Two trains left the station at noon.", "He laughed.", "The river ran fast after the storm."]


def _ids(lm, text: str) -> torch.Tensor:
    return torch.tensor([lm.tokenizer(text)["input_ids"]])


def _z(lm, layer: int, ids: torch.Tensor) -> torch.Tensor:
    """[1, T, heads * d_head] the output projection's input of ``layer`` on ``ids``."""
    got = []
    o = site_outputs(lm.model, lm.spec)[layer][1]
    handle = o.register_forward_pre_hook(lambda m, a: got.append(a[0].detach().clone()))
    with torch.no_grad():
        lm.model(input_ids=ids)
    handle.remove()
    return got[0]


def _loss_sum(lm, ids: torch.Tensor, layer: int | None = None, head: int = 0, donor: torch.Tensor | None = None):
    """Sum of next-token losses of one text (nats), head ``head`` of ``layer`` given the donor's output."""
    dh, handle = lm.geometry.d_head, None
    if layer is not None:
        def paste(module, args):
            x = args[0].clone()
            T = x.shape[1]
            x[:, :, head * dh:(head + 1) * dh] = donor[:, :T, head * dh:(head + 1) * dh]
            return (x,)
        handle = site_outputs(lm.model, lm.spec)[layer][1].register_forward_pre_hook(paste)
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits.double()
    if handle is not None:
        handle.remove()
    return float(F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")), ids.shape[1] - 1


def test_resample_effect_equals_an_independent_hook_computation():
    lm = tiny_model("llama")
    r = head_effects(lm, TEXTS, heads=False, kinds=("resample",), seeds=5, copies=4)
    ref_idx, held_idx = split_corpus(len(TEXTS), 0.5, 0)
    ref_len = {i: _ids(lm, TEXTS[i]).shape[1] for i in ref_idx}
    layer, head = 1, 2
    delta = units = 0.0
    missing = 0
    for i in held_idx:
        ids = _ids(lm, TEXTS[i])
        fits = [j for j in ref_idx if ref_len[j] >= ids.shape[1]]  # reference order = corpus order
        if not fits:
            missing += 1
            continue
        donor = fits[np.random.default_rng([0, i]).integers(len(fits))]
        z = _z(lm, layer, _ids(lm, TEXTS[donor]))
        ablated, n = _loss_sum(lm, ids, layer, head, z)
        clean, _ = _loss_sum(lm, ids)
        delta, units = delta + ablated - clean, units + n
    assert 0 < missing < len(held_idx)  # the rule's edge case is exercised: some sequences have no donor
    assert any("no reference text at least as long" in n for n in r.notes)
    row = r.heads[(r.heads["layer"] == layer) & (r.heads["head"] == head)].iloc[0]
    assert abs(delta / units) > 1e-3  # the head matters: the test can fail
    assert row["effect_resample"] == pytest.approx(delta / units, abs=1e-5)
    assert row["effect_resample_low"] <= row["effect_resample"] <= row["effect_resample_high"]
    again = head_effects(lm, TEXTS, heads=False, kinds=("resample",), seeds=5, resample_seed=1)
    assert not np.allclose(again.heads["effect_resample"], r.heads["effect_resample"])  # the seed picks the donors
