"""Block capture (probe.blocks): each site's attention computed a block of query rows at a time by
the reference module; the model's outputs stay the model's and every statistic, value-weighted
column and example map equals the whole-map (dense) path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe.analysis as analysis_module
from conftest import tiny_model
from probe import blocks
from probe.accumulators import Accumulator
from probe.analysis import analyze, run
from probe.blocks import block_capture, query_block_for
from probe.capture import capture_attention, encode, forward
from probe.errors import InputError, UnsupportedAnalysisError
from probe.hooks import measuring
from probe.inputs import Text, iter_batches
from probe.reference import swap_attention
from probe.seq2seq import sides
from probe.verification.compare import FP32_ATOL, NOISE_FACTOR

TEXTS = ["The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.",
         "A short one.", "Another sentence that is of a middling length, with commas; and more."]
#: Every architecture kind probe supports: encoder, GPT-2, LLaMA with grouped KV heads (2 of 4),
#: sliding windows smaller than T (qwen2-window: 4, mistral: 8, gemma2: 4 with softcap), ALiBi
#: (bloom), GPT-NeoX (per-head fused qkv, partial rotary), encoder-decoders (BART, Marian, T5).
KINDS = ("bert", "distilbert", "gpt2", "llama", "qwen2-window", "mistral", "gemma2", "gpt_neox", "phi3",
         "bloom", "bart", "marian", "t5")
#: Block sizes: one row, smaller than every window, not dividing T, and larger than T.
SIZES = (1, 3, 7, 100)
#: The tiny T5's default initializer factor (3.0) gives scores in the hundreds, and the tiny
#: BART's 0.3 grows the decoder's hidden states layer by layer, so that float32's rounding of a
#: block's matmul (another order of the same additions as the whole map's) exceeds 1e-5 in the
#: last layer's probabilities; smaller scales (T5 0.5, BART 0.1) keep them within float32 noise,
#: as in a trained model (smollm2 at 2,048 tokens: benchmarks/bench_length.py).
INIT = {"t5": 0.05, "bart": 0.1}
#: Scaled statistics (tokens, nats, hidden-state units): compared with a relative tolerance too.
SCALED = ("entropy", "distance", "norm_mass", "entropy_by_norm", "distance_by_norm")


def texts_for(kind: str):
    if kind in ("bart", "marian", "t5"):
        return [Text(t, target=t[::-1][:40]) for t in TEXTS]
    return TEXTS


def model(kind: str):
    return tiny_model(kind, **({"init": INIT[kind]} if kind in INIT else {}))


def assert_same(dense, blocked) -> None:
    """Every statistic column, value-weighted column and example map within 1e-5 (scaled columns:
    also 1e-6 relative)."""
    cols = [c for c in dense.heads.select_dtypes("number").columns if c != "cluster"]
    assert len(cols) > 20
    for c in cols:
        a, b = dense.heads[c].to_numpy(float), blocked.heads[c].to_numpy(float)
        rtol = 1e-6 if c in SCALED else 0.0
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=rtol, err_msg=c)
    assert len(dense.examples) == len(blocked.examples) == 3
    for x, y in zip(dense.examples, blocked.examples):
        assert x.probs.shape == y.probs.shape
        np.testing.assert_allclose(y.probs, x.probs, atol=1e-5, rtol=0)
        for name in x.decoder or {}:
            np.testing.assert_allclose(y.decoder[name], x.decoder[name], atol=1e-5, rtol=0)
    pa, pb = dense.results["sink_profile"], blocked.results["sink_profile"]
    np.testing.assert_array_equal(pa.rows, pb.rows)
    np.testing.assert_allclose(pb.means(), pa.means(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_equal_dense(kind):
    lm = model(kind)
    dense = analyze(lm, texts_for(kind), batch_size=2, query_block=0)
    for size in SIZES:
        assert_same(dense, analyze(lm, texts_for(kind), batch_size=2, query_block=size))


@pytest.mark.parametrize("kind", KINDS)
def test_block_outputs_are_the_models(kind):
    """Under block capture the model's outputs equal its own eager and sdpa outputs (``probe verify``'s
    float32 tolerance), the blocks come in row order, cover every row, never hold more rows than
    asked, and equal the rows of the whole maps."""
    lm = model(kind)
    batch = encode(lm, texts_for(kind))
    with torch.no_grad():
        own = forward(lm, batch)[0]
        sdpa_ok = lm.spec.softcap(lm.model.config) is None
        lm.model.config._attn_implementation = "sdpa" if sdpa_ok else "eager"
        try:
            sdpa = forward(lm, batch)[0]
        finally:
            lm.model.config._attn_implementation = "eager"
    dense = capture_attention(lm, texts_for(kind))
    got: dict = {}

    def keep(site, probs, rows, n_query):
        assert probs.shape[2] == rows[1] - rows[0] <= 3
        assert rows[0] == (got[site][-1][1][1] if site in got else 0)
        got.setdefault(site, []).append((probs.clone(), rows, n_query))

    with torch.no_grad(), measuring(lm.model), block_capture(lm, 3, keep):
        out = forward(lm, batch)[0]
    # probe verify's rule: FP32_ATOL, or NOISE_FACTOR times the model's own noise (eager vs sdpa)
    real = (batch if batch.target is None else batch.target).real  # padded positions' outputs are nobody's
    out, own, sdpa = out[real], own[real], sdpa[real]
    atol = max(FP32_ATOL, NOISE_FACTOR * float((own - sdpa).abs().max()))
    torch.testing.assert_close(out, own, atol=atol, rtol=0)
    torch.testing.assert_close(out, sdpa, atol=atol, rtol=0)
    assert set(got) == set(lm.sites)
    for site, parts in got.items():
        whole = torch.cat([p for p, _, _ in parts], dim=2)
        assert parts[-1][1][1] == parts[-1][2] == whole.shape[2]
        real = sides(site, dense.batch)[0].real  # [batch, query]: padded query rows are nobody's
        torch.testing.assert_close(whole[real.nonzero(as_tuple=True)[0], :, real.nonzero(as_tuple=True)[1]],
                                   dense[site][real.nonzero(as_tuple=True)[0], :, real.nonzero(as_tuple=True)[1]],
                                   atol=1e-5, rtol=0)


def test_block_causal_rows_are_the_whole_masks_rows():
    """ReferenceAttention.block_causal: rows i0..i1-1 of the causal (and sliding-window) mask, also
    with a cache (queries the last of the keys)."""
    lm = tiny_model("mistral")
    with swap_attention(lm) as swapped:
        mod = swapped.modules[0]
        for window in (None, 3):
            mod.window = window
            for T, Tk in ((10, 10), (4, 9)):
                whole = mod.causal_mask(T, Tk, None)
                for i0, i1 in ((0, 1), (1, 4), (T - 1, T), (0, T)):
                    assert torch.equal(mod.block_causal(i0, i1, T, Tk, None), whole[i0:i1])


class WholeMaps(Accumulator):
    """An accumulator without row blocks: counts the sequences it saw."""

    name = "whole"
    title = "the whole-map test analysis"

    def __init__(self):
        self.seen = 0

    def begin_batch(self, batch):
        self.seen += len(batch)

    def update(self, site, probs, batch):
        assert probs.shape[2] == probs.shape[3] or site.kind == "cross"

    def merge(self, other):
        return self

    def result(self):
        return self.seen


def test_auto_blocks_above_the_length(monkeypatch):
    """Batches longer than AUTO_LENGTH are captured in blocks, the whole-map analysis is left out of
    them with a note naming it, and the statistics equal the dense path's."""
    lm = tiny_model("llama")
    monkeypatch.setattr(blocks, "AUTO_LENGTH", 12)
    monkeypatch.setattr(analysis_module, "AUTO_LENGTH", 12)
    whole = WholeMaps()
    auto = analyze(lm, TEXTS, batch_size=1, accumulators=[whole])
    lengths = [len(encode(lm, t).input_ids[0]) for t in TEXTS]
    longer = sum(n > 12 for n in lengths)
    assert 0 < longer < len(TEXTS)
    assert whole.seen == len(TEXTS) - longer
    note = [n for n in auto.notes if n.startswith("the whole-map test analysis needs whole attention maps")]
    assert len(note) == 1 and f"left out of the {longer} sequences longer than 12 tokens" in note[0]
    assert_same(analyze(lm, TEXTS, batch_size=1, query_block=0), auto)


