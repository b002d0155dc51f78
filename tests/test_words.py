"""Word-level attention (docs/statistics.md, "Word-level attention"): hand-built attention matrices
give hand-computed word-level matrices for WordPiece, byte-level BPE and multiword tokens; rows sum
to 1; the alignment rules (whitespace pieces, words one token joins, truncation)."""

from __future__ import annotations

import pytest
import torch
from wordsupport import batch_of

from conftest import bert_tokenizer, bpe_tokenizer, conllu
from probe.linguistic.conllu import parse_conllu
from probe.linguistic.words import align_row, batch_words, units, word_attention, word_matrix
from probe.text.inputs import Text

DIDNT = conllu("didnt")


def _tokens(tok, batch, row=0):
    n = int(batch.lengths[row])
    return tok.convert_ids_to_tokens(batch.input_ids[row, :n].tolist())


def test_wordpiece_hand_computed():
    tok = bert_tokenizer()
    batch = batch_of(tok, [Text("the playwrights")])
    assert _tokens(tok, batch) == ["[CLS]", "the", "playwright", "##s", "[SEP]"]
    words = batch_words(batch)
    assert words.token_word[0].tolist() == [-1, 0, 1, 1, -1] and words.status == [None]
    a = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1],     # [CLS]
                      [0.2, 0.2, 0.3, 0.2, 0.1],     # the
                      [0.1, 0.4, 0.2, 0.1, 0.2],     # playwright
                      [0.3, 0.1, 0.4, 0.2, 0.0],     # ##s
                      [0.25, 0.25, 0.25, 0.25, 0.0]])  # [SEP]
    full, unit_word = word_attention(a[None], words.token_word[0].tolist())
    assert unit_word == [-1, 0, 1, -1]  # [CLS], the, playwrights, [SEP]
    # by hand: columns playwright + ##s summed; the row of "playwrights" is the mean of its two rows:
    # ([0.1, 0.4, 0.3, 0.2] + [0.3, 0.1, 0.6, 0.0]) / 2
    expected = torch.tensor([[0.6, 0.1, 0.2, 0.1],
                             [0.2, 0.2, 0.5, 0.1],
                             [0.2, 0.25, 0.45, 0.1],
                             [0.25, 0.25, 0.5, 0.0]])
    torch.testing.assert_close(full[0], expected)
    torch.testing.assert_close(full[0].sum(-1), torch.ones(4))
    words_only = word_matrix(a[None, None], words.token_word, 2)  # [1, 1, 2, 2]: words, no special columns
    torch.testing.assert_close(words_only[0, 0], torch.tensor([[0.2, 0.5], [0.25, 0.45]]))


def test_byte_level_bpe_whitespace_piece_belongs_to_the_next_word():
    tok = bpe_tokenizer()
    batch = batch_of(tok, [Text("Hi été")])
    assert _tokens(tok, batch) == ["Hi", "Ġ", "Ã©t", "Ã©"]  # the space is a piece of its own
    assert batch.word_ids[0].tolist() == [0, -1, 1, 1]  # the batch gives it no word ...
    words = batch_words(batch)
    assert words.token_word[0].tolist() == [0, 1, 1, 1]  # ... the rule attaches it to "été"
    a = torch.tensor([[1.0, 0.0, 0.0, 0.0],
                      [0.6, 0.4, 0.0, 0.0],
                      [0.2, 0.3, 0.5, 0.0],
                      [0.1, 0.2, 0.3, 0.4]])  # causal
    full, unit_word = word_attention(a, words.token_word[0].tolist())
    assert unit_word == [0, 1]
    # row "été" = mean of rows 1-3 summed over columns {0} and {1, 2, 3}: ([.6,.4]+[.2,.8]+[.1,.9]) / 3
    torch.testing.assert_close(full, torch.tensor([[1.0, 0.0], [0.3, 0.7]]))


def test_trailing_whitespace_keeps_a_column_and_rows_sum_to_one():
    tok = bpe_tokenizer()
    batch = batch_of(tok, [Text("Hi été\n")])
    assert _tokens(tok, batch)[-1] == "Ċ"
    token_word = batch_words(batch).token_word[0].tolist()
    assert token_word == [0, 1, 1, 1, -1]
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(3, 5, 5), -1)
    full, unit_word = word_attention(a, token_word)
    assert unit_word == [0, 1, -1]
    torch.testing.assert_close(full.sum(-1), torch.ones(3, 3))


