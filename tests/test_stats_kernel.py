"""The statistics' compiled pass (probe.measures.kernel) against the torch path of
probe.measures.stats.map_sums, the reference: docs/statistics.md, "Two paths, one set of numbers".

- Random maps with right padding, causal masks, sliding windows, sinks (most of a row's mass on the
  first key), half-precision probabilities read as float32, cross-attention, row blocks, with and
  without value norms and scores: every sum within 1e-6 relative of the torch path's, the same
  empty rows; a removed head's NaN stays NaN on both paths.
- The choice is made in one place (stats_path): PROBE_STATS_PATH=torch, a missing numba, a float64
  or non-CPU map all take the torch path, with the same numbers; a bad path name is an error.
- heads.csv of tiny models is the same at its six digits on both paths.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_model
from probe.capture.op import Scores
from probe.measures import kernel, stats
from probe.measures.kernel import PATH_ENV, stats_path
from probe.measures.stats import INDEX, map_sums
from probe.measures.statweights import TokenFeatures, contraction_weights
from probe.report import heads_csv
from probe.runs.analysis import analyze
from probe.sites import Site

pytestmark = pytest.mark.skipif(kernel._compiled() is None, reason="numba is not installed")

TEXTS = ["The cat sat on the mat and looked around the room, quietly.", "A dog.",
         "Hi there, friend! How are you today?",
         "Numbers like 3.14 and 2.71 appear here; so do commas, colons: and dashes - too."]


def features(lengths: list[int], T: int, gen: torch.Generator) -> TokenFeatures:
    """Right-padded features: a sep token at each sequence's end, random punctuation."""
    B = len(lengths)
    real = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    sep = torch.zeros(B, T, dtype=torch.bool)
    sep[torch.arange(B), torch.tensor(lengths) - 1] = True
    punct = (torch.rand(B, T, generator=gen) < 0.25) & real
    return TokenFeatures(real, sep, punct, True)


def maps(keep: torch.Tensor, gen: torch.Generator, sink: float = 0.0, half: torch.dtype | None = None):
    """Softmax maps [B, H, R, K] over the kept keys, their Scores, and value norms [B, H, K]: random
    scores, plus ``sink`` on key 0 (a sink head); ``half``: the probabilities rounded to that dtype
    (a half-precision model's maps) and read back as float32."""
    B, H, R, K = keep.shape
    s = torch.randn(B, H, R, K, generator=gen) * 2
    s[..., 0] += sink
    masked = s.masked_fill(~keep, -torch.inf)
    a = torch.softmax(masked, -1).nan_to_num(0.0)  # a row with no kept key: all 0
    if half is not None:
        a = a.to(half).float()
    norms = torch.rand(B, H, K, generator=gen) * 3
    norms[:, :, -1] = 0.0  # a key with no value (a padded key's norm may be anything)
    return a, Scores(s, masked.amax(-1)), norms


def assert_same(w, a, norms, scores, rtol=1e-6):
    t = map_sums(a, w, norms, scores, path="torch")
    k = map_sums(a, w, norms, scores, path="kernel")
    for x, y in zip(t, k):
        if x is None:
            assert y is None
        elif x.dtype == torch.bool:
            assert torch.equal(x, y)
        else:
            assert y.dtype == torch.float64 and y.shape == x.shape
            scale = float(x.nan_to_num().abs().max())
            torch.testing.assert_close(y, x, rtol=rtol, atol=rtol * scale * 1e-3, equal_nan=True)


