"""Per-head statistics (docs/statistics.md) checked against an independent computation.

The reference below does not use probe's statistics code: it runs each sequence ONE AT A TIME,
unpadded, through the model's own ``output_attentions=True`` path, and applies the definitions
definitions row by row with numpy (float64). probe's ``analyze`` (batched, padded, hook-captured)
must agree with it.
"""

from __future__ import annotations

import math
import unicodedata

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import assert_statistics_close, hook_snapshot, tiny_model
from probe.capture.maps import capture_attention
from probe.measures.stats import ALL_STATISTICS, STATISTICS, HeadStatistics
from probe.runs.analysis import analyze

#: Varied English: punctuation of many kinds, a subword-heavy word, short and long sentences.
SENTENCES = [
    "The cat sat on the mat.",
    "Hello, world!",
    "Wait... what?! No -- really?",
    "She said: \"I'll be there at 5 o'clock; don't wait.\"",
    "Dr. Smith (the surgeon) arrived at 10:30 a.m., then left.",
    "Antidisestablishmentarianism is a long word.",
    "Prices rose 3.5% in 2023 – the fastest rise since 1990.",
    "Yes.",
    "When the committee finally met on Thursday afternoon, after weeks of delays caused by travel "
    "problems, illness and a long dispute about the agenda, the members agreed, somewhat "
    "reluctantly, to postpone the vote on the new budget until the following spring.",
    "Although it was raining heavily, the children, who had been promised a trip to the seaside "
    "for months, refused to stay inside and insisted that we leave immediately.",
    "e.g. U.S.A. #hashtag @mention [brackets] {braces} <angles>",
    "Is this the real life? Is this just fantasy?",
]

SHORT = [
    "The quick brown fox, which was very quick, jumped over the lazy dog.",
    "Hello world!",
    "A (small) test: does it work? Yes; it does.",
    "One two three four five six seven eight nine ten eleven twelve.",
    "Hi.",
]


# --------------------------------------------------------------------------- the reference

def reference_punct(covered: str) -> bool:
    """The punct definition: the characters a token covers, whitespace removed, non-empty and all P*."""
    s = "".join(ch for ch in covered if not ch.isspace())
    return len(s) > 0 and all(unicodedata.category(ch)[0] == "P" for ch in s)


def reference_window(model, layer: int) -> int | None:
    """The sliding window of a layer as the model itself applies it (its attention module's
    ``sliding_window`` attribute, GPT-Neo's local mask buffer, or the config's for models that window
    every layer)."""
    def attention(m) -> bool:
        return type(m).__name__.endswith("Attention")

    attn = [m for m in model.modules() if attention(m) and not any(attention(c) for c in m.children())][layer]
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    if getattr(attn, "attention_type", None) == "local":  # GPT-Neo: the keys its own mask's last row keeps
        return int(attn.bias[0, 0, -1].sum())
    if model.config.model_type in ("mistral", "phi3"):
        return getattr(model.config, "sliding_window", None)
    return None


