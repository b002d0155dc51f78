"""Head distance (docs/statistics.md, "Head distance and redundancy"): Jensen-Shannon divergence in bits per
real query row, token-weighted, accumulated in one pass; checked against SciPy row by row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from conftest import tiny_model
from probe.capture.maps import capture_attention
from probe.patterns.distance import HeadDistances
from probe.patterns.jsd import pairs, row_js, to_matrix
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.inputs import Batch, Text


def make_batch(lengths: list[int], index: list[int] | None = None) -> Batch:
    """A right-padded batch of the given real lengths (token ids do not matter here)."""
    B, T = len(lengths), max(lengths)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return Batch(torch.zeros(B, T, dtype=torch.long), mask, None, torch.zeros(B, T, 2, dtype=torch.long),
                 torch.zeros(B, T, dtype=torch.bool), torch.full((B, T), -1), [Text("x")] * B,
                 list(range(B)) if index is None else index, [False] * B)


def random_probs(lengths, heads: int, causal: bool, seed: int = 0, peaked: float = 3.0) -> torch.Tensor:
    """[batch, heads, T, T] softmax rows over each row's visible real keys (exact zeros elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    logits = torch.randn(B, heads, T, T, generator=g) * peaked
    keep = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        keep[b, :, :, :n] = True
    if causal:
        keep &= torch.ones(T, T, dtype=torch.bool).tril()
    return logits.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)


def scipy_mean(probs_by_site: list[torch.Tensor], lengths, causal: bool, rows=None) -> np.ndarray:
    """[K, K] mean over real rows of jensenshannon(p, q, base=2) ** 2, heads of all sites stacked."""
    K = sum(p.shape[1] for p in probs_by_site)
    total, n = np.zeros((K, K)), 0
    for b, L in enumerate(lengths):
        for i in range(L if rows is None else min(L, rows)):
            keys = i + 1 if causal else L
            vecs = [p[b, h, i, :keys].double().numpy() for p in probs_by_site for h in range(p.shape[1])]
            n += 1
            for h in range(K):
                for g in range(K):
                    total[h, g] += jensenshannon(vecs[h], vecs[g], base=2) ** 2
    return total / n


@pytest.mark.parametrize("causal", [False, True])
def test_layer_and_model_distance_equal_scipy_on_random_rows(causal):
    lengths = [7, 5, 2, 6]
    sites = [Site("decoder" if causal else "encoder", layer, causal=causal) for layer in range(2)]
    probs = [random_probs(lengths, 3, causal, seed=s) for s in range(2)]
    acc = HeadDistances(sites, 3, sample_rows=None, map_sample_rows=None)
    batch = make_batch(lengths)
    acc.begin_batch(batch)
    for site, p in zip(sites, probs):
        acc.update(site, p, batch)
    acc.end_batch(batch)  # the all-heads distance is computed once every site of the batch is in
    res = acc.result()
    for layer in range(2):
        np.testing.assert_allclose(res.layer[layer], scipy_mean([probs[layer]], lengths, causal), atol=2e-6)
    np.testing.assert_allclose(res.model, scipy_mean(probs, lengths, causal), atol=2e-6)
    assert res.layer_rows.tolist() == [sum(lengths)] * 2 and res.model_rows == sum(lengths)
    assert np.all(np.diag(res.model) == 0) and np.allclose(res.model, res.model.T)


def test_extremes_identical_rows_are_zero_and_disjoint_one_hot_rows_one_bit():
    x = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])  # one row, 3 heads
    js = to_matrix(row_js(x.T[None], torch.tensor([4])).numpy(), 3)[0]  # [rows, keys, heads]
    assert js[0, 1] == pytest.approx(0.0, abs=1e-7)
    assert js[0, 2] == pytest.approx(1.0, abs=1e-6) and js[1, 2] == pytest.approx(1.0, abs=1e-6)
    assert pairs(3)[0].tolist() == [0, 0, 1] and pairs(3)[1].tolist() == [1, 2, 2]


