"""probe.pruning.redundancy: the within-layer distance it reads (probe.patterns.distance) against
scipy, the one near-duplicate threshold, and the redundancy order."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from conftest import tiny_model, tolerance
from probe.capture.maps import capture_attention
from probe.patterns.distance import NEAR_DUPLICATE, HeadDistances
from probe.patterns.health import HEALTH_RULES
from probe.pruning.redundancy import nearest, redundancy_pick
from probe.runs.analysis import run
from probe.text.inputs import Text, iter_batches


def test_the_within_layer_distance_pruning_reads_is_the_token_weighted_mean_of_scipy():
    # pruning's redundancy order reads probe.patterns.distance (the one implementation), per layer only
    lm = tiny_model("gpt2")
    texts = ["The cat sat on the mat.", "Dogs bark.", "A bird sang all morning in the old tree."]
    acc = HeadDistances(lm.sites, lm.geometry.n_heads, map_sequences=0)
    run(lm, iter_batches(lm, [Text(t) for t in texts], batch_size=2), [acc])
    result = acc.result()
    assert result.model is None and result.layer.shape == (len(lm.sites), lm.geometry.n_heads, lm.geometry.n_heads)
    layer, h, g = 1, 0, 2
    total, rows = 0.0, 0
    for t in texts:
        p = capture_attention(lm, [t])[layer][0].double().numpy()
        total += sum(jensenshannon(p[h, i], p[g, i], base=2) ** 2 for i in range(p.shape[1]))
        rows += p.shape[1]
    assert result.layer[layer, h, g] == pytest.approx(total / rows, abs=tolerance("probability")["atol"])
    assert result.layer[layer, g, h] == pytest.approx(total / rows, abs=tolerance("probability")["atol"])


def test_one_near_duplicate_threshold():
    assert NEAR_DUPLICATE == 0.05
    assert HEALTH_RULES["duplicates"][:3] == ("distance", NEAR_DUPLICATE, "<")


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
