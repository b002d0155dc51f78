"""Word-level attention from token-level attention probabilities (docs/statistics.md, "Word-level
attention"; Clark et al. 2019, "What Does BERT Look At?", sec. 4.1).

Attention *to* a word is the sum of the attention to its subword tokens; attention *from* a word is
the mean over its subword tokens (so every word-level row still sums to 1). Tokens that belong to
no word (special tokens such as [CLS]/[SEP]/BOS, and trailing whitespace) keep a column of their
own, one per token, so the rows sum to 1 over words plus those columns.

Which word a token belongs to comes from the batch (:attr:`probe.text.inputs.Batch.word_ids`: the word
holding the token's first non-space character, from the tokenizer's character offsets), with two
rules added here:

- Words joined by a token form one unit. When a token covers characters of several words (byte-level
  BPE's ".)" for the CoNLL-U words "." and ")", WordPiece's "bikes" + "##hop" for "bike" + "shop",
  "cannot" for "can" + "not"), attention cannot be split between them, so those words share one
  word-level row and column, exactly like the two syntactic words of a multiword token ("didn't" =
  did + n't). The unit is named by its first word; the other words of a unit have no row or column
  of their own (:attr:`BatchWords.group` says which unit each word is in). Analyses count what
  falls inside one unit instead of dropping the whole text.
- A whitespace-only token belongs to the word that follows it. Byte-level BPE writes a word's
  leading space into its first piece ("Ġworld"); when the space is split off as a piece of its own
  ("Ġ" before the bytes of "été", or the second space of a double space), it is still the start of
  that word. Whitespace with no word after it (a trailing newline, or whitespace before a special
  token) keeps a no-word column like a special token.

A text is *aligned* unless it was truncated (its last words lost their tokens) or a word has no
token at all (a tokenizer that drops characters, such as a zero-width space, can leave a word
empty). Analyses score aligned texts only and count the others by reason (:data:`REASONS`);
nothing is dropped silently.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from ..text.inputs import Batch

#: Why a text is not aligned (the status values of :class:`BatchWords`).
REASONS = {
    "truncated": "the text was cut to the model's token limit, so its last words have no tokens",
    "word without tokens": "a word has no token (the tokenizer dropped its characters)",
}


@dataclass
class BatchWords:
    """Which word unit each token of a batch belongs to, and whether each text is aligned.

    Attributes:
        token_word: [batch, T] long, the unit of each token, named by the unit's first word index
            (whitespace-only tokens attached to the next word); -1 for special, padding and other
            no-word tokens.
        n_words: per row, the number of words of its text (:meth:`probe.text.inputs.Text.word_spans`).
        group: per row, the unit of each word (its first word's index; ``group[w] == w`` for a
            word that names its unit).
        status: per row, None when aligned, else a key of :data:`REASONS`.
    """

    token_word: torch.Tensor
    n_words: list[int]
    group: list[list[int]]
    status: list[str | None]

    def merged(self, row: int) -> int:
        """Words of ``row`` that share a unit with an earlier word."""
        return sum(g != w for w, g in enumerate(self.group[row]))


def _groups(text: str, offsets, special, word_ids, spans) -> list[int]:
    """Unit of each word: words that one token covers are joined (contiguous runs)."""
    starts = [s for s, _ in spans]
    group = list(range(len(spans)))
    for (s, e), sp, w in zip(offsets, special, word_ids):
        if sp or w < 0:
            continue
        last = max((i for i in range(s, e) if not text[i].isspace()), default=s)
        end = bisect.bisect_right(starts, last) - 1
        for v in range(w + 1, end + 1):
            group[v] = group[w]
    for v in range(1, len(group)):  # a chain of joins names every word by the run's first word
        if group[v] != v:
            group[v] = group[group[v]]
    return group


def align_row(text: str, offsets: list[tuple[int, int]], special: list[bool], word_ids: list[int],
              spans: list[tuple[int, int]], truncated: bool = False) -> tuple[list[int], list[int], str | None]:
    """Word unit of each real token of one text, the unit of each word, and the text's status.

    Args:
        text: the characters the offsets refer to.
        offsets: per real token, the ``(start, end)`` characters it covers.
        special: per real token, whether the tokenizer added it.
        word_ids: per real token, the batch's word index (the word of its first non-space
            character; -1: none).
        spans: the words' character spans.
        truncated: the text was cut to the token limit.

    Returns:
        (unit of each token, -1 for none, whitespace-only tokens attached to the next word; unit of
        each word; None or a reason of :data:`REASONS`).
    """
    group = _groups(text, offsets, special, word_ids, spans)
    words = [group[w] if w >= 0 else -1 for w in word_ids]
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
        return words, group, "truncated"
    seen = set(words)
    if any(g not in seen for g in group):
        return words, group, "word without tokens"
    return words, group, None


def batch_words(batch: Batch) -> BatchWords:
    """The :class:`BatchWords` of a batch (computed once per batch and cached on it)."""

    def build() -> BatchWords:
        B, T = batch.word_ids.shape
        token_word = torch.full((B, T), -1, dtype=torch.long)
        n_words, groups, status = [], [], []
        lengths = batch.lengths.tolist()
        for row, text in enumerate(batch.texts):
            n = lengths[row]
            full = text.text if text.pair is None else text.text + " " + text.pair
            spans = text.word_spans()
            words, group, why = align_row(full, [tuple(o) for o in batch.offsets[row, :n].tolist()],
                                          batch.special[row, :n].tolist(), batch.word_ids[row, :n].tolist(),
                                          spans, batch.truncated[row])
            token_word[row, :n] = torch.tensor(words, dtype=torch.long)
            n_words.append(len(spans))
            groups.append(group)
            status.append(why)
        return BatchWords(token_word, n_words, groups, status)

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
        token_word: [batch, T] word unit of each token (:class:`BatchWords`).
        n_words: words per row (the batch's largest; rows with fewer words, and words that do not
            name their unit, have zero rows and columns).
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
        token_word: [T] word unit of each token (-1: special or other no-word token), as
            :func:`align_row` returns.

    Returns:
        ([heads, U, U] word-level attention over the units of :func:`units` (words and no-word
        tokens, in token order): row u = mean over u's tokens, column v = sum over v's tokens;
        the word of each unit, -1 for no-word units).
    """
    token_unit, unit_word = units(token_word)
    to, frm = pooling(torch.tensor(token_unit, dtype=torch.long, device=probs.device), len(unit_word))
    return frm @ probs.float() @ to, unit_word
