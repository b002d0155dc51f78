"""From text to batches: offsets, word ids, punctuation by covered characters (byte-level pieces of an
emoji or CJK punctuation count as punctuation), special tokens a user types (text "[SEP]" stays text),
readable display labels of byte-level pieces, right padding."""

from __future__ import annotations

import unicodedata

import pytest
import torch

from conftest import bert_tokenizer, bpe_tokenizer, tiny_model
from probe.capture.maps import capture_attention, encode
from probe.runs.analysis import analyze
from probe.text.inputs import Text, as_texts, iter_batches, tokenize
from probe.text.tokens import display_tokens, is_punctuation_text, punctuation_mask

EMOJI_CJK = "I love \U0001F4A9 \u300cyes\u300d \u00bfqu\u00e9?"


@pytest.mark.parametrize("text,expected", [
    (".", True), (",", True), ("...", True), ('"', True), ("\u2013", True), ("(", True), ("\u00ab", True),
    ("@", True), ("#", True), ("##", True), (" ;", True), ("\u300c", True), ("\u00bf", True), (" \u00bf", True),
    ("a.", False), ("", False), ("   ", False), ("$", False),  # $ is Sc, a symbol
    ("+", False), ("5", False), ("the", False), ("\U0001F4A9", False),
])
def test_is_punctuation_text(text, expected):
    assert is_punctuation_text(text) is expected
    s = "".join(ch for ch in text if not ch.isspace())
    assert expected == (bool(s) and all(unicodedata.category(ch).startswith("P") for ch in s))


class _Lm:
    """Just what tokenize/collate need."""

    def __init__(self, tokenizer, max_length=512):
        self.tokenizer, self.max_length = tokenizer, max_length


def test_offsets_special_flags_and_word_ids_wordpiece():
    lm = _Lm(bert_tokenizer())
    text = "Antidisestablishment, isn't it?"
    [t] = tokenize(lm, as_texts([text]))
    toks = lm.tokenizer.convert_ids_to_tokens(t.ids)
    assert toks == ["[CLS]", "anti", "##dis", "##est", "##ab", "##lish", "##ment", ",", "isn", "'", "t", "it", "?",
                    "[SEP]"]
    assert t.special == [True] + [False] * 12 + [True]
    covered = [text[s:e] for s, e in t.offsets]
    assert covered[0] == covered[-1] == ""
    assert "".join(covered[1:7]) == "Antidisestablishment"
    assert covered[7:] == [",", "isn", "'", "t", "it", "?", ""]
    # words are the whitespace-separated runs: "Antidisestablishment," "isn't" "it?"
    assert t.word_ids == [-1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, -1]
    assert [text[s:e] for s, e in Text(text).word_spans()] == ["Antidisestablishment,", "isn't", "it?"]


def test_word_ids_follow_given_word_spans():
    lm = _Lm(bpe_tokenizer())
    text = "I don't know."
    words = [(0, 1), (2, 4), (4, 7), (8, 12), (12, 13)]  # CoNLL-U style: I do n't know .
    [t] = tokenize(lm, [Text(text, words=words)])
    for (s, e), w in zip(t.offsets, t.word_ids):
        first = next(i for i in range(s, e) if not text[i].isspace())
        assert words[w][0] <= first < words[w][1]
    assert sorted(set(t.word_ids)) == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_byte_level_pieces_count_as_punctuation_and_read_well(smollm2):
    """「 」 ¿ ? count in punct (by the characters a token covers); every display label is
    readable (no replacement character) and the pieces of one character are distinct."""
    batch = encode(smollm2, [EMOJI_CJK])
    n = int(batch.lengths[0])
    toks = smollm2.tokenizer.convert_ids_to_tokens(batch.input_ids[0, :n])
    covered = [batch.covered_text(0, i) for i in range(n)]
    punct = punctuation_mask(batch, smollm2.tokenizer)[0, :n].tolist()
    by_char = {}
    for c, p in zip(covered, punct):
        by_char.setdefault(c.strip(), set()).add(p)
    for ch in ("\u300c", "\u300d", "\u00bf", "?"):
        assert by_char[ch] == {True}, (ch, by_char.get(ch))
    assert by_char["\U0001F4A9"] == {False} and by_char["yes"] == {False}
    assert sum(1 for c in covered if c.strip() == "\u300c") == 2  # 「 is two byte-level pieces
    labels = display_tokens(smollm2.tokenizer, EMOJI_CJK, batch.input_ids[0, :n].tolist(),
                            [tuple(o) for o in batch.offsets[0, :n].tolist()], batch.special[0, :n].tolist())
    assert len(labels) == len(toks)
    assert all("\ufffd" not in lab and lab for lab in labels)
    poo = [lab for lab in labels if lab.startswith("\U0001F4A9")]
    assert poo == ["\U0001F4A9 (1/3)", "\U0001F4A9 (2/3)", "\U0001F4A9 (3/3)"]
    assert [lab for lab in labels if lab.startswith("\u300c")] == ["\u300c (1/2)", "\u300c (2/2)"]
    assert [lab for lab in labels if lab.startswith("\u00bf")] == ["\u00bf (1/2)", "\u00bf (2/2)"]
    assert "yes" in labels and "?" in labels
    # the old rule (decode each token alone) saw replacement characters, not punctuation
    lone = [smollm2.tokenizer.convert_tokens_to_string([t]) for t in toks]
    assert sum("\ufffd" in x for x in lone) >= 7