def test_map_sample_is_the_first_sequences_by_corpus_index_and_their_first_rows():
    lengths = [6, 4, 5]
    site = Site("encoder", 0)
    probs = random_probs(lengths, 3, causal=False, seed=3)
    acc = HeadDistances([site], 3, map_sequences=2, map_rows=3, sample_rows=None, map_sample_rows=None)
    feed(acc, site, probs, make_batch(lengths, index=[5, 1, 0]))  # length-sorted batches carry corpus indices
    res = acc.result()
    # rows 0..2 of the sequences with corpus index 1 and 0 (batch rows 1 and 2)
    want = scipy_mean([probs[1:]], lengths[1:], causal=False, rows=3)
    np.testing.assert_allclose(res.model, want, atol=2e-6)
    assert res.model_rows == 6 and res.map_seen == 2
    np.testing.assert_allclose(res.layer[0], scipy_mean([probs], lengths, causal=False), atol=2e-6)


def feed(acc: HeadDistances, site: Site, probs: torch.Tensor, batch: Batch) -> None:
    acc.begin_batch(batch)
    acc.update(site, probs, batch)
    acc.end_batch(batch)


def test_merge_of_two_halves_equals_one_pass_and_state_does_not_grow():
    site = Site("decoder", 0, causal=True)
    parts = [[5, 3], [4, 4, 2]]
    whole, halves = HeadDistances([site], 4, sample_rows=2), [HeadDistances([site], 4, sample_rows=2) for _ in parts]
    state = (whole.layer_est.total, whole.layer_est.var, whole.model_est.total, whole.model_est.var)
    sizes = [t.numel() for t in state]
    for k, lengths in enumerate(parts):
        batch = make_batch(lengths, index=[10 * k + i for i in range(len(lengths))])
        probs = random_probs(lengths, 4, True, k)
        feed(whole, site, probs, batch)
        feed(halves[k], site, probs, batch)
        # memory independent of how much went through; the per-batch cells are released
        assert [t.numel() for t in state] == sizes
        assert whole._map == {} and whole._seq == {}
    merged = halves[0].merge(halves[1])
    a, b = merged.result(), whole.result()
    np.testing.assert_allclose(a.layer, b.layer, atol=1e-12)
    np.testing.assert_allclose(a.model, b.model, atol=1e-12)
    np.testing.assert_allclose(a.layer_se, b.layer_se, atol=1e-12)
    assert a.layer_se[0][0, 1] > 0  # rows were sampled (2 of up to 5): an error is stated
    assert a.model_rows == b.model_rows == 18 and a.map_seen == 5
    with pytest.raises(ValueError):
        merged.merge(HeadDistances([site], 4, map_sequences=3))


def test_in_the_loop_on_a_tiny_model_matches_scipy_on_captured_maps():
    """Through analyze(): padded, length-sorted batches of a real (tiny) model; each layer's
    distance equals SciPy on the maps of each text captured alone; the all-heads matrix's diagonal
    blocks equal the per-layer matrices when every row is in the map; groups replace k-means."""
    lm = tiny_model("gpt2")
    texts = ["The cat sat on the mat.", "A dog.", "Birds sing in the morning, and fly away."]
    acc = HeadDistances(lm.sites, lm.geometry.n_heads, sample_rows=None, map_sample_rows=None)
    res = analyze(lm, texts, batch_size=2, n_examples=0, accumulators=[acc])
    dist = res.results["distances"]
    caps = [capture_attention(lm, t) for t in texts]
    lengths = [int(c.batch.lengths[0]) for c in caps]
    H = lm.geometry.n_heads
    for layer in range(lm.geometry.n_layers):
        total, n = np.zeros((H, H)), 0
        for c, L in zip(caps, lengths):
            total += scipy_mean([c[layer]], [L], causal=True) * L
            n += L
        np.testing.assert_allclose(dist.layer[layer], total / n, atol=5e-6)
        block = dist.model[layer * H:(layer + 1) * H, layer * H:(layer + 1) * H]
        np.testing.assert_allclose(block, dist.layer[layer], atol=1e-9)
    assert "group" in res.heads.columns and "cluster" not in res.heads.columns
    assert res.heads["group"].tolist() == dist.groups.group.tolist()
    plain = analyze(lm, texts, n_examples=0)
    assert "cluster" in plain.heads.columns and "group" not in plain.heads.columns