def reference_heads(lm, texts, max_length: int | None = None, maps=None) -> pd.DataFrame:
    """The statistics computed one sequence at a time, unpadded, with plain numpy per row.

    ``maps(lm, enc)``, if given, runs the model on one tokenized sequence and returns the maps to
    measure instead of its attention probabilities: one [heads, T, T] array per layer (float64); a
    row that sums to 0 there is left out of every statistic."""
    tok, model = lm.tokenizer, lm.model
    causal = lm.kind == "decoder"
    limit = min(max_length or lm.max_length, lm.max_length)
    has_sep = tok.sep_token is not None
    sep_id = tok.sep_token_id if has_sep else None
    L, H = lm.geometry.n_layers, lm.geometry.n_heads
    names = list(STATISTICS)
    sums = np.zeros((L, H, len(names)))
    counts = np.zeros((L, H, len(names)))

    def add(l, h, name, value):
        k = names.index(name)
        sums[l, h, k] += value
        counts[l, h, k] += 1

    for text in texts:
        enc = tok(text, truncation=True, max_length=limit, return_tensors="pt", return_offsets_mapping=True,
                  return_special_tokens_mask=True, split_special_tokens=True)
        offsets = enc.pop("offset_mapping")[0].tolist()
        special = enc.pop("special_tokens_mask")[0].tolist()
        if not getattr(model.config, "type_vocab_size", None):  # no token type table: GPT-2 would read them as tokens
            enc.pop("token_type_ids", None)
        ids = enc["input_ids"][0].tolist()
        T = len(ids)
        kwargs = {"use_cache": False} if causal else {}
        if maps is None:
            with torch.no_grad():
                out = model(**enc, output_attentions=True, **kwargs)
            layers = [a[0].double().numpy() for a in out.attentions]
        else:
            layers = maps(lm, enc)
        assert len(layers) == L
        punct_pos = np.array([not sp and reference_punct(text[a:b]) for (a, b), sp in zip(offsets, special)],
                             dtype=bool)
        sep_pos = np.array([has_sep and i == sep_id for i in ids], dtype=bool)
        for l in range(L):
            window = reference_window(model, l)
            layer_maps = layers[l]
            assert layer_maps.shape == (H, T, T)
            for h in range(H):
                A = layer_maps[h]
                for i in range(T):
                    row = A[i]
                    if row.sum() == 0:
                        continue
                    j = np.arange(T)
                    add(l, h, "self", row[i])
                    if i >= 1:
                        add(l, h, "prev", row[i - 1])
                    if not causal and i <= T - 2:
                        add(l, h, "next", row[i + 1])
                    add(l, h, "first", row[0])
                    if has_sep:
                        add(l, h, "sep", row[sep_pos].sum())
                    add(l, h, "punct", row[punct_pos].sum())
                    p = row[row > 0]
                    entropy = float(-(p * np.log(p)).sum())
                    add(l, h, "entropy", entropy)
                    k_i = (i + 1 if window is None else min(i + 1, window)) if causal else T
                    if k_i >= 2:
                        add(l, h, "norm_entropy", entropy / math.log(k_i))
                    add(l, h, "distance", (row * np.abs(i - j)).sum())
                    far = (np.abs(i - j) > 4) & (j != 0) & ~sep_pos
                    add(l, h, "long", row[far].sum())
                    add(l, h, "max_weight", row.max())
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    frame = pd.DataFrame(means.reshape(L * H, -1), columns=names)
    frame.insert(0, "head", np.tile(np.arange(H), L))
    frame.insert(0, "layer", np.repeat(np.arange(L), H))
    return frame


def assert_heads_match(actual: pd.DataFrame, expected: pd.DataFrame):
    """Same heads, and every statistic within its tolerance (conftest.tolerance: absolute on
    probabilities, relative on entropy and distance)."""
    actual = actual.sort_values(["layer", "head"]).reset_index(drop=True)
    expected = expected.sort_values(["layer", "head"]).reset_index(drop=True)
    assert actual[["layer", "head"]].to_numpy().tolist() == expected[["layer", "head"]].to_numpy().tolist()
    for name in STATISTICS:
        a = actual[name].to_numpy(dtype=float)
        e = expected[name].to_numpy(dtype=float)
        assert np.array_equal(np.isnan(a), np.isnan(e)), f"{name}: NaN pattern differs"
    assert_statistics_close(actual, expected, names=list(STATISTICS))


# --------------------------------------------------------------------------- against the reference

@pytest.mark.slow
def test_minilm_statistics_match_reference(minilm):
    result = analyze(minilm, SENTENCES, n_examples=0)
    expected = reference_heads(minilm, SENTENCES)
    assert len(result.heads) == 6 * 12
    assert not expected[list(STATISTICS)].isna().any().any()  # an encoder with [SEP]: all defined
    assert_heads_match(result.heads, expected)
    # the sentences exercise the statistics: punctuation and long-range attention are present
    assert result.heads["punct"].max() > 0.2
    assert result.heads["long"].max() > 0.2
    assert result.counts["sequences"] == len(SENTENCES)
    assert result.counts["tokens"] == sum(len(minilm.tokenizer(t)["input_ids"]) for t in SENTENCES)


@pytest.mark.slow
def test_smollm2_statistics_match_reference(smollm2):
    texts = SENTENCES[:3] + [SENTENCES[9]]
    result = analyze(smollm2, texts, batch_size=4, n_examples=0)
    expected = reference_heads(smollm2, texts)
    assert len(result.heads) == 30 * 9
    assert result.heads["next"].isna().all()  # decoder
    assert result.heads["sep"].isna().all()  # no sep token
    assert_heads_match(result.heads, expected)


