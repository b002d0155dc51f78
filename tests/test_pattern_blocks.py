"""The row-block protocol for the pattern accumulators (distances, Kovaleva types, padding health):
fed the same attention maps as blocks of query rows (``rows=(i0, i1)``: blocks of 1 row, of a size
that does not divide T, and one block), each gives the result of the whole maps within 1e-5; and the
vectorized Jensen-Shannon divergence equals the per-pair formula computed independently here."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from probe.measures.accumulators import Accumulator
from probe.patterns import HeadDistances, HealthProbe, PatternTypes
from probe.runs.analysis import analyze

TEXTS = ["The cat sat on the mat, and then it slept.", "A dog.", "Birds sing in the morning; they fly away.",
         "Rain.", "Seven small boats left the harbour before dawn."]


class Recorder(Accumulator):
    """Keeps every (batch, {site: maps}) the analysis loop hands out (dense maps)."""

    name = "recorder"

    def __init__(self) -> None:
        self.batches = []

    def begin_batch(self, batch) -> None:
        self.batches.append((batch, {}))

    def update(self, site, probs, batch) -> None:
        self.batches[-1][1][site] = probs.detach().clone()

    def result(self):
        return len(self.batches)


@functools.cache
def recorded(kind: str):
    lm = tiny_model(kind)
    rec = Recorder()
    analyze(lm, TEXTS, batch_size=3, n_examples=0, accumulators=[rec])
    return lm, rec.batches


def feed(acc, batches, block: int | None) -> None:
    """Whole maps (block None) or blocks of ``block`` query rows, in row order, site by site."""
    for batch, maps in batches:
        acc.begin_batch(batch)
        for site, probs in maps.items():
            T = probs.shape[-2]
            if block is None:
                acc.update(site, probs, batch)
                continue
            for i0 in range(0, T, block):
                i1 = min(T, i0 + block)
                acc.update(site, probs[:, :, i0:i1].contiguous(), batch, rows=(i0, i1))
        acc.end_batch(batch)


def make(kind_of_acc: str, lm, **kw):
    H = lm.geometry.n_heads
    if kind_of_acc == "distances":
        return HeadDistances(lm.sites, H, **kw)
    if kind_of_acc == "types":
        return PatternTypes(lm.sites, H, lm.tokenizer)
    return HealthProbe(lm.sites)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
@pytest.mark.parametrize("block", [1, 3, 1000])
def test_row_blocks_give_the_whole_map_result(kind, block):
    lm, batches = recorded(kind)
    T_max = max(p.shape[-2] for _, maps in batches for p in maps.values())
    assert T_max % 3 != 0 or block != 3  # a block size that does not divide T is among the cases
    for which, kw in [("distances", {"sample_rows": 3, "map_sample_rows": 2}), ("distances", {}),
                      ("types", {}), ("health", {})]:
        dense, blocked = make(which, lm, **kw), make(which, lm, **kw)
        assert blocked.row_blocks
        feed(dense, batches, None)
        feed(blocked, batches, block)
        a, b = dense.result(), blocked.result()
        if which == "distances":
            for field in ("layer", "model", "layer_se", "model_se"):
                np.testing.assert_allclose(getattr(b, field), getattr(a, field), atol=1e-5, err_msg=field)
            assert a.model_rows == b.model_rows and (a.layer_rows == b.layer_rows).all()
        elif which == "types":
            assert (blocked.counts == dense.counts).all() and dense.counts.sum() > 0
        else:
            assert b["padding_cells"] == a["padding_cells"] > 0
            np.testing.assert_allclose(b["per_site"], a["per_site"], atol=1e-7)


def per_pair_js(p: np.ndarray, q: np.ndarray) -> float:
    """JS divergence in bits by its definition, H(m) - (H(p) + H(q)) / 2, one pair of rows."""
    def h(v):
        v = v[v > 0]
        return float(-(v * np.log2(v)).sum())
    return h((p + q) / 2) - (h(p) + h(q)) / 2


def test_vectorized_distance_equals_the_per_pair_formula_on_a_tiny_model():
    lm, batches = recorded("gpt2")
    acc = HeadDistances(lm.sites, lm.geometry.n_heads, sample_rows=None, map_sample_rows=None)
    feed(acc, batches, None)
    res = acc.result()
    H, S = lm.geometry.n_heads, len(lm.sites)
    total, rows = np.zeros((S * H, S * H)), 0
    for batch, maps in batches:
        stacked = torch.cat([maps[s] for s in lm.sites], 1).double().numpy()  # [B, S * H, T, T]
        for b, n in enumerate(batch.lengths.tolist()):
            for i in range(n):
                vecs = stacked[b, :, i, :i + 1]  # causal: keys 0..i
                rows += 1
                for h in range(S * H):
                    for g in range(h + 1, S * H):
                        total[h, g] += per_pair_js(vecs[h], vecs[g])
    want = (total + total.T) / rows
    np.testing.assert_allclose(res.model, want, atol=2e-6)
    for s in range(S):
        np.testing.assert_allclose(res.layer[s], want[s * H:(s + 1) * H, s * H:(s + 1) * H], atol=2e-6)
    assert np.all(res.layer_se == 0) and np.all(res.model_se == 0)  # every row taken: no sampling error


def test_sampled_distance_is_unbiased_and_its_stated_error_is_its_spread():
    """Rows sampled (2 per sequence) with 60 different seeds: the estimates average to the every-row
    value (within 4 standard errors of that average) and their spread over seeds is the stated
    standard error (root mean square of the stated errors / spread within 0.75-1.33, median over pairs)."""
    lm, batches = recorded("bert")
    full = HeadDistances(lm.sites, lm.geometry.n_heads, sample_rows=None, map_sample_rows=None)
    feed(full, batches, None)
    exact = full.result().layer
    estimates, errors = [], []
    for seed in range(60):
        acc = HeadDistances(lm.sites, lm.geometry.n_heads, sample_rows=2, map_sample_rows=2, seed=seed)
        feed(acc, batches, None)
        r = acc.result()
        estimates.append(r.layer)
        errors.append(r.layer_se)
    off = ~np.eye(lm.geometry.n_heads, dtype=bool)
    est, se = np.stack(estimates)[:, :, off], np.stack(errors)[:, :, off]  # [seeds, sites, pairs]
    spread = est.std(0, ddof=1)
    assert (se > 0).all()
    assert (np.abs(est.mean(0) - exact[:, off]) <= 4 * spread / math.sqrt(len(est)) + 1e-9).all()
    ratio = np.sqrt((se ** 2).mean(0)) / spread
    assert 0.75 <= float(np.median(ratio)) <= 1.33
