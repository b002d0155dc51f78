"""The statistics' contraction (probe.measures.stats.map_sums: per-key products, diagonals, per-row weight
vectors, row entropies) against the dense formulation it replaced: one weight per (query, key,
statistic), built here from the definitions in float64 and contracted with the whole map.

Checked on tiny models of three site kinds (encoder, causal with a sliding window smaller than T,
encoder-decoder cross-attention), on whole maps and on row blocks of the same maps.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from probe.capture.maps import capture_attention
from probe.loading.seq2seq import sides
from probe.measures.stats import ALL_STATISTICS, INDEX, HeadStatistics
from probe.measures.statweights import token_features
from probe.text.inputs import Text

TEXTS = ["The cat sat on the mat, and then -- quietly -- it left.", "Hello, world!",
         "One two three four five six seven eight nine ten eleven twelve thirteen."]
KINDS = ("bert", "qwen2-window", "bart")


def dense_weights(site, queries, keys, tokenizer, eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Tq, Tk, statistics] float64 weight of A[b, h, i, j] in each linear statistic's sum, and
    [B, Tq, statistics] the weight of each row's -sum A ln A / max A (entropy, norm_entropy, max_weight)."""
    qf = token_features(queries, tokenizer, eos)
    kf = token_features(keys, tokenizer, eos) if site.kind == "cross" else qf
    B, Tq = qf.real.shape
    Tk = kf.real.shape[1]
    w = torch.zeros(B, Tq, Tk, len(ALL_STATISTICS), dtype=torch.float64)
    rows = torch.zeros(B, Tq, len(ALL_STATISTICS), dtype=torch.float64)
    for b in range(B):
        T, S = int(qf.real[b].sum()), int(kf.real[b].sum())
        for i in range(T):
            if site.kind == "cross":
                k_i = S
            else:
                k_i = T if not site.causal else min(i + 1, site.window or i + 1)
            rows[b, i, INDEX["entropy"]] = rows[b, i, INDEX["max_weight"]] = 1
            rows[b, i, INDEX["norm_entropy"]] = 1 / math.log(k_i) if k_i >= 2 else 0
            for j in range(Tk):
                v = w[b, i, j]
                v[INDEX["first"]] = j == 0
                v[INDEX["sep"]] = bool(kf.sep[b, j]) and kf.has_sep
                v[INDEX["punct"]] = bool(kf.punct[b, j])
                if site.kind == "cross":
                    v[INDEX["distance"]] = abs(i * S / T - j)
                    d = math.floor(i * (S - 1) / (T - 1) + 0.5) if T > 1 else 0
                    v[INDEX["aligned"]] = abs(j - d) <= 1
                else:
                    v[INDEX["self"]] = j == i
                    v[INDEX["prev"]] = j == i - 1
                    v[INDEX["next"]] = j == i + 1 and not site.causal and i <= T - 2
                    v[INDEX["distance"]] = abs(i - j)
                    v[INDEX["long"]] = abs(i - j) > 4 and j != 0 and not bool(kf.sep[b, j])
    return w, rows


def dense_sums(a: torch.Tensor, w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[heads, statistics] float64: the map contracted with the dense weights."""
    a = a.double()
    sums = torch.einsum("bhij,bijc->hc", a, w)
    ent = torch.special.entr(a).sum(-1)  # [B, H, Tq]
    for name in ("entropy", "norm_entropy"):
        sums[:, INDEX[name]] = torch.einsum("bhi,bi->h", ent, rows[..., INDEX[name]])
    sums[:, INDEX["max_weight"]] = torch.einsum("bhi,bi->h", a.amax(-1), rows[..., INDEX["max_weight"]])
    return sums


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [None, 3])
def test_contraction_equals_the_dense_weights(kind, block):
    lm = tiny_model(kind)
    texts = [Text(t, target=t[:25]) for t in TEXTS] if lm.kind == "encoder-decoder" else TEXTS
    captured = capture_attention(lm, texts)
    eos = lm.kind == "encoder-decoder"
    H = captured.probs[0].shape[1]
    stats = HeadStatistics(captured.sites, H, lm.tokenizer)
    checked = set()
    for s, (site, probs) in enumerate(zip(captured.sites, captured.probs)):
        queries, keys = sides(site, captured.batch)
        if block is None:
            stats.update(site, probs, captured.batch)
        else:
            for i0 in range(0, probs.shape[2], block):
                i1 = min(probs.shape[2], i0 + block)
                stats.update(site, probs[:, :, i0:i1], captured.batch, rows=(i0, i1))
        w, rows = dense_weights(site, queries, keys, lm.tokenizer, eos)
        expected = dense_sums(probs.float(), w, rows)
        torch.testing.assert_close(stats.sums[s], expected, rtol=1e-5, atol=1e-6)
        checked.add((site.kind, site.causal, site.window))
    # the site kinds this test is for were all there
    if kind == "qwen2-window":
        assert any(window is not None for _, _, window in checked)
    if kind == "bart":
        assert any(k == "cross" for k, _, _ in checked)
    assert len(checked) >= 1 and float(stats.sums.abs().sum()) > 0
