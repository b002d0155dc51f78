"""One side of a model's input tokenized: token ids with character offsets, special-token flags,
the word index of each token, segment ids of sentence pairs, truncation to a token limit.

Typed text stays text: a user's "[SEP]" or "<|endoftext|>" is tokenized as characters, like the
tokenizer's ``split_special_tokens``; only the special tokens the tokenizer adds itself are
special. ``parse_special_tokens=True`` keeps the old behaviour for users who mean it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..util import quiet_transformers
from .sequence import Text


@dataclass
class Tokenized:
    """One text after tokenization.

    Attributes:
        index: position of the text in the corpus.
        ids: token ids (special tokens included).
        offsets: per token, the ``(start, end)`` characters of ``text`` it covers ((0, 0) for
            special tokens the tokenizer added). Byte-level pieces of one character all cover
            that character.
        special: per token, whether the tokenizer added it ([CLS], [SEP], BOS ...).
        word_ids: per token, the index of the word (:meth:`probe.text.sequence.Text.word_spans`) holding its first
            non-space character, or -1 (special tokens, whitespace-only tokens).
        token_type_ids: segment ids, or None.
        truncated: the text was cut to the token limit.
        target: encoder-decoder models: the decoder's side (the target after the decoder's start
            token), with offsets into the target text; None otherwise.
    """

    index: int
    ids: list[int]
    offsets: list[tuple[int, int]]
    special: list[bool]
    word_ids: list[int]
    token_type_ids: list[int] | None
    truncated: bool
    target: Tokenized | None = None

    def __len__(self) -> int:
        return len(self.ids)


_NONSPACE = re.compile(r"\S+")  # re's \s is str.isspace's set (both Py_UNICODE_ISSPACE)


def _word_ids(text: str, offsets: list[tuple[int, int]], special: list[bool],
              spans: list[tuple[int, int]]) -> list[int]:
    """Index of the word holding each token's first non-space character (-1 if none), vectorized
    over the tokens: the first non-space character at or after a token's start is the start of the
    first run of non-space characters ending after it (or the start itself, inside a run)."""
    if not offsets:
        return []
    runs = np.array([m.span() for m in _NONSPACE.finditer(text)], dtype=np.int64).reshape(-1, 2)
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    s, e = off[:, 0], off[:, 1]
    k = np.searchsorted(runs[:, 1], s, side="right")  # first run ending after s
    inside = k < len(runs)
    first = np.where(inside, np.maximum(s, runs[np.minimum(k, len(runs) - 1), 0] if len(runs) else s), e)
    ok = ~np.asarray(special, dtype=bool) & (e > s) & inside & (first < e)
    words = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    w = np.searchsorted(words[:, 0], first, side="right") - 1
    ok &= w >= 0
    ok &= first < words[np.maximum(w, 0), 1] if len(words) else False
    return np.where(ok, w, -1).tolist()


def tokenize_side(lm, texts: Sequence[Text], limit: int, *, parse_special_tokens: bool = False,
                  start_index: int = 0, target: bool = False) -> list[Tokenized]:
    """:func:`probe.text.inputs.tokenize` for one side of the model: the encoder's (or a decoder-only
    model's) input, or with ``target`` an encoder-decoder model's target text (``text_target=``:
    some tokenizers, e.g. Marian's, use another vocabulary for targets), which may be empty (a
    generated target can be just the end-of-sequence token). ``limit`` >= 1 tokens."""
    tok = lm.tokenizer
    fast = bool(getattr(tok, "is_fast", False))
    own = {bool(getattr(t, "parse_special_tokens", False)) for t in texts}
    if len(own) > 1:
        raise InputError("the texts of one call either all read their typed special tokens "
                         "(Text(..., parse_special_tokens=True)) or none does")
    parse_special_tokens = parse_special_tokens or own == {True}
    kw = dict(add_special_tokens=True, return_special_tokens_mask=True,
              split_special_tokens=not parse_special_tokens, return_offsets_mapping=fast)
    firsts = [t.text for t in texts]
    pairs = [t.pair for t in texts]
    has_pairs = any(p is not None for p in pairs)
    if has_pairs and not all(p is not None for p in pairs):
        raise InputError("either every text has a pair or none does")
    args = (firsts, pairs) if has_pairs else (firsts,)
    def call(*a, **k):
        return tok(text_target=a[0], **k) if target else tok(*a, **k)

    with quiet_transformers(progress_bars=True):  # the over-length warning is moot: probe truncates and counts
        enc = call(*args, **kw)
        over = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > limit]
        cut = None
        if over:
            sub = [[firsts[i] for i in over]] + ([[pairs[i] for i in over]] if has_pairs else [])
            cut = call(*sub, truncation=True, max_length=limit, **kw)
    out = []
    where = {i: j for j, i in enumerate(over)}
    for i, text in enumerate(texts):
        src, row = (cut, where[i]) if i in where else (enc, i)
        ids = list(src["input_ids"][row])
        special = [bool(s) for s in src["special_tokens_mask"][row]]
        offsets = [tuple(o) for o in src["offset_mapping"][row]] if fast else [(0, 0)] * len(ids)
        if has_pairs:  # offsets of the second segment refer to the pair text: shift past text + 1
            # segment of each token: the fast tokenizer's sequence ids (tokenizers that join a pair without
            # a special token in between, such as byte-level BPE ones, give no other sign), else segment ids
            tt = src.get("token_type_ids")
            seg = [s or 0 for s in src.sequence_ids(row)] if fast else (list(tt[row]) if tt is not None else None)
            offsets = _pair_offsets(offsets, special, seg, len(text.text))
        index = text.index if text.index is not None else start_index + i
        if all(special) and not target:
            if i in where and not all(enc["special_tokens_mask"][i]):  # the cut, not the text, left no token
                raise InputError(too_short_limit(limit, len(ids), has_pairs))
            raise InputError(f"text {index + 1} has no tokens besides special tokens: {text.text[:40]!r}")
        full = text.text if not has_pairs else text.text + " " + text.pair
        tt = src.get("token_type_ids")
        out.append(Tokenized(
            index=index, ids=ids, offsets=offsets, special=special,
            word_ids=_word_ids(full, offsets, special, text.word_spans()) if fast else [-1] * len(ids),
            token_type_ids=list(tt[row]) if tt is not None else None, truncated=i in where,
        ))
    return out


def too_short_limit(limit: int, n_special: int, pair: bool = False) -> str:
    """The message for a token limit that the model's special tokens fill on their own."""
    what = "a sentence pair" if pair else "a sequence"
    return (f"max length {limit} is too small: the model adds {n_special} special tokens to {what}, which leaves "
            f"no token of the text; use a max length of {n_special + 1} or more (--max-length)")


def _pair_offsets(offsets, special, segments, n_first: int):
    """Offsets of a sentence pair as positions in ``first + " " + second``."""
    if segments is None:  # tokenizers without segment ids: the second run of non-special tokens
        seen_gap, segments = False, []
        started = False
        for sp in special:
            if not sp:
                started = True
            elif started:
                seen_gap = True
            segments.append(1 if seen_gap and not sp else 0)
    return [(s + n_first + 1, e + n_first + 1) if seg == 1 and not sp else (s, e)
            for (s, e), sp, seg in zip(offsets, special, segments)]
