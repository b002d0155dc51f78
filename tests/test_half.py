"""Statistics in half precision (bfloat16, float16) and on any device: docs/statistics.md, "Half precision".

- Hand-built maps fed to the accumulators (no model): a uniform 6,000-token bfloat16 map gives
  ``first`` = its entries (1/T rounded once), counts 6,000 (a bfloat16 running sum would stop at 256);
  padded query rows holding anything (NaN, 1) contribute nothing.
- Tiny llama, gpt2 and bert in bfloat16 and float16: the rounding of the probabilities alone moves
  each statistic by at most its derived bound (relative eps/2 per probability); the half model
  against the same weights in float32, within the documented budget per statistic; a padded half
  batch equals its sequences one at a time.
- Accumulator state lives where the probabilities are (the CPU here; no per-batch copy).
"""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_model, tolerance
from probe.capture.maps import capture_attention
from probe.measures.accumulators import sum_device
from probe.measures.sinks import SinkProfile
from probe.measures.stats import INDEX, STATISTICS, HeadStatistics
from probe.report import write_run
from probe.runs.analysis import analyze, run
from probe.sites import Site
from probe.text.inputs import Batch, Text, as_texts, iter_batches

HALF = (torch.bfloat16, torch.float16)
KINDS = ("llama", "gpt2", "bert")
TEXTS = ["The cat sat on the mat and looked around the room, quietly.", "A dog.",
         "Hi there, friend! How are you today?",
         "Numbers like 3.14 and 2.71 appear here; so do commas, colons: and dashes - too."]
#: The budget K of docs/statistics.md: a half model's statistics are within K eps (times the
#: statistic's scale) of the same weights' float32 statistics.
BUDGET = 8


def hand_batch(lengths: list[int]) -> Batch:
    """A right-padded batch of ``lengths`` tokens with no tokenizer facts (no sep, no punctuation)."""
    B, T = len(lengths), max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    return Batch(torch.ones(B, T, dtype=torch.long) * mask, mask, None, torch.zeros(B, T, 2, dtype=torch.long),
                 torch.zeros(B, T, dtype=torch.bool), torch.full((B, T), -1), [Text("x") for _ in lengths],
                 list(range(B)), [False] * B)


def test_a_bfloat16_running_sum_stops_at_256():
    """Why sums are float64: in bfloat16, 256 + 1 = 256 (8 significant bits)."""
    s = torch.tensor(256.0, dtype=torch.bfloat16)
    assert float(s + 1) == 256.0 and float(s.double() + 1) == 257.0