def test_query_block_for():
    lm = tiny_model("llama")
    batch = next(iter_batches(lm, [Text(t) for t in TEXTS], batch_size=3))
    T = batch.input_ids.shape[1]
    assert query_block_for(lm, batch) is None  # short: whole maps
    assert query_block_for(lm, batch, 0) is None
    assert query_block_for(lm, batch, 5) == 5
    old = blocks.AUTO_LENGTH
    try:
        blocks.AUTO_LENGTH = T - 1
        assert query_block_for(lm, batch) == max(1, blocks.BLOCK_PROBABILITIES // (3 * 4 * T))
    finally:
        blocks.AUTO_LENGTH = old


def test_demanded_blocks_refuse_whole_map_analyses():
    lm = tiny_model("gpt2")
    with pytest.raises(UnsupportedAnalysisError, match="the whole-map test analysis needs whole attention maps"):
        analyze(lm, TEXTS, query_block=4, accumulators=[WholeMaps()])
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError, match="query block"):
            analyze(lm, TEXTS, query_block=bad)


def test_run_hands_rows_in_order():
    """run(): with query_block every row-block accumulator gets disjoint blocks in row order covering
    every query row, for every site and batch."""
    lm = tiny_model("bart")

    class Rows(Accumulator):
        row_blocks = True

        def __init__(self):
            self.calls = []

        def update(self, site, probs, batch, rows=None):
            self.calls.append((site, id(batch), rows, probs.shape[2]))

    acc = Rows()
    items = [Text(t, target=t[:30]) for t in TEXTS]
    run(lm, iter_batches(lm, items, batch_size=2), [acc], query_block=4)
    by = {}
    for site, b, rows, n in acc.calls:
        assert rows[1] - rows[0] == n <= 4
        by.setdefault((site, b), []).append(rows)
    assert {s for s, _ in by} == set(lm.sites)
    for rows in by.values():
        assert rows[0][0] == 0 and all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