@pytest.mark.parametrize("family,tokenizer", [
    ("bert", None), ("roberta", None), ("distilbert", None), ("electra", None),
    ("gpt2", "wordpiece"), ("gpt2", "bpe"), ("llama", "bpe"), ("llama", "wordpiece"), ("qwen2", "bpe"),
    ("qwen2-window", "bpe"), ("mistral", "bpe"), ("gpt_neox", "bpe"), ("phi3", "bpe"), ("gemma", "bpe"),
    ("gemma2", "bpe"), ("gemma3", "bpe"), ("qwen3", "bpe"),
])
def test_tiny_models_match_reference(family, tokenizer):
    lm = tiny_model(family, tokenizer)
    result = analyze(lm, SHORT, batch_size=3, n_examples=0)
    expected = reference_heads(lm, SHORT)
    assert_heads_match(result.heads, expected)
    heads = result.heads
    if lm.kind == "decoder":
        assert heads["next"].isna().all()
        assert "next-token" not in set(heads["label"])
    else:
        assert heads["next"].notna().all()
    sep_defined = lm.tokenizer.sep_token is not None
    assert heads["sep"].notna().all() == sep_defined
    assert heads["sep"].isna().all() == (not sep_defined)


@pytest.mark.parametrize("family,limit", [("bert", 64), ("roberta", 65), ("distilbert", 64), ("gpt2", 64),
                                          ("llama", 64)])
def test_truncation_to_model_limit_is_counted(family, limit):
    """Sequences longer than the model accepts are cut to its limit (not a crash) and counted.

    The tiny configs have 64 positions; RoBERTa's has 66 with pad_token_id 0, and RoBERTa numbers
    positions from pad_token_id + 1, so 65 tokens fit.
    """
    lm = tiny_model(family)
    assert lm.max_length == limit
    long_text = " ".join(["word"] * 100)
    texts = [long_text, "Short one."]
    result = analyze(lm, texts, n_examples=1, example_tokens=None)
    assert result.counts["truncated"] == 1
    short_len = len(lm.tokenizer("Short one.")["input_ids"])
    assert result.counts["tokens"] == limit + short_len
    assert result.examples[0].probs.shape == (2, 4, limit, limit)
    assert_heads_match(result.heads, reference_heads(lm, texts))


@pytest.mark.slow
def test_truncation_with_max_length(minilm):
    texts = [SENTENCES[8], SENTENCES[0]]
    n0 = len(minilm.tokenizer(SENTENCES[0])["input_ids"])
    result = analyze(minilm, texts, max_length=12, n_examples=0)
    assert result.counts["truncated"] == 1
    assert result.counts["tokens"] == 12 + min(n0, 12)
    assert result.settings["max_length"] == 12
    assert_heads_match(result.heads, reference_heads(minilm, texts, max_length=12))


# --------------------------------------------------------------------------- batching and invariants

@pytest.mark.slow
def test_minilm_batched_equals_one_at_a_time(minilm):
    a = analyze(minilm, SENTENCES, batch_size=4, n_examples=0)
    b = analyze(minilm, SENTENCES, batch_size=1, n_examples=0)
    assert a.counts["batches"] == 3 and b.counts["batches"] == len(SENTENCES)
    assert a.counts["tokens"] == b.counts["tokens"]
    assert torch.equal(a.stats.counts, b.stats.counts)
    assert_heads_match(a.heads, b.heads)


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama"])
def test_tiny_batched_equals_one_at_a_time(family):
    lm = tiny_model(family)
    a = analyze(lm, SHORT, batch_size=4, n_examples=0)
    b = analyze(lm, SHORT, batch_size=1, n_examples=0)
    assert torch.equal(a.stats.counts, b.stats.counts)
    assert_heads_match(a.heads, b.heads)