def test_uniform_6000_token_bfloat16_map_gives_first_one_over_t():
    """A uniform map of T = 6,000 keys in bfloat16 (every entry 1/T rounded once), fed in row blocks:
    ``first`` is that entry exactly (within 1/T x eps/2 of 1/T), counts are 6,000 rows, entropy and
    distance are those of the rounded entries (float32 rows, float64 sums: within T float32 eps)."""
    T = 6000
    site = Site("encoder", 0)
    batch = hand_batch([T])
    entry = torch.tensor(1.0 / T, dtype=torch.bfloat16)
    stats, sinks = HeadStatistics([site], 1), SinkProfile([site], 1)
    step = 1500
    for i0 in range(0, T, step):
        block = entry.expand(1, 1, step, T)
        stats.update(site, block, batch, rows=(i0, i0 + step))
        sinks.update(site, block, batch, rows=(i0, i0 + step))
    a = float(entry)
    assert abs(a - 1 / T) <= torch.finfo(torch.bfloat16).eps / 2 / T
    means = stats.means()[0, 0]
    assert int(stats.counts[0, INDEX["first"]]) == T
    assert means[INDEX["first"]] == pytest.approx(a, rel=1e-12)  # not stuck: 6,000 rows of a, summed exactly
    assert means[INDEX["self"]] == pytest.approx(a, rel=1e-12)
    eps32 = torch.finfo(torch.float32).eps
    assert means[INDEX["entropy"]] == pytest.approx(-T * a * math.log(a), rel=T * eps32)
    assert means[INDEX["norm_entropy"]] == pytest.approx(-T * a * math.log(a) / math.log(T), rel=T * eps32)
    assert means[INDEX["distance"]] == pytest.approx(a * (T * T - 1) / 3, rel=T * eps32)  # mean_i sum_j |i - j|
    assert means[INDEX["max_weight"]] == a
    profile = sinks.result()
    assert int(profile.rows.sum()) == T
    np.testing.assert_allclose(profile.sums[0, 0, :, 0].sum() / T, a, rtol=1e-12)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_padded_rows_contribute_nothing_whatever_they_hold(dtype):
    """A padded half batch whose padded query rows hold NaN, 1 and the uniform row gives the
    statistics and sink profile of its sequences fed one at a time (the same rows, float64 sums)."""
    torch.manual_seed(3)
    lengths = [9, 4, 6]
    T = max(lengths)
    site = Site("decoder", 0, causal=True)
    tri = torch.ones(T, T, dtype=torch.bool).tril()
    probs = torch.softmax(torch.randn(3, 2, T, T).masked_fill(~tri, -math.inf), -1)
    for b, n in enumerate(lengths):
        probs[b, :, :, n:] = 0.0
        probs[b, :, :n, :n] = probs[b, :, :n, :n] / probs[b, :, :n, :n].sum(-1, keepdim=True)
    probs = probs.to(dtype)
    probs[1, :, 4:] = float("nan")  # padded rows: anything
    probs[2, 0, 6:] = 1.0
    probs[2, 1, 6:] = 1.0 / T
    padded, alone = HeadStatistics([site], 2), HeadStatistics([site], 2)
    sink_padded, sink_alone = SinkProfile([site], 2), SinkProfile([site], 2)
    padded.update(site, probs, hand_batch(lengths))
    sink_padded.update(site, probs, hand_batch(lengths))
    for b, n in enumerate(lengths):
        one = probs[b:b + 1, :, :n, :n]
        alone.update(site, one, hand_batch([n]))
        sink_alone.update(site, one, hand_batch([n]))
    assert torch.equal(padded.counts, alone.counts)
    undefined = (padded.counts == 0).numpy()[:, None, :].repeat(2, 1)  # next (causal), sep, aligned: NaN
    assert np.array_equal(np.isnan(padded.means()), undefined)
    # the same rows; a row's float32 reduction may take another order in a longer padded row
    np.testing.assert_allclose(padded.means(), alone.means(), equal_nan=True, **tolerance("scaled"))
    np.testing.assert_allclose(sink_padded.result().sums, sink_alone.result().sums, rtol=1e-12, atol=1e-15)


def _statistics(lm, texts=TEXTS, **kw):
    return analyze(lm, texts, n_examples=0, value_weighted=False, **kw).heads


def rounding_bounds(reference: dict[str, np.ndarray], dtype: torch.dtype) -> dict[str, np.ndarray]:
    """The bound per statistic when every probability carries a relative error of at most
    delta = eps/2 (one rounding to ``dtype``), from the float32 values ``reference``
    (docs/statistics.md): delta x value for the weighted sums and max_weight, delta (H + 1) for
    entropy, delta (norm_entropy + 1/ln 2) for norm_entropy; plus 64 float32 eps of row rounding."""
    d = torch.finfo(dtype).eps / 2
    slack = 64 * torch.finfo(torch.float32).eps
    out = {s: d * np.abs(reference[s]) + slack for s in STATISTICS}
    out["entropy"] = d * (reference["entropy"] + 1) * (1 + 2 * d) + slack * (1 + reference["entropy"])
    out["norm_entropy"] = d * (reference["norm_entropy"] + 1 / math.log(2)) * (1 + 2 * d) + slack
    out["distance"] = d * reference["distance"] + slack * (1 + reference["distance"])
    return out


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_rounding_the_probabilities_moves_each_statistic_within_its_bound(kind, dtype):
    """The float32 maps of a tiny model, rounded to the half dtype and fed to the accumulator: each
    statistic within :func:`rounding_bounds` of the float32 maps' (what probe adds is float32 row
    values and float64 sums, nothing in the half dtype)."""
    lm = tiny_model(kind)
    cap = capture_attention(lm, TEXTS)
    full, half = HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer), \
        HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer)
    for site, p in zip(cap.sites, cap.probs):
        full.update(site, p, cap.batch)
        half.update(site, p.to(dtype), cap.batch)
    ref, got = full.result(), half.result()
    bounds = rounding_bounds({s: ref[s].to_numpy() for s in STATISTICS}, dtype)
    for s in STATISTICS:
        diff = np.abs(got[s].to_numpy() - ref[s].to_numpy())
        assert np.array_equal(np.isnan(diff), np.isnan(ref[s].to_numpy())), s
        assert bool((diff[~np.isnan(diff)] <= bounds[s][~np.isnan(diff)]).all()), (s, np.nanmax(diff / bounds[s]))


