"""Sparse attention whose indexer picks each query's keys (DeepSeek-V3.2's DSA, GLM-MoE-DSA): the model
passes the chosen ``indices`` to any attention function but eager and SDPA, and probe's function keeps
exactly those keys (probe.capture.interface.index_keep). With top-k 4 on 12 tokens the choice binds: every
row of the captured maps has its nonzero weights at the indexer's keys only, and probe's attention equals
the model's own eager attention (which folds the same choice into its mask)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from probe.capture.interface import index_keep
from probe.capture.maps import capture_attention
from probe.verification import verify

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from tiny_models import auto_class, special_ids, tiny_config, tokenizer_for  # noqa: E402

TOPK = 4
TEXT = "The cat sat on the mat and the dog slept by the door all night long."


def sparse_lm(model_type: str):
    from probe.loading.models import from_pretrained_objects

    tok = tokenizer_for("decoder")
    config = tiny_config(model_type, len(tok), special_ids(tok))
    config.index_topk = TOPK
    torch.manual_seed(0)
    model = auto_class("decoder").from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    return from_pretrained_objects(model, tok, name=f"tiny-{model_type}")


def test_index_keep_marks_the_chosen_keys():
    indices = torch.tensor([[[0, 2], [1, 1]]])  # [batch 1, query 2, top-k 2]; a repeated index is one key
    assert index_keep(indices, 4).tolist() == [[[[True, False, True, False], [False, True, False, False]]]]


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_each_row_keeps_the_indexer_s_keys_and_equals_the_model(model_type):
    lm = sparse_lm(model_type)
    chosen = []

    def indexer_out(module, args, out):
        chosen.append(out)

    hooks = [m.register_forward_hook(indexer_out) for name, m in lm.model.named_modules()
             if name.endswith("self_attn.indexer")]
    try:
        cap = capture_attention(lm, TEXT)
    finally:
        for h in hooks:
            h.remove()
    T = cap.probs[0].shape[-1]
    assert T > 2 * TOPK and len(chosen) == len(cap.probs)
    for probs, idx in zip(cap.probs, chosen):
        allowed = index_keep(idx, T)[0, 0] & torch.ones(T, T, dtype=torch.bool).tril()  # [query, key]
        p = probs[0]  # [heads, query, key]
        assert bool((p[:, ~allowed] == 0).all())
        assert bool(((p > 0).sum(-1) <= TOPK).all()) and bool(((p > 0).sum(-1)[:, TOPK:] == TOPK).all())
    result = verify(lm)
    assert result.passed, result.max_abs_diff