def _check_invariants(captured, causal: bool):
    lengths = captured.batch.lengths.tolist()
    assert len(set(lengths)) > 1, "the batch must be padded for this check"
    for probs in captured.probs:
        for b, n in enumerate(lengths):
            real = probs[b, :, :n, :]  # real query rows, every key
            torch.testing.assert_close(real.sum(-1), torch.ones_like(real.sum(-1)), atol=1e-5, rtol=0)
            assert torch.count_nonzero(real[..., n:]) == 0  # padded keys get exactly 0
            if causal:
                above = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
                assert torch.count_nonzero(real[..., :n][..., above]) == 0
                assert bool((real[..., :n].diagonal(dim1=-2, dim2=-1) > 0).all())


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "gpt2", "llama", "qwen2", "gpt_neox",
                                    "phi3", "gemma2", "gemma3"])
def test_captured_map_invariants_tiny(family):
    lm = tiny_model(family)
    captured = capture_attention(lm, SHORT)
    assert len(captured.probs) == 2
    _check_invariants(captured, lm.kind == "decoder")


@pytest.mark.slow
def test_captured_map_invariants_real(minilm, smollm2):
    before = hook_snapshot(minilm.model), hook_snapshot(smollm2.model)
    _check_invariants(capture_attention(minilm, SENTENCES[:6]), causal=False)
    _check_invariants(capture_attention(smollm2, SENTENCES[:4]), causal=True)
    assert (hook_snapshot(minilm.model), hook_snapshot(smollm2.model)) == before


# --------------------------------------------------------------------------- undefined statistics

def test_next_and_sep_nan_where_undefined():
    enc = analyze(tiny_model("bert"), SHORT, n_examples=0).heads
    dec_sep = analyze(tiny_model("gpt2", "wordpiece"), SHORT, n_examples=0).heads
    dec_nosep = analyze(tiny_model("gpt2", "bpe"), SHORT, n_examples=0).heads
    assert enc["next"].notna().all() and enc["sep"].notna().all()
    assert dec_sep["next"].isna().all() and dec_sep["sep"].notna().all()
    assert dec_nosep["next"].isna().all() and dec_nosep["sep"].isna().all()
    for heads in (dec_sep, dec_nosep):
        assert not heads["labels"].str.contains("next-token").any()
    assert not dec_nosep["labels"].str.contains("sep").any()


def test_single_token_sequence():
    """T = 1: prev, next and norm_entropy have no defined row; self = first = max_weight = 1."""
    lm = tiny_model("llama")
    ids = lm.tokenizer("Hi")["input_ids"]
    assert len(ids) == 1
    heads = analyze(lm, ["Hi"], n_examples=0, n_clusters=1).heads
    assert heads["prev"].isna().all() and heads["norm_entropy"].isna().all()
    for name in ("self", "first", "max_weight"):
        np.testing.assert_allclose(heads[name], 1.0, atol=1e-6)
    np.testing.assert_allclose(heads[["entropy", "distance", "long"]].to_numpy(), 0.0, atol=1e-6)


# --------------------------------------------------------------------------- accumulators

def test_merge_of_two_halves_equals_whole():
    lm = tiny_model("bert")
    # batch_size 1: every sequence goes through the same computation in the whole and in a half,
    # so only the float64 summation order differs.
    whole = analyze(lm, SHORT, batch_size=1, n_examples=0).stats
    first = analyze(lm, SHORT[:2], batch_size=1, n_examples=0).stats
    second = analyze(lm, SHORT[2:], batch_size=1, n_examples=0).stats
    assert not torch.equal(first.counts, whole.counts)
    merged = first.merge(second)
    assert merged is first
    assert torch.equal(merged.counts, whole.counts)
    np.testing.assert_allclose(merged.sums.numpy(), whole.sums.numpy(), atol=1e-12, rtol=1e-12)
    np.testing.assert_allclose(merged.means(), whole.means(), atol=1e-12, rtol=1e-12, equal_nan=True)
    # and the merged means equal a batched run of the whole corpus (padding does not matter)
    batched = analyze(lm, SHORT, batch_size=4, n_examples=0).stats
    assert_statistics_close(merged.means(), batched.means(), names=ALL_STATISTICS)
    with pytest.raises(ValueError):
        HeadStatistics(lm.sites, 4).merge(HeadStatistics(lm.sites[:1], 4))


