"""Block capture (probe.capture.blocks): each site's attention computed a block of query rows at a time by
the reference module; the model's outputs stay the model's and every statistic, value-weighted
column and example map equals the whole-map (dense) path."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

import probe.runs.analysis as analysis_module
from conftest import save_tiny, tiny_model
from probe.capture import blocks
from probe.capture.blocks import block_capture, query_block_for
from probe.capture.hooks import measuring
from probe.capture.maps import capture_attention, encode, forward
from probe.capture.reference.swap import swap_attention
from probe.cli import main
from probe.errors import InputError, UnsupportedAnalysisError
from probe.loading.seq2seq import sides
from probe.measures.accumulators import Accumulator
from probe.measures.sinks import bin_edges
from probe.pruning.removal import remove_heads
from probe.report.sinks import SHOWN_FROM, sink_profile_section
from probe.runs.analysis import analyze, run
from probe.text.corpus import sample_texts
from probe.text.inputs import Text, iter_batches
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


def assert_same(dense, blocked, examples: int = 3) -> None:
    """Every statistic column, value-weighted column and example map within 1e-5 (scaled columns:
    also 1e-6 relative); both runs kept ``examples`` example maps."""
    cols = [c for c in dense.heads.select_dtypes("number").columns if c != "cluster"]
    assert len(cols) > 20
    for c in cols:
        a, b = dense.heads[c].to_numpy(float), blocked.heads[c].to_numpy(float)
        rtol = 1e-6 if c in SCALED else 0.0
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=rtol, err_msg=c)
    assert len(dense.examples) == len(blocked.examples) == examples
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


# --------------------------------------------------------------------------- the CLI option

def test_cli_query_block(tmp_path):
    """``probe analyze --query-block N``: the statistics equal a whole-map run's, the setting is in
    run.json, and no analysis is left out (the pattern analyses take row blocks too)."""
    folder = save_tiny("llama", tmp_path / "llama")
    runs = {}
    for n in ("0", "3"):
        out = tmp_path / f"run{n}"
        result = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--text", TEXTS[0], "--text", TEXTS[2],
                                           "--out", str(out), "--query-block", n, "--no-rollout", "--no-circuits"])
        assert result.exit_code == 0, result.output
        runs[n] = (json.loads((out / "run.json").read_text()), pd.read_csv(out / "heads.csv"))
    rec, heads = runs["3"]
    assert rec["settings"]["query_block"] == 3 and runs["0"][0]["settings"]["query_block"] == 0
    # every analysis probe analyze runs by default takes row blocks now: none is left out
    assert not any(n.startswith("not run with --query-block") for n in rec["notes"]), rec["notes"]
    cols = [c for c in heads.select_dtypes("number").columns if c not in ("group", "cluster")]
    assert {"first", "prev", "entropy", "first_by_norm", "norm_mass"} <= set(cols) and len(cols) > 25
    for c in cols:
        np.testing.assert_allclose(heads[c], runs["0"][1][c], atol=1e-5, rtol=1e-6, err_msg=c)
    bad = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--text", "x", "--query-block", "-2"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output


# --------------------------------------------------------------------------- sinks by position

def test_sink_profile_equals_a_direct_computation():
    """SinkProfile's per-bin means of A[i, 0] and sum_{j<4} A[i, j] equal those computed from the
    whole maps of capture_attention, row by row, for every site, head and bin, also under blocks."""
    lm = tiny_model("gpt2")
    texts = [TEXTS[0], TEXTS[1]]
    cap = capture_attention(lm, texts)
    real = cap.batch.real
    n_bins = len(bin_edges()) - 1
    want = np.zeros((len(lm.sites), 4, n_bins, 2))
    rows = np.zeros((len(lm.sites), n_bins))
    for s, site in enumerate(lm.sites):
        p = cap[site].double().numpy()
        for b in range(p.shape[0]):
            for i in range(int(real[b].sum())):
                k = 0 if i == 0 else int(np.floor(np.log2(i))) + 1
                assert bin_edges()[k] <= i < bin_edges()[k + 1]
                want[s, :, k, 0] += p[b, :, i, 0]
                want[s, :, k, 1] += p[b, :, i, :4].sum(-1)
                rows[s, k] += 1
    for block in (0, 2):
        got = analyze(lm, texts, batch_size=2, query_block=block).results["sink_profile"]
        np.testing.assert_array_equal(got.rows, rows)
        np.testing.assert_allclose(got.sums, want, atol=1e-5, rtol=0)
        frame = got.frame()
        first = frame[(frame.layer == 1) & (frame.start == 4)].iloc[0]
        assert first.rows == rows[1, 3] and first.end == 8
        assert abs(first["first"] - want[1, :, 3, 0].mean() / rows[1, 3]) < 1e-6
    assert got.longest == int(real.sum(1).max())


def test_sink_section_on_long_text_only():
    lm = tiny_model("llama", max_positions=400)
    long_text = " ".join(TEXTS * 12)
    result = analyze(lm, [long_text, TEXTS[1]], max_length=300, query_block=64)
    assert result.results["sink_profile"].longest == 300 >= SHOWN_FROM
    section = sink_profile_section(result, lm.tokenizer)
    fig = section.figures["sinks-first"]
    assert fig["rows"] == len(lm.sites) and fig["cols"] == 10  # positions 0, 1, 2-3, ..., 256-299
    assert fig["colLabels"][:3] == ["0", "1", "2-3"] and fig["colLabels"][-1] == "256-511"
    frame = result.results["sink_profile"].frame()
    cell = frame[(frame.layer == 0) & (frame.start == 256)].iloc[0]
    assert fig["values"][9] == int(round(cell["first"] * 1000))
    assert section.record["longest"] == 300
    assert sink_profile_section(analyze(lm, TEXTS), lm.tokenizer) is None


def test_cli_long_text_is_captured_in_blocks(tmp_path):
    """A text above AUTO_LENGTH tokens: captured in blocks automatically; the pattern analyses run on
    its blocks, the rollout (which re-runs whole maps) is left out with a note; the sinks section is
    on the page."""
    folder = save_tiny("llama", tmp_path / "llama", max_positions=1100)
    out = tmp_path / "run"
    long_text = " ".join(TEXTS * 40)
    result = CliRunner().invoke(main, ["analyze", "--model", str(folder), "--text", long_text, "--max-length",
                                       "1060", "--out", str(out), "--no-circuits"])
    assert result.exit_code == 0, result.output
    rec = json.loads((out / "run.json").read_text())
    assert rec["counts"]["longest"] == 1060 and rec["settings"]["query_block"] is None
    # the pattern analyses take row blocks: they ran on the long text (none left out)
    assert not any("needs whole attention maps" in n for n in rec["notes"]), rec["notes"]
    assert rec["groups"]["map_sequences_seen"] == 1 and "health" in rec and "pattern-types" in rec
    heads = pd.read_csv(out / "heads.csv")
    assert heads["type_heterogeneous"].notna().all() and heads["group"].notna().all()
    assert any(n.startswith("rollout left out for examples longer than 1024 tokens") for n in rec["notes"])
    assert rec["sinks-by-position"]["longest"] == 1060
    assert 'id="sinks-by-position"' in (out / "index.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- a real model at length

@pytest.mark.slow
def test_smollm2_2048_blocks_equal_dense(smollm2):
    """SmolLM2 on one 2,048-token text (the built-in sample repeated): every statistic, value-weighted
    column and example map of block capture (455-row blocks, the automatic size) equals the whole-map
    path within 1e-5 (scaled columns also 1e-6 relative). About 5 minutes on 2 busy cores
    (benchmarks/bench_length.py --check 2048 prints the same comparison)."""
    text = " ".join(list(sample_texts()) * 40)
    dense = analyze(smollm2, [text], max_length=2048, query_block=0)
    blocked = analyze(smollm2, [text], max_length=2048)
    assert blocked.counts["longest"] == 2048
    assert_same(dense, blocked, examples=1)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_pruned_model_in_blocks(kind):
    """A model with physically removed heads: block capture hands the original numbering with NaN
    for the removed heads, and every statistic equals the whole-map path (removed heads NaN in both)."""
    lm = tiny_model(kind)
    remove_heads(lm, {0: [1], 1: [0, 3]})
    dense = analyze(lm, TEXTS, batch_size=2, query_block=0)
    blocked = analyze(lm, TEXTS, batch_size=2, query_block=3)
    gone = blocked.heads.set_index(["layer", "head"]).loc[[(0, 1), (1, 0), (1, 3)], "first"]
    assert gone.isna().all()
    assert_same(dense, blocked)