def budget(reference, dtype: torch.dtype, longest: int) -> dict[str, float]:
    """docs/statistics.md's budget for a half model against the same weights in float32:
    K eps for the probability statistics and max_weight, K eps (1 + ln T) for entropy,
    K eps (1 + 1/ln 2) for norm_entropy, K eps (T - 1) for distance (T: the longest sequence)."""
    e = BUDGET * torch.finfo(dtype).eps
    out = {s: e for s in STATISTICS}
    out.update(entropy=e * (1 + math.log(longest)), norm_entropy=e * (1 + 1 / math.log(2)), distance=e * (longest - 1))
    return out


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_half_model_statistics_within_the_budget_of_float32(kind, dtype):
    """The tiny model in the half dtype against the same (rounded) weights in float32: every
    statistic within :func:`budget`; NaN where float32 has NaN (next on causal models, sep without
    a sep token) and nowhere else; and the padded half batch equals its sequences one at a time
    within the same budget (a one-sequence batch has no padding)."""
    lm = tiny_model(kind)
    lm.model.to(dtype)
    half = _statistics(lm)
    alone = _statistics(lm, batch_size=1)
    assert lm.model.dtype == dtype
    lm.model.float()
    full = _statistics(lm)
    longest = max(len(lm.tokenizer(t)["input_ids"]) for t in TEXTS) + 2
    limits = budget(full, dtype, longest)
    for s in STATISTICS:
        ref = full[s].to_numpy()
        for got in (half, alone):
            diff = np.abs(got[s].to_numpy() - ref)
            assert np.array_equal(np.isnan(diff), np.isnan(ref)), s
            assert np.nanmax(diff, initial=0.0) <= limits[s], (s, np.nanmax(diff) / torch.finfo(dtype).eps)


@pytest.mark.parametrize("kind", KINDS)
def test_heads_csv_and_run_record_say_the_dtype(kind, tmp_path):
    """run.json's model.dtype and heads.csv's dtype column are the parameters' dtype."""
    lm = tiny_model(kind)
    lm.model.to(torch.bfloat16)
    result = analyze(lm, TEXTS[:2], n_examples=1)
    path = write_run(result, lm.tokenizer, tmp_path / "run")
    assert json.loads((path / "run.json").read_text())["model"]["dtype"] == "bfloat16"
    heads = pd.read_csv(path / "heads.csv")
    assert set(heads["dtype"]) == {"bfloat16"} and heads.columns[-1] == "dtype"


