"""Word-level attention from token-level attention probabilities (shared/METRICS.md "Word-level
attention"; Clark et al. 2019, "What Does BERT Look At?", sec. 4.1).

Attention *to* a word is the sum of the attention to its subword tokens; attention *from* a word is
the mean over its subword tokens (so every word-level row still sums to 1). Tokens that belong to
no word (special tokens such as [CLS]/[SEP]/BOS, and trailing whitespace) keep a column of their
own, one per token, so the rows sum to 1 over words plus those columns.

Which word a token belongs to comes from the batch (:attr:`probe.inputs.Batch.word_ids`: the word
holding the token's first non-space character, from the tokenizer's character offsets), with one
rule added here:

- A whitespace-only token belongs to the word that follows it. Byte-level BPE writes a word's
  leading space into its first piece ("Ġworld"); when the space is split off as a piece of its own
  ("Ġ" before the bytes of "été", or the second space of a double space), it is still the start of
  that word. Whitespace with no word after it (a trailing newline, or whitespace before a special
  token) keeps a no-word column like a special token.

A text is *aligned* when every word has at least one token, no token runs past the end of its word
into the next one (a BPE piece "cannot" covering the two CoNLL-U words "can" + "not"), and the
text was not truncated. Analyses score aligned texts only and count the others by reason
(:data:`REASONS`); nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..inputs import Batch

#: Why a text is not aligned (the status values of :class:`BatchWords`).
REASONS = {
    "truncated": "the text was cut to the model's token limit, so its last words have no tokens",
    "word without tokens": "a word has no token of its own (one token covers it and its neighbour, "
                           "e.g. 'cannot' for the words 'can' + 'not')",
    "token across words": "a token starts in one word and ends in the next",
}


@dataclass
class BatchWords:
    """Which word each token of a batch belongs to, and whether each text is aligned.

    Attributes:
        token_word: [batch, T] long, word index of each token (whitespace-only tokens attached to the
            next word), -1 for special, padding and other no-word tokens.
        n_words: per row, the number of words of its text (:meth:`probe.inputs.Text.word_spans`).
        status: per row, None when aligned, else a key of :data:`REASONS`.
    """

    token_word: torch.Tensor
    n_words: list[int]
    status: list[str | None]


def align_row(text: str, offsets: list[tuple[int, int]], special: list[bool], word_ids: list[int],
              spans: list[tuple[int, int]], truncated: bool = False) -> tuple[list[int], str | None]:
    """Word of each real token of one text, and its alignment status.

    Args:
        text: the characters the offsets refer to.
        offsets: per real token, the ``(start, end)`` characters it covers.
        special: per real token, whether the tokenizer added it.
        word_ids: per real token, the batch's word index (-1: none).
        spans: the words' character spans.
        truncated: the text was cut to the token limit.

    Returns:
        (token words with whitespace-only tokens attached to the next word, None or a reason of
        :data:`REASONS`).
    """
    words = list(word_ids)
    following = -1
    for t in range(len(words) - 1, -1, -1):
        s, e = offsets[t]
        if special[t]:
            following = -1
        elif words[t] >= 0:
            following = words[t]
        elif e > s and not text[s:e].strip():
            words[t] = following
        else:
            following = -1
    if truncated:
        return words, "truncated"
    seen = set(words)
    if any(w not in seen for w in range(len(spans))):
        return words, "word without tokens"
    for t, w in enumerate(word_ids):
        if w < 0:
            continue
        s, e = offsets[t]
        last = max((i for i in range(s, e) if not text[i].isspace()), default=s)
        if last >= spans[w][1]:
            return words, "token across words"
    return words, None


def batch_words(batch: Batch) -> BatchWords:
    """The :class:`BatchWords` of a batch (computed once per batch and cached on it)."""

    def build() -> BatchWords:
        B, T = batch.word_ids.shape
        token_word = torch.full((B, T), -1, dtype=torch.long)
        n_words, status = [], []
        lengths = batch.lengths.tolist()
        for row, text in enumerate(batch.texts):
            n = lengths[row]
            full = text.text if text.pair is None else text.text + " " + text.pair
            spans = text.word_spans()
            words, why = align_row(full, [tuple(o) for o in batch.offsets[row, :n].tolist()],
                                   batch.special[row, :n].tolist(), batch.word_ids[row, :n].tolist(),
                                   spans, batch.truncated[row])
            token_word[row, :n] = torch.tensor(words, dtype=torch.long)
            n_words.append(len(spans))
            status.append(why)
        return BatchWords(token_word, n_words, status)

    return batch.cached("linguistic.words", build)


def pooling(token_word: torch.Tensor, n_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The matrices that turn token-level attention into word-level attention.

    Args:
        token_word: [..., T] long, word of each token (-1: no word).
        n_words: words (columns) wanted; tokens of words >= n_words are ignored.

    Returns:
        ``to`` [..., T, n_words]: 1 where token t belongs to word w (attention to a word = sum over
        its tokens), and ``frm`` [..., n_words, T]: 1 / (tokens of w) where token t belongs to word w
        (attention from a word = mean over its tokens); a word without tokens has a zero row.
    """
    ids = torch.arange(n_words, device=token_word.device)
    to = (token_word[..., :, None] == ids).float()
    counts = to.sum(-2)  # [..., n_words]
    frm = to.transpose(-1, -2) / counts.clamp(min=1)[..., :, None]
    return to, frm


