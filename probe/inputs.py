"""From text to batches: tokenization with character offsets, word alignment, padding.

Data flow: texts (:class:`Text`, or plain strings) -> :func:`tokenize` (one :class:`Tokenized` per
text: token ids, character offsets, special-token flags, word index of each token, truncation)
-> :func:`iter_batches` (length-sorted, right-padded :class:`Batch` objects) -> the model.

Typed text stays text: a user's "[SEP]" or "<|endoftext|>" is tokenized
as characters, like the tokenizer's ``split_special_tokens``; only the special tokens the
tokenizer adds itself are special. ``parse_special_tokens=True`` keeps the old behaviour for users
who mean it.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from . import validate
from .errors import InputError
from .util import quiet_transformers


@dataclass
class Text:
    """One input sequence.

    Attributes:
        text: the characters given to the tokenizer.
        words: character spans ``(start, end)`` of its words, in order; None = split on whitespace.
            Analyses that bring their own words (CoNLL-U tokens, GAP mentions) pass them here.
        meta: anything an analysis needs about this text (gold heads, mentions ...); probe's loop
            passes it through untouched.
        pair: an optional second segment of the same input (sentence pairs: BERT's
            ``[CLS] text [SEP] pair [SEP]`` with segment ids 0 and 1). Encoder-decoder models read
            no second segment; for them ``pair`` is taken as the ``target`` (deprecated: a
            ``DeprecationWarning``; give ``target=``).
        index: its position in the whole corpus, where a reader or a data-parallel shard knows it
            (None: counted from the first text given to :func:`tokenize` / :func:`iter_batches`).
        target: encoder-decoder models: the text the decoder reads (``text`` is the source the
            encoder reads); None for encoders and decoder-only models, which refuse one.
    """

    text: str
    words: list[tuple[int, int]] | None = None
    meta: dict = field(default_factory=dict)
    pair: str | None = None
    index: int | None = None
    target: str | None = None

    def word_spans(self) -> list[tuple[int, int]]:
        """Character spans of the words: the given ones, or the whitespace-separated runs of ``text``."""
        if self.words is not None:
            return list(self.words)
        spans, start = [], None
        for i, ch in enumerate(self.text):
            if ch.isspace():
                if start is not None:
                    spans.append((start, i))
                    start = None
            elif start is None:
                start = i
        if start is not None:
            spans.append((start, len(self.text)))
        return spans


def target_text(text: Text) -> str | None:
    """An encoder-decoder model's target of ``text``: ``text.target``, else the deprecated
    ``text.pair`` (:func:`probe.seq2seq.tokenize_pairs` warns about it), else None."""
    return text.target if text.target is not None else text.pair


def as_texts(texts: Iterable[str | Text] | str | Text) -> list[Text]:
    """Wrap strings as :class:`Text` (one string is one text)."""
    if isinstance(texts, (str, Text)):
        texts = [texts]
    return [t if isinstance(t, Text) else Text(t) for t in texts]


def stream_texts(texts: Iterable[str | Text]) -> Iterator[Text]:
    """Wrap strings as :class:`Text` lazily (for corpora read as they are analysed), checking each.

    Raises (while iterating):
        InputError: an empty or whitespace-only text (numbered from 1).
    """
    for i, t in enumerate(texts):
        t = t if isinstance(t, Text) else Text(t)
        if not isinstance(t.text, str) or not t.text.strip():
            raise InputError(f"text {(t.index if t.index is not None else i) + 1} is empty")
        yield t


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
        word_ids: per token, the index of the word (:meth:`Text.word_spans`) holding its first
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


def _word_ids(text: str, offsets: list[tuple[int, int]], special: list[bool],
              spans: list[tuple[int, int]]) -> list[int]:
    """Index of the word holding each token's first non-space character (-1 if none)."""
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


def tokenize(lm, texts: Sequence[Text], max_length: int | None = None, *,
             parse_special_tokens: bool = False, start_index: int = 0) -> list[Tokenized]:
    """Tokenize texts (no padding), truncating each to ``max_length`` tokens.

    Args:
        lm: a :class:`~probe.models.LoadedModel`.
        texts: the sequences (special tokens are added as the tokenizer does by default).
        max_length: token limit, >= 2 (default and upper bound: the model's limit ``lm.max_length``).
        parse_special_tokens: let typed special-token strings become special tokens (default:
            they are text).
        start_index: corpus index of ``texts[0]``.

    Returns:
        One :class:`Tokenized` per text.

    Raises:
        InputError: no texts, max_length below 2, a text with no token besides the special
            tokens (an unknown-word token counts as a token), or a text with a ``target`` given to a
            model without a decoder reading one (encoders, decoder-only models).
    """
    if not texts:
        raise InputError("no text given")
    if getattr(lm, "kind", None) == "encoder-decoder":  # (stand-ins without a kind read one side)
        return tokenize_pairs(lm, texts, max_length, parse_special_tokens=parse_special_tokens,
                              start_index=start_index)
    with_target = next((i for i, t in enumerate(texts) if t.target is not None), None)
    if with_target is not None:
        t = texts[with_target]
        where = t.index if t.index is not None else start_index + with_target
        raise InputError(f"text {where + 1} has a target, which only encoder-decoder models read "
                         "(a second segment of the same input is Text(..., pair=...))")
    limit = validate.max_length(max_length, lm.max_length)
    return tokenize_side(lm, texts, limit, parse_special_tokens=parse_special_tokens, start_index=start_index)