def test_accumulator_state_lives_on_the_device_of_its_inputs():
    """follow() moves the running sums to the probabilities' device (sum_device: the device itself,
    the CPU for MPS, which has no float64); pickling brings them to the CPU; merge takes another
    device's state. Only CPU tensors exist here: the device is checked as what follow() chose."""
    assert sum_device("cpu") == torch.device("cpu") and sum_device("mps") == torch.device("cpu")
    assert sum_device("cuda:1") == torch.device("cuda:1")
    lm = tiny_model("llama")
    stats = HeadStatistics(lm.sites, lm.geometry.n_heads, lm.tokenizer, value_weighted=True)
    sinks = SinkProfile(lm.sites, lm.geometry.n_heads)
    run(lm, iter_batches(lm, as_texts(TEXTS), batch_size=2), [stats, sinks])
    for acc in (stats, sinks):
        for key in acc.on_device:
            value = getattr(acc, key)
            assert value.device == next(lm.model.parameters()).device, key
        assert all(t.device.type == "cpu" for t in pickle.loads(pickle.dumps(acc)).__dict__.values()
                   if isinstance(t, torch.Tensor))
    moved = HeadStatistics(lm.sites, lm.geometry.n_heads, value_weighted=True)
    moved.follow(torch.device("meta"))  # the mechanism alone (no arithmetic runs on "meta")
    assert {getattr(moved, k).device.type for k in moved.on_device} == {"meta"}
    assert moved.counts.device.type == "cpu"  # counts come from the batch, on the CPU
    moved.follow("cpu")  # only the first update moves the state: a device map's later layers add into it
    assert moved.sums.device.type == "meta"
    copy = pickle.loads(pickle.dumps(stats))
    before = stats.means()
    stats.merge(copy)
    np.testing.assert_allclose(stats.means(), before, rtol=1e-12)
    assert stats.sums.dtype == torch.float64 and stats.counts.dtype == torch.int64


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory):
    """A tiny llama folder whose config declares bfloat16 (saved from the model in bfloat16)."""
    folder = tmp_path_factory.mktemp("bf16") / "tiny-llama-bf16"
    model, tok = tiny_model("llama", wrap=False)
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_folder_loads_in_its_declared_dtype_unless_asked(bf16_folder):
    """load_model: None gives the declared dtype with a note; a name or a torch dtype overrides it;
    anything else is a one-line ModelLoadError."""
    from probe.errors import ModelLoadError
    from probe.loading.models import load_model

    lm = load_model(str(bf16_folder))
    assert lm.model.dtype == torch.bfloat16
    assert any("bfloat16, the dtype the checkpoint declares" in n for n in lm.notes)
    for asked in ("float32", torch.float32):
        lm = load_model(str(bf16_folder), dtype=asked)
        assert lm.model.dtype == torch.float32 and not any("declares" in n for n in lm.notes)
    assert load_model(str(bf16_folder), dtype="float16").model.dtype == torch.float16
    with pytest.raises(ModelLoadError, match="unknown dtype 'float64'"):
        load_model(str(bf16_folder), dtype="float64")


def test_cli_dtype_and_device(bf16_folder, tmp_path):
    """probe analyze: the declared bfloat16 by default, --dtype float32 on request, each recorded in
    run.json and heads.csv; --device mps without MPS is one Error line; patch, prune and effects take
    --dtype and --device too."""
    from conftest import invoke_cli, one_error

    for extra, dtype in (((), "bfloat16"), (("--dtype", "float32"), "float32")):
        out = tmp_path / dtype
        result = invoke_cli("analyze", "--model", bf16_folder, "--out", out, "--no-progress", "--no-distance",
                            "--no-circuits", "-t", "A short text, with a comma.", *extra)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "run.json").read_text())["model"]["dtype"] == dtype
        assert set(pd.read_csv(out / "heads.csv")["dtype"]) == {dtype}
    if not (torch.backends.mps.is_available()):
        one_error(invoke_cli("analyze", "--model", bf16_folder, "--device", "mps", "-t", "Text."), 1, "mps")
    for command in ("patch", "prune", "effects"):
        result = invoke_cli(command, "--help")
        assert "--dtype [float32|bfloat16|float16]" in result.output and "--device" in result.output, command