@pytest.mark.slow
def test_punct_statistic_counts_the_pieces(smollm2):
    """The analysis's punct equals the attention to the pieces of 「 」 ¿ ? (hand-selected positions)."""
    res = analyze(smollm2, [EMOJI_CJK], n_examples=1, example_tokens=None)
    ex = res.examples[0]
    positions = [i for i, (s, e) in enumerate(ex.offsets)
                 if EMOJI_CJK[s:e].strip() in ("\u300c", "\u300d", "\u00bf", "?")]
    assert len(positions) == 7
    expected = ex.probs[:, :, :, positions].sum(-1).mean(-1)  # [sites, heads]: mean over all rows
    got = res.heads["punct"].to_numpy().reshape(expected.shape)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)


def test_typed_special_tokens_stay_text_wordpiece():
    """A special token spelt in the text stays text (minilm's tokenizer): 'Is this [SEP] a separator?'
    has one [SEP], the tokenizer's own."""
    lm = tiny_model("bert")
    text = "Is this [SEP] a separator?"
    batch = encode(lm, [text])
    toks = lm.tokenizer.convert_ids_to_tokens(batch.input_ids[0])
    assert toks.count("[SEP]") == 1 and toks[-1] == "[SEP]"
    assert toks[3:6] == ["[", "sep", "]"]
    parsed = encode(lm, [text], parse_special_tokens=True)
    assert lm.tokenizer.convert_ids_to_tokens(parsed.input_ids[0]).count("[SEP]") == 2
    # the sep statistic counts only the tokenizer's own [SEP] by default
    default = analyze(lm, [text], n_examples=1, example_tokens=None)
    old = analyze(lm, [text], n_examples=1, example_tokens=None, parse_special_tokens=True)
    sep_pos = [len(toks) - 1]
    probs = default.examples[0].probs
    expected = probs[:, :, :, sep_pos].sum(-1).mean(-1).ravel()
    torch.testing.assert_close(torch.tensor(default.heads["sep"].to_numpy()),
                               torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)
    old_probs = old.examples[0].probs
    old_toks = lm.tokenizer.convert_ids_to_tokens(parsed.input_ids[0])
    old_sep = [i for i, t in enumerate(old_toks) if t == "[SEP]"]
    expected_old = old_probs[:, :, :, old_sep].sum(-1).mean(-1).ravel()
    torch.testing.assert_close(torch.tensor(old.heads["sep"].to_numpy()),
                               torch.tensor(expected_old, dtype=torch.float64), atol=1e-6, rtol=0)
    assert old.settings["parse_special_tokens"] and not default.settings["parse_special_tokens"]


@pytest.mark.slow
def test_typed_bos_eos_spelling_stays_text_smollm2(smollm2):
    text = "Say <|endoftext|> and <|im_start|> to me."
    ids = encode(smollm2, [text]).input_ids[0].tolist()
    specials = set(smollm2.tokenizer.all_special_ids)
    assert not specials & set(ids)
    parsed = encode(smollm2, [text], parse_special_tokens=True).input_ids[0].tolist()
    assert smollm2.tokenizer.convert_tokens_to_ids("<|endoftext|>") in parsed
    assert smollm2.tokenizer.convert_tokens_to_ids("<|im_start|>") in parsed


def test_hash_marks_are_punctuation_by_covered_characters():
    """'##' typed in a text covers two '#' characters: punctuation, for WordPiece and BPE alike."""
    for kind in ("bert", "gpt2"):
        lm = tiny_model(kind)
        batch = encode(lm, ["Tag ## here and ### there"])
        n = int(batch.lengths[0])
        punct = punctuation_mask(batch, lm.tokenizer)[0, :n]
        covered = [batch.covered_text(0, i).strip() for i in range(n)]
        for c, p in zip(covered, punct.tolist()):
            assert p == (bool(c) and set(c) == {"#"}), (kind, c, p)
        assert punct.any()


def test_batches_sort_by_length_and_right_pad():
    lm = _Lm(bert_tokenizer(), max_length=8)
    texts = as_texts(["one two three four five six seven eight nine", "one", "one two", "a b c"])
    batches = list(iter_batches(lm, texts, batch_size=2))
    assert [b.index for b in batches] == [[1, 2], [3, 0]]
    for b in batches:
        real = b.real
        assert bool((real[:, 1:] <= real[:, :-1]).all())  # real tokens first
        assert b.input_ids.shape[1] == int(b.lengths.max())
    assert batches[1].truncated == [False, True] and int(batches[1].lengths[1]) == 8
    chunked = list(iter_batches(lm, texts, batch_size=2, chunk=2))  # sorted within chunks of 2
    assert [b.index for b in chunked] == [[1, 0], [2, 3]]


def test_pairs_have_segments_and_offsets_into_the_joined_text():
    lm = _Lm(bert_tokenizer())
    t = Text("Where is it?", pair="Here.")
    [tok] = tokenize(lm, [t])
    assert tok.token_type_ids.count(1) == 3  # here . [SEP]
    joined = "Where is it? Here."
    covered = [joined[s:e] for s, e in tok.offsets]
    assert covered[-3:-1] == ["Here", "."]


def test_capture_gives_probs_per_site():
    lm = tiny_model("gpt2")
    cap = capture_attention(lm, ["A b c d.", "E."])
    assert [s.name for s in cap.sites] == ["decoder.0.self", "decoder.1.self"]
    assert cap[0] is cap.probs[0] and cap["decoder.1.self"] is cap.probs[1] and cap[cap.sites[1]] is cap.probs[1]
    with pytest.raises(KeyError, match="decoder.0.self"):
        cap["encoder.0.self"]