def tokenize_side(lm, texts: Sequence[Text], limit: int, *, parse_special_tokens: bool = False,
                  start_index: int = 0, target: bool = False) -> list[Tokenized]:
    """:func:`tokenize` for one side of the model: the encoder's (or a decoder-only model's) input,
    or with ``target`` an encoder-decoder model's target text (``text_target=``: some tokenizers,
    e.g. Marian's, use another vocabulary for targets), which may be empty (a generated target can
    be just the end-of-sequence token). ``limit`` >= 1 tokens."""
    tok = lm.tokenizer
    fast = bool(getattr(tok, "is_fast", False))
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


def decoder_start_id(lm) -> int:
    """The token the decoder starts from: ``config.decoder_start_token_id`` (T5: the pad token).

    Raises:
        InputError: the model names no decoder start token and no pad token.
    """
    config = lm.model.config
    for value in (getattr(config, "decoder_start_token_id", None),
                  getattr(getattr(lm.model, "generation_config", None), "decoder_start_token_id", None),
                  getattr(config, "pad_token_id", None)):
        if value is not None:
            return int(value)
    raise InputError("the model's config names no decoder_start_token_id (and no pad token to start from)")


def tokenize_pairs(lm, texts: Sequence[Text], max_length: int | None = None, *,
                   parse_special_tokens: bool = False, start_index: int = 0) -> list[Tokenized]:
    """Tokenize (source, target) pairs for an encoder-decoder model.

    The source is ``text.text``; the target is ``text.target``, tokenized as a target and put
    after the decoder's start token (:func:`decoder_start_id`). Each side is cut to ``max_length``
    tokens (the target's start token included); a cut on either side marks the pair truncated.
    A text that gives its target as ``pair=`` (BERT's second segment, which these models do not
    read) still works, with a ``DeprecationWarning``.

    Returns:
        One :class:`Tokenized` per pair (the source) with ``target`` set (offsets into the target
        text; the start token is special and covers no character).

    Raises:
        InputError: a text without a target (encoder-decoder models need one: ``Text(source,
            target=...)``, ``--pairs FILE`` or ``--generate N``), a text with both ``pair`` and
            ``target``, max_length below 2, or a source with no token besides special ones.
    """
    for i, t in enumerate(texts):
        where = (t.index if t.index is not None else start_index + i) + 1
        if target_text(t) is None:
            raise InputError(f"text {where} has no target: an encoder-decoder model reads a source and a "
                             "target (give --pairs FILE with source<TAB>target lines, or --generate N)")
        if t.pair is not None and t.target is not None:
            raise InputError(f"text {where} has both a second segment (pair) and a target; an encoder-decoder "
                             "model reads a source and a target")
    if any(t.target is None for t in texts):
        warnings.warn("Text(source, pair=target) for an encoder-decoder model is deprecated: give "
                      "Text(source, target=...); pair= names a second segment of one input (BERT)",
                      DeprecationWarning, stacklevel=3)
    limit = validate.max_length(max_length, lm.max_length)
    sources = [Text(t.text, t.words, t.meta, None, t.index) for t in texts]
    targets = [Text(target_text(t), None, {}, None, t.index) for t in texts]
    src = tokenize_side(lm, sources, limit, parse_special_tokens=parse_special_tokens, start_index=start_index)
    tgt = tokenize_side(lm, targets, limit - 1, parse_special_tokens=parse_special_tokens,
                        start_index=start_index, target=True)
    start = decoder_start_id(lm)
    for s, t in zip(src, tgt):
        s.target = Tokenized(index=s.index, ids=[start, *t.ids], offsets=[(0, 0), *t.offsets],
                             special=[True, *t.special], word_ids=[-1, *t.word_ids], token_type_ids=None,
                             truncated=t.truncated)
        s.truncated = s.truncated or t.truncated
    return src


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


