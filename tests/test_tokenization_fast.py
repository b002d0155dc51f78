"""The vectorized word alignment, whitespace split and collation give exactly the batches of the
per-character / per-token implementations they replaced (written out here as the reference), on
MiniLM's WordPiece tokenizer, the tests' byte-level BPE and tiny T5 and Marian models."""

from __future__ import annotations

import bisect

import pytest
import torch

from conftest import tiny_model
from probe.text.inputs import Text, collate, tokenize
from probe.text.tokenization import _word_ids

TEXTS = ["The cat sat on the mat.", "  Leading and trailing spaces  ", "tabs\tand\nnew lines",
         "non\u00a0breaking\u2003em space, caf\u00e9 na\u00efve", "x", "Punctuation!!! (nested) [brackets]",
         "emoji \U0001f600 and CJK \u4e2d\u6587 text", "multi   space    runs"]


def reference_spans(text: str) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, ch in enumerate(text):
        if ch.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans


def reference_word_ids(text, offsets, special, spans):
    starts = [s for s, _ in spans]
    out = []
    for (s, e), sp in zip(offsets, special):
        if sp or e <= s:
            out.append(-1)
            continue
        first = next((i for i in range(s, e) if not text[i].isspace()), None)
        if first is None:
            out.append(-1)
            continue
        w = bisect.bisect_right(starts, first) - 1
        out.append(w if w >= 0 and spans[w][0] <= first < spans[w][1] else -1)
    return out


def reference_collate(lm, items, texts):
    """The old collation: one torch.tensor per row and field (sources only)."""
    B, T = len(items), max(len(t) for t in items)
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    offsets = torch.zeros(B, T, 2, dtype=torch.long)
    special = torch.zeros(B, T, dtype=torch.bool)
    word_ids = torch.full((B, T), -1, dtype=torch.long)
    tt = torch.zeros(B, T, dtype=torch.long) if items[0].token_type_ids is not None else None
    for r, t in enumerate(items):
        n = len(t)
        ids[r, :n] = torch.tensor(t.ids)
        mask[r, :n] = 1
        offsets[r, :n] = torch.tensor(t.offsets, dtype=torch.long).reshape(n, 2)
        special[r, :n] = torch.tensor(t.special)
        word_ids[r, :n] = torch.tensor(t.word_ids)
        if tt is not None:
            tt[r, :n] = torch.tensor(t.token_type_ids)
    return {"input_ids": ids, "attention_mask": mask, "offsets": offsets, "special": special,
            "word_ids": word_ids, "token_type_ids": tt}


def test_whitespace_split_equals_the_per_character_split():
    for text in TEXTS + ["", " ", "\x1c\x1dunit separators\x1f", "a\u2028b\u2029c\x85d"]:
        assert Text(text).word_spans() == reference_spans(text), repr(text)


def test_word_ids_equal_the_per_token_loop_on_hand_made_offsets():
    text = "ab  cd\u00a0ef g"
    spans = reference_spans(text)
    offsets = [(0, 0), (0, 2), (2, 4), (2, 5), (4, 6), (6, 7), (6, 9), (9, 10), (10, 11), (11, 11), (0, 0)]
    special = [True] + [False] * 9 + [True]
    assert _word_ids(text, offsets, special, spans) == reference_word_ids(text, offsets, special, spans)
    given = [(0, 1), (4, 6)]  # words a reader brings (CoNLL-U, GAP): not whitespace runs
    assert _word_ids(text, offsets, special, given) == reference_word_ids(text, offsets, special, given)
    assert _word_ids("", [], [], []) == []
    assert _word_ids("   ", [(0, 2)], [False], []) == [-1]


@pytest.mark.parametrize("kind", ["bert", "gpt2", "t5", "marian"])
def test_batches_equal_the_per_token_reference(kind):
    lm = tiny_model(kind)
    if kind in ("t5", "marian"):
        texts = [Text(t, target="target " + t[:6], index=i) for i, t in enumerate(TEXTS)]
    else:
        texts = [Text(t, pair="second  segment\u00a0" + t[:5], index=i) for i, t in enumerate(TEXTS)]
        texts += [Text(t, index=len(TEXTS) + i) for i, t in enumerate(TEXTS)]
    groups = [texts[:len(TEXTS)], texts[len(TEXTS):]] if kind in ("bert", "gpt2") else [texts]
    checked = 0
    for group in groups:
        items = tokenize(lm, group)
        for item, text in zip(items, group):
            # words are those of the first text (a pair's second segment has none: -1), as before
            sides = [(item, text.text if text.pair is None else text.text + " " + text.pair, text.words, text.text)]
            if item.target is not None:
                sides.append((item.target, text.target, None, text.target))
            for tok, full, words, own in sides:
                spans = reference_spans(own) if words is None else words
                assert tok.word_ids == reference_word_ids(full, tok.offsets, tok.special, spans)
                checked += sum(w >= 0 for w in tok.word_ids)
        batch, ref = collate(lm, items, group), reference_collate(lm, items, group)
        for name, want in ref.items():
            got = getattr(batch, name)
            assert (got is None) == (want is None), name
            if want is not None:
                assert got.dtype == want.dtype and torch.equal(got, want), name
        if items[0].target is not None:
            tref = reference_collate(lm, [t.target for t in items], group)
            assert torch.equal(batch.target.input_ids, tref["input_ids"])
            assert torch.equal(batch.target.word_ids, tref["word_ids"])
    assert checked > 20  # the texts' tokens were aligned to words
