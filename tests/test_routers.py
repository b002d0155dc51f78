"""Mixture-of-experts routers: each token's experts and weights per layer, and the experts' load, recorded
beside the head statistics, equal to the model's own router computed here from its router logits
(``output_router_logits=True``: softmax over the experts, top k, renormalised where the config says so)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from generic_models import generic_config

from conftest import bpe_tokenizer
from probe.measures.routers import find_routers, routing
from probe.runs.analysis import analyze

TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.",
         "A short one.", "Experts route every token; some take more than others, and the load shows it."]


def moe_lm(model_type: str, **settings):
    import transformers as tr

    from probe.loading.models import from_pretrained_objects

    tok = bpe_tokenizer()
    config = generic_config(model_type, len(tok))
    for key, value in settings.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = tr.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    return from_pretrained_objects(model, tok, name=f"tiny-{model_type}")


def own_routing(lm, ids: list[int], renormalise: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (experts [T, k], weights [T, k]), largest weight first, from the model's router logits."""
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([ids]), output_router_logits=True, use_cache=False)
    k = lm.model.config.num_experts_per_tok
    layers = []
    for logits in out.router_logits:
        p = torch.softmax(logits.reshape(len(ids), -1).double(), -1)
        w, e = p.topk(k, -1)
        if renormalise:
            w = w / w.sum(-1, keepdim=True)
        layers.append((e.numpy(), w.numpy()))
    return layers


CASES = [("mixtral", {}, True), ("qwen2_moe", {"norm_topk_prob": True}, True),
         ("qwen2_moe", {"norm_topk_prob": False}, False)]


@pytest.mark.parametrize("model_type,settings,renormalise", CASES,
                         ids=["mixtral", "qwen2_moe-renormalised", "qwen2_moe-not-renormalised"])
def test_each_tokens_experts_and_weights_are_the_models_own(model_type, settings, renormalise, tmp_path):
    from probe.report import write_run

    lm = moe_lm(model_type, **settings)
    assert [(s, i) for s, i, _ in find_routers(lm)] == [("decoder", 0), ("decoder", 1)]
    res = analyze(lm, TEXTS, batch_size=2, n_examples=len(TEXTS))  # padded batches: padding rows left out
    routers = res.results["routers"]
    k, E = lm.model.config.num_experts_per_tok, routers.n_experts
    assert routers.top_k == k and E == 4 and routers.renormalised == renormalise
    frame = routers.tokens_frame
    counts = np.zeros((2, E), dtype=int)
    for x, ex in enumerate(res.examples):
        want = own_routing(lm, ex.ids, renormalise)
        for layer, (experts, weights) in enumerate(want):
            rows = frame[(frame.example == x) & (frame.layer == layer)].sort_values("position")
            assert rows["position"].tolist() == list(range(len(ex.ids)))
            got_e = rows[[f"expert_{j + 1}" for j in range(k)]].to_numpy()
            got_w = rows[[f"weight_{j + 1}" for j in range(k)]].to_numpy()
            np.testing.assert_array_equal(got_e, experts)
            np.testing.assert_allclose(got_w, weights, rtol=0, atol=2e-6)
            np.add.at(counts[layer], experts.reshape(-1), 1)
    assert routers.tokens == sum(len(ex.ids) for ex in res.examples)
    np.testing.assert_array_equal(routers.counts, counts)
    load = routers.load()
    np.testing.assert_allclose(load.groupby("layer")["load"].sum(), 1.0)
    sums = frame[[f"weight_{j + 1}" for j in range(k)]].sum(axis=1)
    assert bool(np.allclose(sums, 1.0, atol=1e-5)) == renormalise

    path = write_run(res, lm.tokenizer, tmp_path / "run")
    record = json.loads((path / "run.json").read_text())["routers"]
    assert record["renormalised"] == renormalise and record["top_k"] == k and len(record["layers"]) == 2
    assert record["layers"][0]["load"] == [round(c / (routers.tokens * k), 6) for c in counts[0]]
    csv = pd.read_csv(path / "routers.csv")
    assert len(csv) == len(frame) and 'id="routers"' in (path / "index.html").read_text(encoding="utf-8")
    assert len(pd.read_csv(path / "heads.csv")) == 2 * lm.geometry.n_heads  # the head statistics beside them


def test_a_dense_model_has_no_router_section(tiny_generic):
    lm = tiny_generic("olmo")
    assert find_routers(lm) == []
    assert "routers" not in analyze(lm, TEXTS[:1]).results


def test_router_outputs_are_read_as_experts_and_weights():
    logits = torch.randn(5, 4)
    w, e = torch.softmax(logits, -1).topk(2, -1)
    experts, weights = routing((logits, w, e))
    assert torch.equal(experts, e) and torch.equal(weights, w)
    dense = torch.zeros(5, 4).scatter(1, e, w)  # GPT-OSS-like dense scores
    assert torch.equal(routing((logits, dense, e))[1], w)
    assert routing(logits) is None and routing((logits, w, w)) is None