def word_matrix(probs: torch.Tensor, token_word: torch.Tensor, n_words: int,
                pooled: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Word-to-word attention: [batch, heads, words, words] from probs [batch, heads, query, key].

    Row w, column v = mean over w's tokens q of the sum over v's tokens k of probs[q, k]. The columns
    of no-word tokens are left out here, so a row sums to 1 minus its attention to special tokens
    (:func:`word_attention` keeps them).

    Args:
        probs: [batch, heads, T, T] attention probabilities.
        token_word: [batch, T] word of each token (:class:`BatchWords`).
        n_words: words per row (the batch's largest; rows with fewer have zero rows/columns).
        pooled: ``pooling(token_word, n_words)`` when the caller already has it (once per batch,
            not once per site).
    """
    to, frm = pooled if pooled is not None else pooling(token_word, n_words)
    a = probs.float()
    return frm.to(a.device)[:, None] @ a @ to.to(a.device)[:, None]


def units(token_word: list[int]) -> tuple[list[int], list[int]]:
    """The units of a word-level matrix: words, plus one unit per no-word token, in token order.

    Args:
        token_word: word of each real token (-1: no word).

    Returns:
        (unit of each token, word of each unit with -1 for a no-word token's unit).
    """
    of_word: dict[int, int] = {}
    token_unit, unit_word = [], []
    for w in token_word:
        if w >= 0 and w in of_word:
            token_unit.append(of_word[w])
            continue
        token_unit.append(len(unit_word))
        unit_word.append(w)
        if w >= 0:
            of_word[w] = len(unit_word) - 1
    return token_unit, unit_word


def word_attention(probs: torch.Tensor, token_word: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The full word-level attention of one sequence, rows summing to 1.

    Args:
        probs: [heads, T, T] (or [T, T]) attention probabilities of one sequence's real tokens.
        token_word: [T] word of each token (-1: special or other no-word token), as
            :func:`align_row` returns.

    Returns:
        ([heads, U, U] word-level attention over the units of :func:`units` (words and no-word
        tokens, in token order): row u = mean over u's tokens, column v = sum over v's tokens;
        the word of each unit, -1 for no-word units).
    """
    token_unit, unit_word = units(token_word)
    to, frm = pooling(torch.tensor(token_unit, dtype=torch.long, device=probs.device), len(unit_word))
    return frm @ probs.float() @ to, unit_word
