"""Kovaleva pattern types per (head, sequence) (docs/statistics.md): hand-built maps with hand-computed v, d
and s, segments of sentence pairs, and a tiny model's shares against a row-by-row recomputation."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
import torch

from conftest import bert_tokenizer, tiny_model
from probe.capture.maps import capture_attention, encode
from probe.patterns.kovaleva import COLUMNS, TYPES, PatternTypes, segments, sequence_scores
from probe.runs.analysis import analyze
from probe.sites import Site
from probe.text.inputs import Text


@pytest.fixture(scope="module")
def bert():
    return tiny_model("bert")


def hand_maps(T: int, seg=None) -> torch.Tensor:
    """[1, 5, T, T]: position 0 only; previous token; 0.4 position 0 + 0.6 self; uniform; uniform
    within the query's own segment (uniform over all without segments)."""
    A = torch.zeros(1, 5, T, T)
    A[0, 0, :, 0] = 1
    A[0, 1, 0, 0] = 1
    for i in range(1, T):
        A[0, 1, i, i - 1] = 1
    A[0, 2, :, 0] = 0.4
    A[0, 2] += 0.6 * torch.eye(T)
    A[0, 3] = 1 / T
    seg = torch.zeros(T, dtype=torch.long) if seg is None else seg
    same = (seg[:, None] == seg[None, :]).float()
    A[0, 4] = same / same.sum(1, keepdim=True)
    return A


def test_hand_built_maps_single_sentence(bert):
    batch = encode(bert, ["the cat sat on the mat"])  # [CLS] the cat sat on the mat [SEP]: T = 8, no punctuation
    T = batch.input_ids.shape[1]
    assert T == 8
    scores = sequence_scores(hand_maps(T), batch, bert.tokenizer)[0]  # [heads, (v, d, s)]
    # v: position 0 and the final [SEP] (head 2's row 7 puts 0.4 + 0.6 on them); d: previous + same + next
    want = torch.tensor([[1.0, 2 / 8], [2 / 8, 1.0], [(1 + 6 * 0.4 + 1) / 8, (1 + 1 + 6 * 0.6) / 8],
                         [2 / 8, (2 * 2 / 8 + 6 * 3 / 8) / 8], [2 / 8, (2 * 2 / 8 + 6 * 3 / 8) / 8]])
    torch.testing.assert_close(scores[:, :2], want, atol=1e-6, rtol=0)
    acc = PatternTypes(bert.sites[:1], 5, bert.tokenizer)
    acc.begin_batch(batch)
    acc.update(bert.sites[0], hand_maps(T), batch)
    assert [TYPES[int(i)] for i in acc.counts[0].argmax(-1)] == [
        "vertical", "diagonal", "vertical+diagonal", "heterogeneous", "heterogeneous"]  # no pair: never block


def test_hand_built_block_map_on_a_sentence_pair(bert):
    batch = encode(bert, [Text("the cat sat on the mat", pair="a dog ran in the park")])
    seg, pair = segments(batch)
    # [CLS] the cat sat on the mat [SEP] | a dog ran in the park [SEP]: BERT's segment ids
    assert seg[0].tolist() == [0] * 8 + [1] * 7 and pair.tolist() == [True]
    assert seg[0].tolist() == batch.token_type_ids[0].tolist()
    T = 15
    scores = sequence_scores(hand_maps(T, seg[0]), batch, bert.tokenizer)[0]
    v = (8 * 2 / 8 + 7 * 1 / 7) / 15  # own segment's vertical positions: [CLS] + [SEP] / [SEP]
    d = (2 * 2 / 8 + 6 * 3 / 8 + 2 * 2 / 7 + 5 * 3 / 7) / 15
    torch.testing.assert_close(scores[4], torch.tensor([v, d, 1.0]), atol=1e-6, rtol=0)
    acc = PatternTypes(bert.sites[:1], 5, bert.tokenizer)
    acc.begin_batch(batch)
    acc.update(bert.sites[0], hand_maps(T, seg[0]), batch)
    assert TYPES[int(acc.counts[0, 4].argmax())] == "block" and acc.pairs == 1


