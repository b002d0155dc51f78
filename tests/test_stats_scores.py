"""Statistics from the scores probe's attention function read (probe.measures.stats.map_sums with
``scores``), and the value-weighted map N~ computed without building it.

- Against the dense formulation (tests/test_stats_contraction.py's weights, float64): the entropies
  from the scores (-sum A ln A = ln Z sum_j A - sum_j A s) and every statistic of N~ (built here in
  float64 from the recorded value norms), on tiny models of four site kinds, whole maps and blocks.
- The same run with and without scores gives the same sums within float32 rounding.
- Scores that are not finite fall back to ln A (the same result as without scores); an edited
  pattern hands no scores; outside ``scored()`` the function keeps none.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_stats_contraction import TEXTS, dense_sums, dense_weights

from conftest import tiny_model
from probe.capture.hooks import measuring
from probe.capture.interface import edit, listen, scored
from probe.capture.maps import forward
from probe.capture.op import Scores
from probe.loading.seq2seq import sides
from probe.measures import stats
from probe.measures.accumulators import Accumulator
from probe.measures.stats import INDEX, HeadStatistics, map_sums
from probe.measures.statweights import TokenFeatures, contraction_weights, token_features
from probe.runs.analysis import run
from probe.sites import Site
from probe.text.inputs import Text, as_texts, iter_batches

KINDS = ("bert", "qwen2-window", "bart", "llama")


@pytest.fixture(autouse=True)
def scored_from_any_size(monkeypatch):
    """The tiny models' maps are small: every map takes the scores path here."""
    monkeypatch.setattr(stats, "SCORED_FROM", 0)


class Recorder(Accumulator):
    """Keeps every (site, probs, values, scores, rows) handed over."""

    reads_values = True
    reads_scores = True
    row_blocks = True

    def __init__(self) -> None:
        self.calls = []

    def update(self, site, probs, batch, values=None, rows=None, scores=None) -> None:
        self.calls.append((site, probs.clone(), values, scores, rows, batch))


class WithoutScores(HeadStatistics):
    reads_scores = False


def batches_of(lm):
    texts = [Text(t, target=t[:25]) for t in TEXTS] if lm.kind == "encoder-decoder" else TEXTS
    return list(iter_batches(lm, as_texts(texts), batch_size=8))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [0, 3])