def test_bench_gpu_runs_on_the_cpu_and_refuses_cuda_without_one(bf16_folder):
    """benchmarks/bench_gpu.py: ``--device cpu`` runs every part on a tiny model (one row per length,
    a length above the model's limit skipped in words); ``--device cuda`` without CUDA is one Error line,
    status 1, no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"
    run_it = lambda *a: subprocess.run([sys.executable, str(script), "--model", str(bf16_folder), *a],  # noqa: E731
                                       capture_output=True, text=True, timeout=600)
    done = run_it("--device", "cpu", "--lengths", "8,100000", "--sequences", "2", "--batch-size", "2",
                  "--repeats", "1")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(str(bf16_folder))]
    assert [r[1] for r in rows] == ["8", "100000"] and rows[1][2] == "skipped:"
    assert float(rows[0][2]) > 0 and float(rows[0][3]) > 0  # bare and analyze seconds
    if not torch.cuda.is_available():
        refused = run_it("--device", "cuda")
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert [line for line in refused.stderr.splitlines() if line] == [
            "Error: no CUDA device here (torch.cuda.is_available() is False); --device cpu runs this script as a "
            "smoke test"]


def test_float16_scores_that_overflow_give_the_float32_result_in_probes_function():
    """probe's attention function on float16 queries and keys whose scores pass 65504: the
    probabilities are the float32 computation on the same inputs (rounded once to float16), not NaN
    and not the overflowed float16 scores' softmax."""
    from torch import nn

    from probe.capture.interface import probe_attention

    g = torch.Generator().manual_seed(30)
    q = (torch.randn(2, 4, 6, 16, generator=g) * 80).half()
    k = (torch.randn(2, 2, 6, 16, generator=g) * 80).half()  # grouped: 2 key/value heads
    v = torch.randn(2, 2, 6, 16, generator=g).half()
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    keep[1, :, :, 4:] = False  # the second sequence: 4 real tokens
    module = nn.Module().eval()
    out, probs = probe_attention(module, q, k, v, keep, scaling=0.25)
    out32, probs32 = probe_attention(module, q.float(), k.float(), v.float(), keep, scaling=0.25)
    kk = k.repeat_interleave(2, dim=1)
    scores16 = q @ kk.transpose(-2, -1) * 0.25
    assert bool(scores16.isinf().any())  # the trap: float16 scores past 65504
    assert probs.dtype == torch.float16 and not bool(torch.isnan(probs).any()) and not bool(torch.isnan(out).any())
    torch.testing.assert_close(probs, probs32.half(), atol=0, rtol=0)
    assert torch.count_nonzero(probs[~keep.expand_as(probs)]) == 0


def test_a_float16_model_with_overflowing_scores_measures_without_nan():
    """A tiny LLaMA in float16 whose query and key weights are scaled until scores pass 65504 (its
    eager attention returns NaN): probe's function gives finite statistics wherever float32 has them
    (NaN only for ``next`` on a causal model and ``sep`` without a sep token) and rows that sum to 1."""
    lm = tiny_model("llama")
    with torch.no_grad():
        for layer in lm.model.model.layers:
            layer.self_attn.q_proj.weight *= 60
            layer.self_attn.k_proj.weight *= 60
    lm.model.half()
    cap = capture_attention(lm, TEXTS[:2])
    real = cap.batch.real
    for p in cap.probs:
        rows = p[:, :, :, :].float().sum(-1)  # [B, H, T]
        assert not bool(torch.isnan(p).any())
        assert bool(((rows - 1).abs()[real[:, None, :].expand_as(rows)] <= 4e-3).all())
    heads = _statistics(lm, TEXTS[:2])
    lm.model.set_attn_implementation("eager")  # the model's own half-precision attention: NaN
    from probe.capture.maps import forward
    with torch.no_grad():
        eager = forward(lm, cap.batch, output_attentions=True).attentions
    assert any(bool(torch.isnan(a).any()) for a in eager)
    expected_nan = {"next", "sep"}
    for s in STATISTICS:
        assert heads[s].isna().all() if s in expected_nan else heads[s].notna().all(), s
