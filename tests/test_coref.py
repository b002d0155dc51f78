"""Coreference scoring (docs/statistics.md, "Coreference"): hand-made examples give
hand-computed accuracies and Wilson intervals for heads and baselines, the label rule, the causal
candidate rule, counted skips; on tiny models, the accumulator equals an independent computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wordsupport import batch_of, wilson_by_hand

from conftest import bert_tokenizer, tiny_model
from probe.capture.maps import capture_attention
from probe.linguistic import coref_heads
from probe.linguistic.coref import CorefAccumulator, baseline_answers
from probe.linguistic.gap import CorefExample, CorefSet, builtin_examples, parse_marked, split_words
from probe.linguistic.intervals import wilson
from probe.sites import Site

ENCODER = Site("encoder", 0)
DECODER = Site("decoder", 0, causal=True)

EXAMPLES = [("[A Anna] thanked [B Clara] because [P she] left.", "A"),
            ("[A Anna] thanked [B Clara] because [P she] left.", "B"),
            ("[A Tom] met [B Eric] before [P he] left.", "A")]


def _score(examples, sites=(ENCODER,), n_heads=2, head_rows=None, **kw):
    """Run the accumulator on one batch; pronoun rows of head h put head_rows(h, truth_a) on the
    tokens of A (index 0) and B (index 1); every other row is uniform."""
    texts = [ex.to_text() for ex in examples]
    batch = batch_of(bert_tokenizer(), texts)
    B, T = batch.input_ids.shape
    tokens = [bert_tokenizer().convert_ids_to_tokens(batch.input_ids[r].tolist()) for r in range(B)]
    probs = batch.attention_mask[:, None, None, :].float().expand(B, n_heads, T, T).clone()
    probs /= probs.sum(-1, keepdim=True)
    for r, ex in enumerate(examples):
        p = tokens[r].index(ex.mention("pronoun").lower())
        a, b = tokens[r].index(ex.mention("a").lower()), tokens[r].index(ex.mention("b").lower())
        for h in range(n_heads):
            probs[r, h, p] = 0
            probs[r, h, p, [a, b]] = torch.tensor(head_rows(h, ex.a_coref))
    acc = CorefAccumulator(list(sites), n_heads, **kw)
    acc.begin_batch(batch)
    for site in sites:
        acc.update(site, probs, batch)
    acc.end_batch(batch)
    return acc


def _rows(h, truth_a):
    # head 0 always leans to A (0.6 vs 0.4); head 1 looks only at the true antecedent
    return [0.6, 0.4] if h == 0 else ([1.0, 0.0] if truth_a else [0.0, 1.0])


def test_hand_computed_accuracies_and_intervals():
    examples = [parse_marked(t, ans, f"x{i}") for i, (t, ans) in enumerate(EXAMPLES)]
    acc = _score(examples, head_rows=_rows)
    table = acc.table()
    heads = table[table["kind"] == "head"].set_index("head")
    base = table[table["kind"] != "head"].set_index("kind")
    # head 0 answers A three times: right on examples 1 and 3; head 1 is always right;
    # nearest answers B (the name two words from the pronoun), first answers A
    expected = {0: (2, 3), 1: (3, 3)}
    for h, (k, n) in expected.items():
        assert heads.loc[h, "n"] == n and heads.loc[h, "accuracy"] == pytest.approx(k / n)
        low, high = wilson_by_hand(k, n)
        assert (heads.loc[h, "ci_low"], heads.loc[h, "ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert base.loc["nearest", "accuracy"] == pytest.approx(1 / 3)
    assert base.loc["first", "accuracy"] == pytest.approx(2 / 3)
    # worked by hand from the formula (z = 1.96): 2 of 3 -> [0.2077, 0.9385], 1 of 3 -> [0.0615, 0.7923]
    assert heads.loc[0, "ci_low"] == pytest.approx(0.20766, abs=1e-4)
    assert heads.loc[0, "ci_high"] == pytest.approx(0.93851, abs=1e-4)
    assert base.loc["nearest", "ci_low"] == pytest.approx(0.06149, abs=1e-4)
    assert base.loc["nearest", "ci_high"] == pytest.approx(0.79234, abs=1e-4)
    # 3 of 3 has a lower end of 0.4385: not above the best baseline (2/3), so no label yet
    assert heads.loc[1, "ci_low"] == pytest.approx(0.43850, abs=1e-4)
    assert acc.head_labels() == []
    assert acc.counts() == {"examples": 3, "scored": 3, "unaligned": {}, "skipped": {}}


def test_label_when_the_interval_clears_the_best_baseline():
    examples = [parse_marked(t, ans, f"x{i}-{j}") for j in range(10) for i, (t, ans) in enumerate(EXAMPLES)]
    acc = _score(examples, head_rows=_rows)
    # head 1: 30 of 30, lower end 1 / (1 + z^2/30) = 0.8865 > 2/3 (first); strength 0.8865 / (2/3)
    low = wilson_by_hand(30, 30)[0]
    assert low == pytest.approx(0.88649, abs=1e-4)
    labels = acc.head_labels()
    assert [(layer, head, label) for layer, head, label, _ in labels] == [(0, 1, "coreference")]
    assert labels[0][3] == pytest.approx(low / (2 / 3))
    assert acc.columns()["coref_accuracy"].tolist() == pytest.approx([2 / 3, 1.0])


def test_causal_candidate_rule_leaves_out_and_counts():
    after = parse_marked("[A Anna] said [P she] saw [B Clara] there.", "A", "after")
    before = parse_marked("[A Anna] thanked [B Clara] because [P she] left.", "A", "before")
    enc = _score([after, before], head_rows=_rows)
    assert enc.n == 2 and enc.counts()["skipped"] == {}
    dec = _score([after, before], sites=(DECODER,), head_rows=_rows)
    assert dec.preceding_only and dec.n == 1
    assert dec.counts()["skipped"] == {"candidate after the pronoun": 1}
    t = dec.table()
    assert set(t["n"]) == {1}  # heads and baselines on the same examples
    forced = _score([after, before], sites=(DECODER,), head_rows=_rows, preceding_only=False)
    assert forced.n == 2


def test_skips_and_unaligned_are_counted():
    both = CorefExample("both", "Anna met Clara and she left.", (19, 22), (0, 4), (9, 14), True, True)
    neither = CorefExample("neither", "Anna met Clara and she left.", (19, 22), (0, 4), (9, 14), False, False)
    overlap = CorefExample("overlap", "Anna met Clara and she left.", (0, 4), (0, 4), (9, 14), True, False)
    ok = parse_marked(*EXAMPLES[0], "ok")
    acc = _score([both, neither, overlap, ok], head_rows=_rows)
    assert acc.counts() == {"examples": 4, "scored": 1, "unaligned": {},
                            "skipped": {"no single antecedent": 2, "overlapping mentions": 1}}
    # a text cut to the token limit is not aligned
    batch = batch_of(bert_tokenizer(), [ok.to_text()], max_length=4)
    acc = CorefAccumulator([ENCODER], 2, unaligned={"offsets do not match the names": 2})
    acc.begin_batch(batch)
    assert acc.counts()["unaligned"] == {"offsets do not match the names": 2, "truncated": 1}
    assert acc.counts()["examples"] == 3


def test_baselines_by_hand():
    assert baseline_answers([5], [0], [3]) == {"nearest": False, "first": True}
    assert baseline_answers([5], [2, 3], [8]) == {"nearest": True, "first": True}  # 2 words (from 3) vs 3
    assert baseline_answers([5], [0, 1], [8]) == {"nearest": False, "first": True}  # 4 words vs 3
    assert baseline_answers([5], [3], [7]) == {"nearest": True, "first": True}  # a tie goes to the one before


def test_wilson_matches_the_formula_and_handles_empty():
    for k, n in ((0, 5), (3, 10), (50, 100), (7, 7)):
        low, high = wilson([k], [n])
        assert (low[0], high[0]) == (pytest.approx(wilson_by_hand(k, n)[0]), pytest.approx(wilson_by_hand(k, n)[1]))
    low, high = wilson([0], [0])
    assert np.isnan(low[0]) and np.isnan(high[0])


def _independent_accuracy(lm, examples):
    """Per (site, head), examples answered right, computed from each example's own capture with
    plain loops over tokens and words (no probe.linguistic.words)."""
    right = np.zeros((len(lm.sites), lm.geometry.n_heads), dtype=int)
    causal = lm.kind == "decoder"
    n = 0
    for ex in examples:
        if ex.a_coref == ex.b_coref or (causal and max(ex.a[1], ex.b[1]) > ex.pronoun[0]):
            continue
        n += 1
        cap = capture_attention(lm, [ex.to_text()])
        spans = split_words(ex.text)
        offsets, special = cap.batch.offsets[0].tolist(), cap.batch.special[0].tolist()
        word = []
        for (s, e), sp in zip(offsets, special):
            chars = [i for i in range(s, e) if not ex.text[i].isspace()] if not sp else []
            word.append(next((w for w, (ws, we) in enumerate(spans) if chars and ws <= chars[0] < we), -1)
                        if chars else (-2 if not sp and e > s else -1))
        for t in range(len(word) - 1, -1, -1):  # whitespace pieces belong to the next word
            if word[t] == -2:
                word[t] = word[t + 1] if t + 1 < len(word) and word[t + 1] >= 0 else -1
        ids = ex.to_text().meta["coref"]
        p_tok = [t for t, w in enumerate(word) if w in ids["pronoun"]]
        a_tok = [t for t, w in enumerate(word) if w in ids["a"]]
        b_tok = [t for t, w in enumerate(word) if w in ids["b"]]
        for i, probs in enumerate(cap.probs):
            for h in range(lm.geometry.n_heads):
                row = probs[0, h, p_tok].float().mean(0)
                answers_a = float(row[a_tok].sum()) > float(row[b_tok].sum())
                right[i, h] += answers_a == ex.a_coref
    return right, n


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_accumulator_equals_an_independent_computation(kind):
    lm = tiny_model(kind)
    examples = builtin_examples(limit=24).examples
    examples.append(parse_marked("[A Anna] said [P she] saw [B Clara] there.", "A", "after"))  # decoders skip it
    right, n = _independent_accuracy(lm, examples)
    res = coref_heads(lm, CorefSet(examples, len(examples), [], "test"), batch_size=5)
    heads = res.heads
    assert res.counts["scored"] == n == (24 if lm.kind == "decoder" else 25)
    np.testing.assert_array_equal(heads["accuracy"].to_numpy() * n, right.ravel())


@pytest.mark.slow
def test_minilm_builtin_equals_an_independent_computation(minilm):
    examples = builtin_examples(limit=20).examples
    right, n = _independent_accuracy(minilm, examples)
    res = coref_heads(minilm, CorefSet(examples, len(examples), [], "test"))
    assert res.counts["scored"] == n == 20
    np.testing.assert_array_equal(np.rint(res.heads["accuracy"].to_numpy() * n).astype(int), right.ravel())
