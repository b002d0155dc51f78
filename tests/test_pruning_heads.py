"""probe.loading.pruned: original numbering, per-layer layouts (grouped key/value heads,
placeholders), the JSON record, and probabilities put back into the original numbering."""

from __future__ import annotations

import math

import pytest
import torch

from probe.causal.heads import normalize_heads
from probe.errors import InputError
from probe.loading.pruned import LayerLayout, PrunedHeads, full_layout, plan_layer


def test_plan_without_groups_keeps_heads_in_order():
    assert plan_layer([3, 0, 2], 4, 4) == LayerLayout((0, 2, 3), (0, 2, 3))
    assert plan_layer(range(4), 4, 4) == full_layout(4, 4)


def test_plan_with_every_head_pruned_keeps_one_placeholder():
    assert plan_layer([], 12, 12) == LayerLayout((None,), (None,))
    assert plan_layer([], 9, 3) == LayerLayout((None,), (None,))


def test_plan_grouped_heads_hand_computed():
    # SmolLM2's shape: 9 query heads, 3 key/value heads, groups {0,1,2} {3,4,5} {6,7,8}; equal costs
    # g=3: 2 groups -> 2 * (3 + 1) = 8; g=2: 1 + 1 chunks... {0} -> 1 chunk, {6,7} -> 1 chunk: 2 * (2 + 1) = 6;
    # g=1: 3 * (1 + 1) = 6 -> tie, the larger g wins
    lay = plan_layer([0, 6, 7], 9, 3)
    assert lay == LayerLayout((0, None, 6, 7), (0, 2))
    assert lay.group == 2 and lay.heads == (0, 6, 7) and lay.placeholders == 1
    # whole groups: g=3 needs no placeholder and the fewest key/value heads
    assert plan_layer([3, 4, 5, 6, 7, 8], 9, 3) == LayerLayout((3, 4, 5, 6, 7, 8), (1, 2))
    # one head left in each of two groups: g=1 (2 q + 2 kv = 4 units) beats g=3 (2 * 4 = 8)
    assert plan_layer([1, 5], 9, 3) == LayerLayout((1, 5), (0, 1))
    # a query slot costing much more than a key/value slot favours duplicating key/value heads
    assert plan_layer([0, 1, 3], 4, 2, q_cost=10, kv_cost=1) == LayerLayout((0, 1, 3), (0, 0, 1))


@pytest.mark.parametrize("kept,n_heads,n_kv", [([0, 6, 7], 9, 3), ([1, 2, 3, 5, 8], 9, 3), ([0], 4, 1),
                                                ([0, 1, 2], 4, 2), ([5], 8, 2)])
def test_plan_is_valid_and_cheapest(kept, n_heads, n_kv):
    lay = plan_layer(kept, n_heads, n_kv)
    per_kv = n_heads // n_kv
    assert lay.heads == tuple(sorted(kept))
    assert len(lay.q) % len(lay.kv) == 0
    g = lay.group
    for slot, h in enumerate(lay.q):  # every kept query head reads its own key/value head
        if h is not None:
            assert lay.kv[slot // g] == h // per_kv
    # a key/value head is kept exactly when one of its query heads is
    assert set(lay.kv) == {h // per_kv for h in kept}
    groups = {}
    for h in kept:
        groups.setdefault(h // per_kv, []).append(h)
    best = min(sum(math.ceil(len(s) / x) * (x + 1) for s in groups.values()) for x in range(1, per_kv + 1))
    assert len(lay.q) + len(lay.kv) == best


def test_normalize_heads():
    assert normalize_heads({1: [3, 2, 2], 0: [1], 2: []}, 3, 4) == {0: (1,), 1: (2, 3)}
    assert normalize_heads([(1, 0), (0, 3)], 2, 4) == {0: (3,), 1: (0,)}
    with pytest.raises(InputError, match="layer 5 out of range"):
        normalize_heads({5: [0]}, 3, 4)
    with pytest.raises(InputError, match="head L0H4 out of range: layers have heads 0-3"):
        normalize_heads({0: [4]}, 3, 4)
    with pytest.raises(InputError, match="integers"):
        normalize_heads({0: ["1"]}, 3, 4)


def test_pruned_heads_record_round_trip_and_mask():
    p = PrunedHeads(4, 4, [LayerLayout((0, 2, 3), (0, 2, 3)), full_layout(4, 4), LayerLayout((None,), (None,))])
    rec = p.to_json()
    assert rec["pruned_heads"] == {"0": [1], "2": [0, 1, 2, 3]}
    assert rec["heads_per_layer"] == [3, 4, 0]
    assert PrunedHeads.from_json(rec) == p
    assert p.mask().tolist() == [[1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    with pytest.raises(InputError, match="not a probe pruned-heads file"):
        PrunedHeads.from_json({"format": "other"})


def test_expand_puts_slots_back_in_original_numbering():
    p = PrunedHeads(4, 2, [LayerLayout((0, None, 2, 3), (0, 1)), full_layout(4, 2)])
    probs = torch.arange(4.0).reshape(1, 4, 1, 1).expand(2, 4, 3, 3)  # slot s holds value s
    out = p.expand(0, probs)
    assert out.shape == (2, 4, 3, 3)
    assert out[:, 0].eq(0).all() and out[:, 2].eq(2).all() and out[:, 3].eq(3).all()
    assert out[:, 1].isnan().all()  # head 1 is gone; the placeholder slot (1) is dropped
    assert p.expand(1, probs) is probs