CASES = {  # name -> (site, lengths, T)
    "bidirectional": (Site("encoder", 0), [9, 7, 5, 2], 9),
    "causal": (Site("decoder", 0, causal=True), [12, 12, 6], 12),
    "window": (Site("decoder", 0, causal=True, window=4), [11, 8], 11),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("scored", [False, True])
@pytest.mark.parametrize("sink", [0.0, 8.0])
def test_kernel_equals_the_torch_path_on_self_attention(name, scored, sink, monkeypatch):
    monkeypatch.setattr(stats, "SCORED_FROM", 0 if scored else 2 ** 62)
    site, lengths, T = CASES[name]
    gen = torch.Generator().manual_seed(len(name) + int(sink))
    feats = features(lengths, T, gen)
    w = contraction_weights(feats, site, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    keep = feats.real[:, None, None, :].expand(len(lengths), 3, T, T).clone()
    if site.causal:
        keep &= j <= i
    if site.window:
        keep &= j > i - site.window
    a, scores, norms = maps(keep, gen, sink)
    for n in (None, norms):
        assert_same(w, a, n, scores if scored else None)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_kernel_equals_the_torch_path_on_half_precision_maps(half, monkeypatch):
    monkeypatch.setattr(stats, "SCORED_FROM", 0)
    site, lengths, T = CASES["causal"]
    gen = torch.Generator().manual_seed(3)
    feats = features(lengths, T, gen)
    keep = feats.real[:, None, None, :] & (torch.arange(T)[None] <= torch.arange(T)[:, None])
    a, scores, norms = maps(keep.expand(len(lengths), 2, T, T), gen, 4.0, half)
    # the rounded rows no longer sum to 1 exactly: the entropy from the scores corrects for that on both paths
    assert float((a.sum(-1)[feats.real[:, None].expand(-1, 2, -1)] - 1).abs().max()) > 1e-4
    assert_same(contraction_weights(feats, site, T), a, norms, scores)


def test_kernel_equals_the_torch_path_on_cross_attention():
    gen = torch.Generator().manual_seed(5)
    target, source = features([6, 4, 3], 6, gen), features([9, 5, 7], 9, gen)
    w = contraction_weights(target, Site("decoder", 0, kind="cross"), 6, source)
    keep = source.real[:, None, None, :].expand(3, 2, 6, 9)
    a, _, norms = maps(keep, gen, 2.0)
    assert_same(w, a, norms, None)
    sums = map_sums(a, w, norms, path="kernel")[0]
    assert float(sums[:, INDEX["aligned"]].abs().sum()) > 0 and float(sums[:, INDEX["self"]].abs().sum()) == 0


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_of_rows_add_up_to_the_whole_map_on_both_paths(causal):
    site, lengths, T = Site("decoder", 0, causal=causal), [10, 7], 10
    gen = torch.Generator().manual_seed(7)
    feats = features(lengths, T, gen)
    keep = feats.real[:, None, None, :] & ((torch.arange(T)[None] <= torch.arange(T)[:, None]) | (not causal))
    a, _, norms = maps(keep.expand(2, 3, T, T), gen)
    whole = map_sums(a, contraction_weights(feats, site, T), norms, path="torch")
    blocks = [torch.zeros_like(whole[0]), torch.zeros_like(whole[1])]
    for i0, i1 in ((0, 4), (4, 7), (7, 10)):
        nk = i1 if causal else T  # a causal block's later keys are exactly 0: cut, as HeadStatistics does
        w = contraction_weights(feats, site, T, rows=(i0, i1), n_keys=None if nk == T else nk)
        part = a[:, :, i0:i1, :nk]
        assert_same(w, part, norms[..., :nk], None)
        got = map_sums(part, w, norms[..., :nk], path="kernel")
        blocks[0] += got[0]
        blocks[1] += got[1]
    torch.testing.assert_close(blocks[0], whole[0], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(blocks[1], whole[1], rtol=1e-6, atol=1e-9)


def test_a_removed_heads_nan_stays_nan_and_empty_rows_are_the_same():
    site, lengths, T = CASES["bidirectional"]
    gen = torch.Generator().manual_seed(11)
    feats = features(lengths, T, gen)
    a, scores, norms = maps(feats.real[:, None, None, :].expand(4, 3, T, T), gen)
    a[:, 1] = float("nan")  # a pruned head
    norms[:, 2] = 0.0  # a head whose values are all 0: every row of its value-weighted map is empty
    w = contraction_weights(feats, site, T)
    assert_same(w, a, norms, scores)
    sums, norm_sums, empty = map_sums(a, w, norms, scores, path="kernel")
    measured = [INDEX[n] for n in stats.STATISTICS]  # aligned is no statistic of self-attention: 0 on every head
    assert bool(sums[1, measured].isnan().all()) and not bool(sums[[0, 2]].isnan().any())
    assert bool(empty[:, 2].all()) and float(norm_sums[2].abs().sum()) == 0


def test_the_parallel_kernel_gives_the_serial_ones_sums(monkeypatch):
    """Under several torch threads (numba's parallel loop over (batch, head) pairs, here from any map
    size): the same sums as on one thread, bit for bit (each pair adds its own rows), and the torch path's."""
    site, lengths, T = CASES["causal"]
    gen = torch.Generator().manual_seed(13)
    feats = features(lengths, T, gen)
    keep = feats.real[:, None, None, :] & (torch.arange(T)[None] <= torch.arange(T)[:, None])
    a, scores, norms = maps(keep.expand(len(lengths), 4, T, T), gen, 3.0)
    w = contraction_weights(feats, site, T)
    threads = torch.get_num_threads()
    monkeypatch.setattr(kernel, "PARALLEL_FROM", 0)
    try:
        torch.set_num_threads(1)
        serial = map_sums(a, w, norms, scores, path="kernel")
        torch.set_num_threads(2)
        parallel = map_sums(a, w, norms, scores, path="kernel")
        assert_same(w, a, norms, scores)
    finally:
        torch.set_num_threads(threads)
    assert kernel._compiled().statistics_kernel.signatures  # the parallel kernel ran
    for x, y in zip(serial, parallel):
        assert torch.equal(x, y)


def test_the_path_is_chosen_in_one_place(monkeypatch):
    a = torch.rand(1, 1, 2, 2)
    assert stats_path(a) == "kernel" and stats_path(a, "torch") == "torch"
    assert stats_path(a.double()) == "torch" and stats_path(a.to("meta")) == "torch"
    monkeypatch.setenv(PATH_ENV, "torch")
    assert stats_path(a) == "torch" and stats_path(a, "kernel") == "kernel"
    monkeypatch.setenv(PATH_ENV, "numba")
    with pytest.raises(ValueError, match=PATH_ENV):
        stats_path(a)
    monkeypatch.delenv(PATH_ENV)
    monkeypatch.setattr(kernel, "_compiled", lambda: None)  # numba missing: the torch path, silently
    assert stats_path(a) == "torch" and stats_path(a, "kernel") == "torch"


def sixth_digit(x: np.ndarray) -> np.ndarray:
    """One unit in the sixth significant digit of each value (heads.csv's last digit)."""
    return 10.0 ** (np.floor(np.log10(np.maximum(np.abs(x), 1e-300))) - 5)


def test_a_kernel_that_does_not_compile_leaves_the_torch_path(monkeypatch, capsys):
    """numba present but failing to compile: one line on stderr, then the torch path (stats_path)."""
    def fail(numba):
        raise RuntimeError("no compiler")

    a = torch.rand(1, 1, 2, 2)
    monkeypatch.setattr(kernel, "_jit", fail)
    kernel._compiled.cache_clear()
    try:
        assert stats_path(a) == "torch" and stats_path(a) == "torch"
        err = capsys.readouterr().err
        assert err.count("did not compile (RuntimeError)") == 1 and len(err.strip().splitlines()) == 1
    finally:
        monkeypatch.undo()
        kernel._compiled.cache_clear()  # the next use loads numba's cache again
    assert stats_path(a) == "kernel"


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_heads_csv_is_the_same_on_both_paths(kind, monkeypatch):
    """heads.csv of a tiny model on the kernel, on the torch path forced by the environment variable,
    and with numba missing (the fallback): the same columns and rows, every number within 1e-6
    relative, so the six digits heads.csv writes agree up to one unit in the last where a value lies
    at a rounding boundary (the torch path rounds each row's value to float32; the kernel keeps
    float64). The fallback is the torch path itself: its table is the same to the last bit."""
    lm = tiny_model(kind)
    tables = []
    for env, compiled in (("kernel", kernel._compiled), ("torch", kernel._compiled), ("kernel", lambda: None)):
        monkeypatch.setenv(PATH_ENV, env)
        monkeypatch.setattr(kernel, "_compiled", compiled)
        tables.append(heads_csv(analyze(lm, TEXTS, batch_size=2)))
    k, t, fallback = tables
    pd.testing.assert_frame_equal(fallback, t, check_exact=True)
    assert list(k.columns) == list(t.columns) and "entropy_by_norm" in k.columns
    numbers = [c for c in k.columns if k[c].dtype.kind == "f"]
    pd.testing.assert_frame_equal(k.drop(columns=numbers), t.drop(columns=numbers))
    x, y = k[numbers].to_numpy(), t[numbers].to_numpy()
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12)
    written = [pd.read_csv(io.StringIO(f.to_csv(index=False, float_format="%.6g")))[numbers].to_numpy()
               for f in (k, t)]
    assert np.array_equal(np.isnan(written[0]), np.isnan(written[1]))  # undefined statistics (next of a decoder)
    defined = ~np.isnan(written[1])
    assert np.all(np.abs(written[0] - written[1])[defined] <= 1.001 * sixth_digit(written[1])[defined])