def test_segments_without_segment_ids_follow_the_characters():
    """A byte-level BPE tokenizer gives no segment ids: a token is in segment 1 when its characters
    start after the first text; special tokens take the segment of the token before them."""
    lm = tiny_model("llama")
    batch = encode(lm, [Text("One two three.", pair="Four five.")])
    assert batch.token_type_ids is None or len(set(batch.token_type_ids[0].tolist())) == 1
    seg, pair = segments(batch)
    n = int(batch.lengths[0])
    texts = [batch.covered_text(0, p).strip() for p in range(n)]
    first = [t for t, s in zip(texts, seg[0, :n].tolist()) if s == 0]
    second = [t for t, s in zip(texts, seg[0, :n].tolist()) if s == 1]
    assert "".join(first) == "Onetwothree." and "".join(second) == "Fourfive."


def recompute(lm, text: Text | str) -> list[list[str]]:
    """Types of every (site, head) on one text, from its maps captured alone, row by row."""
    cap = capture_attention(lm, text)
    b = cap.batch
    n = int(b.lengths[0])
    sep_id = lm.tokenizer.sep_token_id
    ids = b.input_ids[0, :n].tolist()
    vertical = {0} | {p for p in range(n) if ids[p] == sep_id}
    for p in range(n):
        chars = "".join(ch for ch in b.covered_text(0, p) if not ch.isspace())
        if not b.special[0, p] and chars and all(unicodedata.category(c).startswith("P") for c in chars):
            vertical.add(p)
    is_pair = isinstance(text, Text) and text.pair is not None
    seg = lm.tokenizer(text.text, text.pair)["token_type_ids"] if is_pair else [0] * n
    out = []
    for probs in cap.probs:
        A = probs[0, :, :n, :n].double()
        types = []
        for h in range(A.shape[0]):
            v = sum(float(A[h, i, j]) for i in range(n) for j in vertical) / n
            d = sum(float(A[h, i, j]) for i in range(n) for j in (i - 1, i, i + 1) if 0 <= j < n) / n
            s = sum(float(A[h, i, j]) for i in range(n) for j in range(n) if seg[i] == seg[j]) / n
            if v >= 0.3 and d >= 0.3:
                types.append("vertical+diagonal")
            elif v >= 0.5:
                types.append("vertical")
            elif d >= 0.5:
                types.append("diagonal")
            elif is_pair and s >= 0.8:
                types.append("block")
            else:
                types.append("heterogeneous")
        out.append(types)
    return out


@pytest.mark.parametrize("pairs", [False, True])
def test_shares_in_the_loop_equal_a_row_by_row_recomputation(bert, pairs):
    if pairs:
        texts = [Text("Is it raining?", pair="No; it is sunny."), Text("Who called?", pair="Nobody did, I think."),
                 Text("Stop.", pair="Why?")]
    else:
        texts = [Text("The cat sat on the mat, and slept."), Text("Dogs bark."), Text("Is it raining? No!")]
    acc = PatternTypes(bert.sites, bert.geometry.n_heads, bert.tokenizer)
    res = analyze(bert, texts, batch_size=2, n_examples=0, accumulators=[acc])
    want = np.zeros((len(bert.sites), bert.geometry.n_heads, len(TYPES)))
    for t in texts:
        for s, types in enumerate(recompute(bert, t)):
            for h, name in enumerate(types):
                want[s, h, TYPES.index(name)] += 1 / len(texts)
    got = res.heads[[COLUMNS[t] for t in TYPES]].to_numpy().reshape(want.shape)
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.allclose(got.sum(-1), 1.0)
    assert res.heads["pattern"].tolist() == [TYPES[i] for i in want.reshape(-1, len(TYPES)).argmax(-1)]
    per_layer = res.results["pattern_types"].per_layer
    np.testing.assert_allclose(per_layer[list(TYPES)].to_numpy(), want.mean(1), atol=1e-12)
    assert res.results["pattern_types"].pairs == (3 if pairs else 0)


def test_merge_adds_counts():
    site = Site("encoder", 0)
    tok = bert_tokenizer()
    a, b = PatternTypes([site], 2, tok), PatternTypes([site], 2, tok)
    a.counts[0, 0, 1] = 3
    b.counts[0, 0, 1] = 2
    b.sequences, a.sequences = 2, 3
    assert a.merge(b).counts[0, 0, 1] == 5 and a.sequences == 5
