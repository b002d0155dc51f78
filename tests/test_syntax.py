"""Syntax scoring (docs/statistics.md, "Syntax"): a hand-built attention on hand-made
trees gives hand-computed accuracies, baselines and intervals in both directions; causal sites
predict only leftwards; multiword tokens and joined words are counted, not scored; the label rule;
on tiny models the accumulator equals an independent computation; UD EWT dev aligns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wordsupport import batch_of, tokenizer_only, wilson_by_hand

from conftest import SHARED_DATA, bert_tokenizer, bpe_tokenizer, conllu, tiny_model
from probe.capture.maps import capture_attention
from probe.linguistic.conllu import parse_conllu, read_conllu
from probe.linguistic.syntax import SyntaxAccumulator, candidates, predictions
from probe.linguistic.words import batch_words
from probe.sites import Site
from probe.text.inputs import iter_batches

ENCODER = Site("encoder", 0)
DECODER = Site("decoder", 0, causal=True)

DIDNT = conllu("didnt")

DOGS = conllu("dogs")

COMPANY = conllu("company")


def _run(conllu: str, probs_for, site=ENCODER, n_heads=1, **kw):
    bank = parse_conllu(conllu)
    texts = bank.texts()
    batch = batch_of(bert_tokenizer(), texts)
    B, T = batch.input_ids.shape
    probs = torch.zeros(B, n_heads, T, T)
    for r in range(B):
        n = int(batch.lengths[r])
        probs[r, :, :n, :n] = probs_for(r, n, batch)
    acc = SyntaxAccumulator([site], n_heads, min_count=1, **kw)
    acc.begin_batch(batch)
    acc.update(site, probs, batch)
    acc.end_batch(batch)
    return acc.result(), acc


def _shift(step):
    def build(r, n, batch):
        a = torch.zeros(n, n)
        a[torch.arange(n), (torch.arange(n) + step) % n] = 1.0  # next token (step 1) or previous (step -1)
        return a
    return build


def _acc(res, rel, direction, kind="head"):
    t = res.table
    row = t[(t["relation"] == rel) & (t["direction"] == direction) & (t["kind"] == kind)].iloc[0]
    return row


def test_next_token_attention_by_hand():
    # tokens [CLS] i didn ' t go . [SEP]; surface words I, didn't, go, .; gold heads all "go".
    # Every token attends to the next one: I -> didn't (wrong), didn't -> go (right for did and n't),
    # go -> . , . -> [SEP] (no word: ties go to the leftmost other word, I; wrong).
    res, _ = _run(DIDNT, _shift(1))
    expected = {("all", "dep->head"): (2, 4), ("all", "head->dep"): (1, 4),
                ("nsubj", "dep->head"): (0, 1), ("aux", "dep->head"): (1, 1), ("advmod", "dep->head"): (1, 1),
                ("punct", "dep->head"): (0, 1), ("punct", "head->dep"): (1, 1), ("aux", "head->dep"): (0, 1)}
    for (rel, direction), (k, n) in expected.items():
        row = _acc(res, rel, direction)
        assert (row["n"], row["accuracy"]) == (n, pytest.approx(k / n)), (rel, direction)
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(wilson_by_hand(k, n)[0]),
                                                   pytest.approx(wilson_by_hand(k, n)[1]))
    # baselines: offsets (gold head - dependent, in surface words) +2, +1, +1, -1
    for rel, direction, offset, acc in (("all", "dep->head", 1, 0.5), ("all", "head->dep", -1, 0.5),
                                        ("nsubj", "dep->head", 2, 1.0), ("nsubj", "head->dep", -2, 1.0),
                                        ("punct", "dep->head", -1, 1.0), ("punct", "head->dep", 1, 1.0)):
        row = _acc(res, rel, direction, "baseline")
        assert (row["offset"], row["accuracy"]) == (offset, pytest.approx(acc)), (rel, direction)
    assert res.counts["dependencies"] == 4 and res.counts["within_one_unit"] == 0
    best = res.best.set_index(["relation", "direction"])
    assert best.loc[("aux", "dep->head"), "gain"] == pytest.approx(0.0)  # 1/1 vs the +1 baseline's 1/1


def test_causal_site_predicts_only_leftwards():
    # every token attends to the previous one; in a causal site "I" sees no other word (no prediction),
    # "didn't" -> I, go -> didn't (right for did and n't, head->dep), . -> go (right, dep->head)
    res, _ = _run(DIDNT, _shift(-1), site=DECODER)
    assert _acc(res, "all", "dep->head")["accuracy"] == pytest.approx(1 / 4)
    assert _acc(res, "all", "head->dep")["accuracy"] == pytest.approx(2 / 4)
    assert res.reachable["all"] == {"dep->head": pytest.approx(1 / 4), "head->dep": pytest.approx(3 / 4)}


def test_predictions_and_candidates_by_hand():
    m = torch.tensor([[[[0.2, 0.3, 0.5], [0.5, 0.1, 0.4], [0.3, 0.6, 0.1]]]])  # [1, 1, 3, 3]
    names = torch.tensor([[True, True, True]])
    assert predictions(m, candidates(names, False)).tolist() == [[[2, 0, 1]]]
    assert predictions(m, candidates(names, True)).tolist() == [[[-1, 0, 1]]]  # word 0 sees no other word
    joined = torch.tensor([[True, False, True]])  # word 1 is part of word 0's unit
    assert predictions(m, candidates(joined, False)).tolist()[0][0][::2] == [2, 0]


def test_label_when_a_head_beats_its_baseline_by_ten_points():
    # nsubj at offsets +1 and +2: the best fixed offset gets 1 of 2; a head reading the gold tree gets 2 of 2
    bank = parse_conllu(DOGS)

    def gold(r, n, batch):
        a = torch.full((n, n), 1.0 / n)
        words = batch_words(batch).token_word[r, :n].tolist()
        sent = bank.sentences[r]
        for i, h in enumerate(sent.heads):
            if h >= 0:
                q, k = words.index(sent.surface[i]), words.index(sent.surface[h])
                a[q] = 0
                a[q, k] = 1.0
        return a

    res, acc = _run(DOGS, gold, n_heads=2)
    nsubj = _acc(res, "nsubj", "dep->head")
    assert (nsubj["n"], nsubj["accuracy"]) == (2, 1.0)
    assert _acc(res, "nsubj", "dep->head", "baseline")["accuracy"] == pytest.approx(0.5)
    labels = {(layer, head, label): s for layer, head, label, s in acc.head_labels()}
    assert set(labels) == {(0, 0, "syntactic:nsubj"), (0, 1, "syntactic:nsubj")}  # punct, advmod: baseline 1.0
    assert labels[(0, 0, "syntactic:nsubj")] == pytest.approx(1.0 / (0.5 + 0.1))
    cols = acc.columns()
    assert cols["syntax_relation"].tolist() == ["nsubj dep->head"] * 2
    assert cols["syntax_gain"].tolist() == pytest.approx([0.5, 0.5])


def test_min_count_and_within_unit():
    res, acc = _run(COMPANY, _shift(1))
    assert res.counts["within_one_unit"] == 1 and res.counts["within_one_unit_by_relation"] == {"case": 1}
    assert res.counts["dependencies"] == 3
    acc2 = SyntaxAccumulator([ENCODER], 1, min_count=2)
    acc2.merge(acc)
    assert set(acc2.table()["relation"]) == {"all"}  # det, nmod and punct have 1 dependency each
    merged = SyntaxAccumulator([ENCODER], 1, min_count=1).merge(acc).merge(acc)
    assert merged.result().counts["dependencies"] == 6
    np.testing.assert_array_equal(merged.correct, 2 * acc.correct)


def _independent(lm, sentences):
    """Correct counts per (site, head) for 'all' in both directions, from one capture per sentence
    and plain loops (no probe.linguistic.words)."""
    H = lm.geometry.n_heads
    right = np.zeros((len(lm.sites), 2, H), dtype=int)
    n = 0
    for s in sentences:
        cap = capture_attention(lm, [s.to_text()])
        offsets, special = cap.batch.offsets[0].tolist(), cap.batch.special[0].tolist()
        tok_word = []
        for (a, b), sp in zip(offsets, special):
            chars = [] if sp else [i for i in range(a, b) if not s.text[i].isspace()]
            tok_word.append(next((w for w, (ws, we) in enumerate(s.spans) if chars and ws <= chars[0] < we), -1))
        W = len(s.spans)
        pairs = [(s.surface[i], s.surface[h]) for i, h in enumerate(s.heads) if h >= 0 and s.surface[i] != s.surface[h]]
        n += len(pairs)
        for si, probs in enumerate(cap.probs):
            for h in range(H):
                a = probs[0, h].double().numpy()
                m = np.zeros((W, W))
                for w in range(W):
                    rows = [t for t, x in enumerate(tok_word) if x == w]
                    for v in range(W):
                        cols = [t for t, x in enumerate(tok_word) if x == v]
                        m[w, v] = a[np.ix_(rows, cols)].sum(1).mean()
                pred = []
                for w in range(W):
                    others = [v for v in range(W) if v != w and (lm.kind != "decoder" or v < w)]
                    pred.append(max(others, key=lambda v: (m[w, v], -v)) if others else -1)
                for d, g in pairs:
                    right[si, 0, h] += pred[d] == g
                    right[si, 1, h] += pred[g] == d
    return right, n


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_accumulator_equals_an_independent_computation(kind, tmp_path):
    from probe.linguistic import syntax_heads

    text = DIDNT + DOGS + COMPANY
    lm = tiny_model(kind)
    right, n = _independent(lm, parse_conllu(text).sentences)
    path = tmp_path / "t.conllu"
    path.write_text(text)
    res = syntax_heads(lm, path, min_count=1, batch_size=2)
    t = res.table
    assert res.counts["dependencies"] == n
    for k, direction in enumerate(("dep->head", "head->dep")):
        rows = t[(t["relation"] == "all") & (t["direction"] == direction) & (t["kind"] == "head")]
        np.testing.assert_array_equal(np.rint(rows["accuracy"].to_numpy() * n).astype(int), right[:, k].ravel())


UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"


@pytest.mark.skipif(not UD_DEV.exists(), reason=f"shared UD EWT data not found at {UD_DEV}")
@pytest.mark.parametrize("make", [bert_tokenizer, bpe_tokenizer], ids=["wordpiece", "bpe"])
def test_ud_ewt_dev_aligns(make):
    """Every sentence aligns; words that one token joins (BPE's '.)', WordPiece's 'bikes' + '##hop'
    over 'bike' + 'shop') stay under 0.5% of the words."""
    bank = read_conllu(UD_DEV)
    status, merged = [], 0
    for batch in iter_batches(tokenizer_only(make(), 8192), bank.texts(), batch_size=64):
        words = batch_words(batch)
        status += words.status
        merged += sum(words.merged(r) for r in range(len(batch)))
    n_words = sum(len(s.spans) for s in bank.sentences)
    assert status == [None] * len(bank.sentences)
    assert 0 < merged < 0.005 * n_words