@dataclass
class Batch:
    """A right-padded batch and everything analyses need about its tokens.

    Attributes:
        input_ids: [batch, T] token ids (padding after the real tokens).
        attention_mask: [batch, T] 1 for real tokens.
        token_type_ids: [batch, T] segment ids, or None.
        offsets: [batch, T, 2] characters each token covers in its text ((0, 0) for special and
            padding tokens).
        special: [batch, T] bool, tokens the tokenizer added ([CLS], [SEP], BOS ...).
        word_ids: [batch, T] word index of each token (-1: special, padding, whitespace).
        texts: the :class:`Text` of each row.
        index: corpus position of each row.
        truncated: per row, whether the text was cut to the token limit.
        target: encoder-decoder models: the decoder's side as a batch of its own (the target
            tokens after the decoder's start token, right-padded); this batch is the source.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    offsets: torch.Tensor
    special: torch.Tensor
    word_ids: torch.Tensor
    texts: list[Text]
    index: list[int]
    truncated: list[bool]
    _cache: dict = field(default_factory=dict, repr=False)
    target: Batch | None = None

    @property
    def real(self) -> torch.Tensor:
        """[batch, T] bool, True for real (non-padding) tokens; a prefix of each row."""
        return self.attention_mask.bool()

    @property
    def lengths(self) -> torch.Tensor:
        """[batch] number of real tokens per row (tokens)."""
        return self.attention_mask.sum(1)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def model_inputs(self) -> dict:
        """Keyword arguments for the model's forward: input_ids, attention_mask (, token_type_ids)."""
        kw = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            kw["token_type_ids"] = self.token_type_ids
        if self.target is not None:
            kw["decoder_input_ids"] = self.target.input_ids
            kw["decoder_attention_mask"] = self.target.attention_mask
        return kw

    def covered_text(self, row: int, position: int) -> str:
        """The characters token ``position`` of ``row`` covers (empty for special/padding tokens)."""
        s, e = self.offsets[row, position].tolist()
        t = self.texts[row]
        full = t.text if t.pair is None else t.text + " " + t.pair
        return full[s:e]

    def cached(self, key, build):
        """A per-batch value computed once and shared by every layer and accumulator."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def to(self, device) -> Batch:
        """The model inputs moved to ``device`` (other fields stay on the CPU)."""
        self.input_ids = self.input_ids.to(device)
        self.attention_mask = self.attention_mask.to(device)
        if self.token_type_ids is not None:
            self.token_type_ids = self.token_type_ids.to(device)
        if self.target is not None:
            self.target.to(device)
        return self


def collate(lm, items: Sequence[Tokenized], texts: Sequence[Text]) -> Batch:
    """Right-pad tokenized texts into one :class:`Batch` (whatever the tokenizer's padding side:
    the statistics need real tokens first)."""
    B, T = len(items), max(len(t) for t in items)
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    offsets = torch.zeros(B, T, 2, dtype=torch.long)
    special = torch.zeros(B, T, dtype=torch.bool)
    word_ids = torch.full((B, T), -1, dtype=torch.long)
    has_tt = items[0].token_type_ids is not None
    tt = torch.zeros(B, T, dtype=torch.long) if has_tt else None
    for r, t in enumerate(items):
        n = len(t)
        ids[r, :n] = torch.tensor(t.ids)
        mask[r, :n] = 1
        offsets[r, :n] = torch.tensor(t.offsets, dtype=torch.long).reshape(n, 2)
        special[r, :n] = torch.tensor(t.special)
        word_ids[r, :n] = torch.tensor(t.word_ids)
        if has_tt:
            tt[r, :n] = torch.tensor(t.token_type_ids)
    target = None
    if items[0].target is not None:  # encoder-decoder: sources here, targets in a batch of their own
        target = collate(lm, [t.target for t in items],
                         [Text(target_text(t), meta=t.meta, index=t.index) for t in texts])
        texts = [Text(t.text, t.words, t.meta, None, t.index) for t in texts]
    return Batch(ids, mask, tt, offsets, special, word_ids, list(texts), [t.index for t in items],
                 [t.truncated for t in items], target=target)


#: Texts tokenized together and sorted by length into batches (bounds memory on huge corpora).
CHUNK = 4096


def iter_batches(lm, texts: Iterable[Text], *, batch_size: int = 16, max_length: int | None = None,
                 parse_special_tokens: bool = False, chunk: int = CHUNK,
                 on_tokenized=None) -> Iterator[Batch]:
    """Yield right-padded batches of ``texts``, sorted by length within chunks of ``chunk`` texts
    (less padding; padding never enters a statistic, so the order does not change a result).

    Args:
        texts: any iterable of :class:`Text` (read lazily, ``chunk`` at a time).
        on_tokenized: called with each chunk's list of :class:`Tokenized` (for counts).

    Raises:
        InputError: as :func:`tokenize`; batch_size below 1.
    """
    validate.positive_int("batch size", batch_size)
    buf: list[Text] = []
    start = 0

    def flush(buf, start):
        items = tokenize(lm, buf, max_length, parse_special_tokens=parse_special_tokens, start_index=start)
        if on_tokenized is not None:
            on_tokenized(items)
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        for i in range(0, len(order), batch_size):
            rows = order[i:i + batch_size]
            yield collate(lm, [items[r] for r in rows], [buf[r] for r in rows])

    for text in texts:
        buf.append(text)
        if len(buf) >= chunk:
            yield from flush(buf, start)
            start += len(buf)
            buf = []
    if buf:
        yield from flush(buf, start)