def test_head_statistics_counts_rows():
    """Counts are real query rows where each statistic is defined (the setting of docs/statistics.md)."""
    lm = tiny_model("bert")
    lengths = [len(lm.tokenizer(t)["input_ids"]) for t in SHORT]
    stats = analyze(lm, SHORT, n_examples=0).stats
    c = dict(zip(STATISTICS, stats.counts[0].tolist()))
    total = sum(lengths)
    assert c["self"] == c["first"] == c["entropy"] == c["max_weight"] == c["sep"] == total
    assert c["prev"] == c["next"] == total - len(SHORT)
    assert c["norm_entropy"] == total  # every sequence has T >= 2 ([CLS] ... [SEP])
    fresh = HeadStatistics(lm.sites, 4)
    assert np.isnan(fresh.means()).all()


# ----------------------------------------------------------- sliding windows (entropy over the keys a row sees)

def _uniform_queries(lm):
    """Zero every query projection: every row becomes uniform over the keys it may see."""
    from probe.architectures import site_modules

    with torch.no_grad():
        for module in [m for _, m in site_modules(lm.model, lm.spec)]:
            module.q_proj.weight.zero_()
            if module.q_proj.bias is not None:
                module.q_proj.bias.zero_()
    return lm


LONG = ["one two three four five six seven eight nine ten eleven twelve thirteen",
        "alpha beta gamma delta epsilon zeta eta theta"]


@pytest.mark.parametrize("path", ["kernel", "torch"])
@pytest.mark.parametrize("kind,windowed", [("mistral", [0, 1]), ("qwen2-window", [1]), ("gemma3", [0])])
def test_norm_entropy_uses_the_sliding_window(kind, windowed, path, monkeypatch):
    """with uniform rows, norm_entropy = entropy / ln(k_i) is exactly 1 when k_i counts the
    keys the window lets a row see (min(i + 1, W)), in every windowed layer; label broad. On both paths
    of the statistics: the compiled kernel (the default on the CPU) and the tensor operations (GPUs)."""
    from probe.measures.kernel import PATH_ENV

    monkeypatch.setenv(PATH_ENV, path)
    overrides = {"sliding_window": 4} if kind == "mistral" else {}
    lm = _uniform_queries(tiny_model(kind))
    for key, value in overrides.items():
        setattr(lm.model.config, key, value)
    assert [i for i, s in enumerate(lm.sites) if s.window is not None] == windowed
    assert all(lm.sites[i].window == 4 for i in windowed)
    captured = capture_attention(lm, LONG)
    n = int(captured.batch.lengths[0])
    assert n > 8
    for i in windowed:  # rows really are uniform over min(i + 1, 4) keys
        row = captured.probs[i][0, 0, n - 1, :n]
        assert int((row > 0).sum()) == 4
        torch.testing.assert_close(row[row > 0], torch.full((4,), 0.25), atol=1e-6, rtol=0)
    heads = analyze(lm, LONG, n_examples=0, n_clusters=1).heads
    np.testing.assert_allclose(heads["norm_entropy"], 1.0, atol=1e-6)
    assert (heads["labels"].str.contains("broad")).all()
    assert_heads_match(heads, reference_heads(lm, LONG))
    # the same architecture without a window: still 1.0 (k_i = i + 1)
    plain = _uniform_queries(tiny_model({"mistral": "mistral", "qwen2-window": "qwen2", "gemma3": "gemma"}[kind]))
    if kind == "mistral":
        plain.model.config.sliding_window = None
    assert all(s.window is None for s in plain.sites)
    full = analyze(plain, LONG, n_examples=0, n_clusters=1).heads
    np.testing.assert_allclose(full["norm_entropy"], 1.0, atol=1e-6)


def test_ignoring_the_window_would_be_caught():
    """The check above can fail: dividing by ln(i + 1) in a windowed layer gives norm_entropy < 1."""
    lm = _uniform_queries(tiny_model("mistral"))
    lm.model.config.sliding_window = 4
    captured = capture_attention(lm, LONG[:1])
    probs = captured.probs[0][0, 0].double()
    n = probs.shape[0]
    ent = -(probs * probs.clamp(min=1e-300).log()).sum(-1)
    wrong = (ent[1:] / torch.log(torch.arange(2, n + 1, dtype=torch.float64))).mean()
    assert float(wrong) < 0.9
