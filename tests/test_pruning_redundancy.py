"""probe.pruning.redundancy: Jensen-Shannon divergence against scipy, pairwise distances of heads,
and the redundancy order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from conftest import tiny_model, tolerance
from probe.capture import capture_attention
from probe.inputs import Text, iter_batches
from probe.pruning.redundancy import HeadDistances, js_divergence, nearest, pairwise_js, redundancy_pick


def _dist(rng, n, zeros=0):
    p = rng.random(n)
    p[:zeros] = 0.0
    return p / p.sum()


def test_js_divergence_equals_scipy_squared():
    rng = np.random.default_rng(0)
    for zeros in (0, 2):
        p, q = _dist(rng, 7, zeros), _dist(rng, 7)
        want = jensenshannon(p, q, base=2) ** 2
        got = float(js_divergence(torch.tensor(p), torch.tensor(q)))
        assert got == pytest.approx(want, abs=1e-12)
    one_hot = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert float(js_divergence(*one_hot)) == pytest.approx(1.0, abs=1e-12)  # disjoint supports: 1 bit
    assert float(js_divergence(one_hot[0], one_hot[0])) == 0.0


def test_pairwise_js_sums_scipy_over_rows():
    rng = np.random.default_rng(1)
    H, n = 3, 70  # more rows than one chunk
    probs = np.stack([[_dist(rng, n, zeros=i % 3) for i in range(n)] for _ in range(H)])
    got = pairwise_js(torch.tensor(probs)).numpy()
    for h in range(H):
        for g in range(H):
            want = sum(jensenshannon(probs[h, i], probs[g, i], base=2) ** 2 for i in range(n))
            assert got[h, g] == pytest.approx(want, abs=1e-9)
    assert np.allclose(np.diag(got), 0.0)


def test_head_distances_on_a_model_are_token_weighted_means_of_scipy():
    lm = tiny_model("gpt2")
    texts = ["The cat sat on the mat.", "Dogs bark.", "A bird sang all morning in the old tree."]
    acc = HeadDistances(lm.sites, lm.geometry.n_heads)
    for batch in iter_batches(lm, [Text(t) for t in texts], batch_size=2):
        cap = capture_attention(lm, [t.text for t in batch.texts])
        acc.begin_batch(batch)
        for site in lm.sites:
            acc.update(site, cap[site], cap.batch)
    result = acc.result().numpy()
    layer, h, g = 1, 0, 2
    total, rows = 0.0, 0
    for t in texts:
        p = capture_attention(lm, [t])[layer][0].double().numpy()
        total += sum(jensenshannon(p[h, i], p[g, i], base=2) ** 2 for i in range(p.shape[1]))
        rows += p.shape[1]
    assert result[layer, h, g] == pytest.approx(total / rows, abs=tolerance("probability")["atol"])
    assert result[layer, g, h] == pytest.approx(total / rows, abs=tolerance("probability")["atol"])


def test_duplicated_heads_are_at_distance_zero():
    probs = torch.softmax(torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    probs[:, 2] = probs[:, 0]
    d = pairwise_js(probs[0])
    assert float(d[0, 2]) == 0.0 and float(d[0, 1]) > 0.01


def test_redundancy_pick_hand_example():
    # layer 0: heads 0 and 1 near-duplicates (0.01), head 1 the less important -> 1 goes first;
    # layer 1: 2 and 3 at 0.03, 3 less important -> next; then the closest remaining pair
    inf = math.nan
    D = torch.full((2, 4, 4), 0.5)
    D[0, 0, 1] = D[0, 1, 0] = 0.01
    D[1, 2, 3] = D[1, 3, 2] = 0.03
    D[0, 2, 3] = D[0, 3, 2] = 0.2
    for layer in range(2):
        D[layer].fill_diagonal_(0.0)
    imp = torch.tensor([[0.9, 0.1, 0.5, 0.6], [0.5, 0.5, 0.8, 0.2]])
    mask = torch.ones(2, 4)
    assert redundancy_pick(D, imp, mask, 3) == [(0, 1), (1, 3), (0, 2)]
    # a removed head (NaN distances, mask 0) is never a partner
    D2 = D.clone()
    D2[0, 1, :] = D2[0, :, 1] = inf
    mask2 = mask.clone()
    mask2[0, 1] = 0
    assert redundancy_pick(D2, imp, mask2, 1) == [(1, 3)]
    # layers down to one head: the least important heads go
    single = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    assert redundancy_pick(D, imp, single, 2) == [(1, 3), (0, 0)]


def test_nearest():
    D = torch.tensor([[[0.0, 0.2, 0.4], [0.2, 0.0, 0.1], [0.4, 0.1, 0.0]]])
    assert nearest(D, torch.ones(1, 3))[0].tolist() == pytest.approx([0.2, 0.1, 0.1])
    got = nearest(D, torch.tensor([[1.0, 0.0, 1.0]]))
    assert got[0, 0].item() == pytest.approx(0.4) and math.isnan(got[0, 1].item())