@pytest.mark.parametrize("make", [bert_tokenizer, bpe_tokenizer], ids=["wordpiece", "bpe"])
def test_rows_sum_to_one_on_random_attention(make):
    tok = make()
    texts = [Text("Zoë's naïve café—opened in 1995—isn't \"cheap\", is it?"), Text("Short one."),
             Text("Words  with   odd\tspacing\nand a line end.\n")]
    batch = batch_of(tok, texts)
    words = batch_words(batch)
    torch.manual_seed(1)
    T = batch.input_ids.shape[1]
    for row in range(len(texts)):
        n = int(batch.lengths[row])
        a = torch.softmax(torch.randn(4, n, n), -1)
        full, unit_word = word_attention(a, words.token_word[row, :n].tolist())
        torch.testing.assert_close(full.sum(-1), torch.ones(4, len(unit_word)))
        assert sorted(w for w in unit_word if w >= 0) == sorted(set(words.group[row]))
    assert T >= 2 and words.status == [None, None, None]


def test_multiword_token_both_words_share_the_surface_row():
    tok = bert_tokenizer()
    sentence = parse_conllu(DIDNT).sentences[0]
    assert sentence.surface == [0, 1, 1, 2, 3]  # I, did, n't, go, .  ->  I, didn't, go, .
    batch = batch_of(tok, [sentence.to_text()])
    assert _tokens(tok, batch) == ["[CLS]", "i", "didn", "'", "t", "go", ".", "[SEP]"]
    token_word = batch_words(batch).token_word[0].tolist()
    assert token_word == [-1, 0, 1, 1, 1, 2, 3, -1]
    a = torch.zeros(8, 8)
    a[torch.arange(8), (torch.arange(8) + 1) % 8] = 1.0  # every token attends to the next one
    full, unit_word = word_attention(a, token_word)
    assert unit_word == [-1, 0, 1, 2, 3, -1]  # [CLS], I, didn't, go, ., [SEP]
    # by hand: "didn't" = tokens 2-4 attend to tokens 3, 4 (didn't) and 5 (go): 2/3 and 1/3
    didnt = torch.tensor([0, 0, 2 / 3, 1 / 3, 0, 0])
    torch.testing.assert_close(full[2], didnt)
    for word in (1, 2):  # the syntactic words "did" and "n't" both read the row of their surface token
        torch.testing.assert_close(full[unit_word.index(sentence.surface[word])], didnt)
    torch.testing.assert_close(full[1], torch.tensor([0, 0, 1.0, 0, 0, 0]))  # I -> didn't
    torch.testing.assert_close(full.sum(-1), torch.ones(6))


def test_words_one_token_joins_become_one_unit():
    tok = bpe_tokenizer()
    # CoNLL-U words "(", "Laughter", ".", ")": byte-level BPE writes ".)" as one token
    text = Text("(Laughter.)", words=[(0, 1), (1, 9), (9, 10), (10, 11)])
    batch = batch_of(tok, [text])
    assert _tokens(tok, batch) == ["(", "Laughter", ".)"]
    words = batch_words(batch)
    assert words.group[0] == [0, 1, 2, 2] and words.merged(0) == 1 and words.status == [None]
    assert words.token_word[0].tolist() == [0, 1, 2]
    # "cannot" covers the CoNLL-U words "can" + "not" in both tokenizers
    for make in (bert_tokenizer, bpe_tokenizer):
        b = batch_of(make(), [Text("I cannot go", words=[(0, 1), (2, 5), (5, 8), (9, 11)])])
        assert batch_words(b).group[0] == [0, 1, 1, 3]


def test_align_row_rules_by_hand():
    # a token running from word 0 into word 1 ("abc" over "ab" + "cd") joins them
    words, group, status = align_row("abcd", [(0, 3), (3, 4)], [False, False], [0, 1], [(0, 2), (2, 4)])
    assert (words, group, status) == ([0, 0], [0, 0], None)
    # a chain of joins names every word by the first: "ab|cd|ef" with tokens "abc" and "def"
    words, group, status = align_row("abcdef", [(0, 3), (3, 6)], [False, False], [0, 1], [(0, 2), (2, 4), (4, 6)])
    assert group == [0, 0, 0] and words == [0, 0] and status is None
    # a word no token covers (a dropped character) makes the text unaligned
    _, _, status = align_row("a \u200b b", [(0, 1), (4, 5)], [False, False], [0, 2], [(0, 1), (2, 3), (4, 5)])
    assert status == "word without tokens"
    _, _, status = align_row("a b", [(0, 1)], [False], [0], [(0, 1), (2, 3)], truncated=True)
    assert status == "truncated"


def test_truncated_text_is_not_aligned():
    tok = bert_tokenizer()
    batch = batch_of(tok, [Text("one two three four five six"), Text("one two")], max_length=4)
    assert batch_words(batch).status == ["truncated", None]


def test_units_in_token_order():
    assert units([-1, 0, 1, 1, -1, 2, -1]) == ([0, 1, 2, 2, 3, 4, 5], [-1, 0, 1, -1, 2, -1])