def test_statistics_from_scores_and_norms_equal_the_dense_formulation(kind, block):
    lm = tiny_model(kind)
    rec = Recorder()
    run(lm, batches_of(lm), [rec], query_block=block)
    handed = [scores is not None for _, _, _, scores, _, _ in rec.calls]
    # whole maps: every call through probe's function hands its scores; row blocks of a hand-written
    # family come from the reference module's own blocks (no scores: the statistics take ln A there)
    assert handed and (all(handed) if not block or lm.spec.discovered else not any(handed))
    eos = lm.kind == "encoder-decoder"
    for site, probs, values, scores, rows, batch in rec.calls:
        queries, keys = sides(site, batch)
        a = probs.float()
        nk = a.shape[-1]
        if rows is not None and site.causal and site.kind != "cross":  # keys after the block's rows: 0
            nk -= queries.input_ids.shape[1] - rows[1]
        a = a[..., :nk]
        feats = token_features(queries, lm.tokenizer, eos)
        key_feats = token_features(keys, lm.tokenizer, eos) if site.kind == "cross" else None
        T = queries.input_ids.shape[1]
        w = contraction_weights(feats, site, probs.shape[-1] if site.kind != "cross" else T, key_feats, rows,
                                None if nk == probs.shape[-1] else nk)
        got, got_norm, empty = map_sums(a, w, values.norms[..., :nk], scores)
        dense_w, dense_rows = dense_weights(site, queries, keys, lm.tokenizer, eos)
        i0, i1 = rows if rows is not None else (0, a.shape[2])
        dense_w, dense_rows = dense_w[:, i0:i1, :nk], dense_rows[:, i0:i1]
        torch.testing.assert_close(got, dense_sums(a, dense_w, dense_rows), rtol=1e-5, atol=2e-6)
        n = values.norms[..., :nk].double()
        big = a.double() * n[:, :, None, :]
        total = big.sum(-1, keepdim=True)
        tilde = torch.where(total > 0, big / total, 0.0)  # N~, built here in float64
        expected = dense_sums(tilde, dense_w, dense_rows)
        torch.testing.assert_close(got_norm, expected, rtol=1e-5, atol=2e-6)
        assert not bool((empty & (w.real_rows[:, None, :] > 0)).any())  # every real row has a value-weighted map


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_with_scores_equals_one_without(kind):
    lm = tiny_model(kind)
    H = lm.geometry.n_heads
    results = []
    for cls in (HeadStatistics, WithoutScores):
        acc = cls(lm.sites, H, lm.tokenizer, value_weighted=True)
        run(lm, batches_of(lm), [acc])
        results.append(acc)
    with_scores, without = results
    torch.testing.assert_close(with_scores.sums, without.sums, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(with_scores.norm_sums, without.norm_sums, rtol=1e-5, atol=1e-6)
    assert torch.equal(with_scores.counts, without.counts)
    assert torch.equal(with_scores.norm_counts, without.norm_counts)
    ent = with_scores.sums[..., INDEX["entropy"]]
    assert bool((ent > 0).all())  # random heads attend broadly: the compared entropies are not all 0


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_entropies_from_scores_equal_those_from_ln_a(kind, dtype):
    """A half-precision model's probabilities are its float32 softmax rounded to the dtype: the
    entropy from the scores (the rounding drift taken out) equals -sum A ln A of the rounded map
    within 0.1 eps of the dtype (measured: at most 0.08 eps), for A and for N~."""
    lm = tiny_model(kind)
    lm.model.to(dtype)
    results = []
    for cls in (HeadStatistics, WithoutScores):
        acc = cls(lm.sites, lm.geometry.n_heads, lm.tokenizer, value_weighted=True)
        run(lm, batches_of(lm), [acc])
        results.append(acc)
    eps = torch.finfo(dtype).eps
    for name in ("entropy", "norm_entropy"):
        means = [acc.means()[..., INDEX[name]] for acc in results]
        by_norm = [acc.means_by_norm()[..., INDEX[name]] for acc in results]
        assert abs(means[0] - means[1]).max() <= 0.1 * eps
        assert abs(by_norm[0] - by_norm[1]).max() <= 0.1 * eps
        assert (means[0] > 0).all()


def test_entropy_identity_on_hand_made_scores_and_the_fallback():
    """ln Z sum_j A - sum_j A s equals -sum A ln A on a masked map; a score that is not finite at a
    masked key makes the statistics fall back to ln A, with the result of a call without scores."""
    torch.manual_seed(0)
    B, H, T = 2, 3, 7
    s = torch.randn(B, H, T, T) * 4
    keep = torch.ones(B, 1, T, T, dtype=torch.bool)
    keep[1, ..., 5:] = False  # the second sequence has 5 real keys
    masked = s.masked_fill(~keep, -math.inf)
    a = torch.softmax(masked, -1)
    real = torch.tensor([[True] * T, [True] * 5 + [False] * 2])
    feats = TokenFeatures(real=real, sep=torch.zeros(B, T, dtype=torch.bool),
                          punct=torch.zeros(B, T, dtype=torch.bool), has_sep=False)
    site = Site(stack="encoder", layer=0)
    w = contraction_weights(feats, site, T)
    norms = torch.rand(B, H, T) + 0.1
    plain = map_sums(a, w, norms)
    fast = map_sums(a, w, norms, Scores(s, masked.amax(-1)))
    for got, want in zip(fast[:2], plain[:2]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    expected = -(torch.special.xlogy(a.double(), a.double())).sum(-1)  # [B, H, T]
    expected = (expected * real[:, None, :]).sum((0, 2))
    torch.testing.assert_close(fast[0][:, INDEX["entropy"]], expected, rtol=1e-5, atol=1e-6)
    broken = s.clone()
    broken[1, 0, 0, 6] = math.inf  # a masked key's score: A is 0 there, 0 * inf is NaN
    fallback = map_sums(a, w, norms, Scores(broken, masked.amax(-1)))
    for got, want in zip(fallback[:2], plain[:2]):
        assert torch.equal(got, want)


def test_scores_are_kept_only_when_asked_and_dropped_for_an_edited_pattern():
    lm = tiny_model("llama")
    batch = batches_of(lm)[0]
    module = dict(lm.model.named_modules())["model.layers.0.self_attn"]
    seen = []
    handle = listen(module, lambda call: seen.append(call.scores))
    try:
        with torch.no_grad(), measuring(lm.model):
            forward(lm, batch)
            with scored():
                forward(lm, batch)
                editing = edit(module, "pattern", lambda p, call: p * 1.0)
                try:
                    forward(lm, batch)
                finally:
                    editing.remove()
    finally:
        handle.remove()
    assert seen[0] is None and seen[2] is None
    kept = seen[1]
    assert isinstance(kept, Scores) and kept.values.shape[-2:] == (batch.input_ids.shape[1],) * 2
    # the row max is that of the keys the causal mask keeps: row 0 sees key 0 only
    assert torch.equal(kept.top[..., 0], kept.values[..., 0, 0])
