"""From text to batches: tokenization with character offsets, word alignment, padding.

Data flow: texts (:class:`~probe.text.sequence.Text`, or plain strings) -> :func:`tokenize` (one
:class:`~probe.text.tokenization.Tokenized` per text: token ids, character offsets, special-token flags,
word index of each token, truncation; :mod:`probe.text.tokenization` for one side,
:mod:`probe.text.targets` for an encoder-decoder model's source and target) -> :func:`iter_batches`
(length-sorted, right-padded :class:`Batch` objects) -> the model.

The names of those modules are importable from here too (``from probe.text.inputs import Text``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import validate
from ..architectures.modules import has_type_table
from ..errors import InputError
from .sequence import Text, as_texts, stream_texts, target_text  # noqa: F401 (as_texts, stream_texts: re-exported)
from .targets import decoder_start_id, tokenize_pairs  # noqa: F401 (decoder_start_id: re-exported)
from .tokenization import Tokenized, tokenize_side, too_short_limit  # noqa: F401 (too_short_limit: re-exported)


def tokenize(lm, texts: Sequence[Text], max_length: int | None = None, *,
             parse_special_tokens: bool = False, start_index: int = 0) -> list[Tokenized]:
    """Tokenize texts (no padding), truncating each to ``max_length`` tokens.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel`.
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
    the statistics need real tokens first). Filled as NumPy arrays, one tensor per field. Token types
    are kept only where the model's config gives them a table of their own
    (:func:`probe.architectures.modules.has_type_table`)."""
    B, T = len(items), max(len(t) for t in items)
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids = np.full((B, T), pad_id, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    offsets = np.zeros((B, T, 2), dtype=np.int64)
    special = np.zeros((B, T), dtype=bool)
    word_ids = np.full((B, T), -1, dtype=np.int64)
    # token types only for a model whose config gives them a table of their own (GPT-2 would read them as tokens)
    has_tt = items[0].token_type_ids is not None and has_type_table(getattr(getattr(lm, "model", None), "config", None))
    tt = np.zeros((B, T), dtype=np.int64) if has_tt else None
    for r, t in enumerate(items):
        n = len(t)
        ids[r, :n] = t.ids
        mask[r, :n] = 1
        offsets[r, :n] = np.asarray(t.offsets, dtype=np.int64).reshape(n, 2)
        special[r, :n] = t.special
        word_ids[r, :n] = t.word_ids
        if has_tt:
            tt[r, :n] = t.token_type_ids
    target = None
    if items[0].target is not None:  # encoder-decoder: sources here, targets in a batch of their own
        target = collate(lm, [t.target for t in items],
                         [Text(target_text(t), meta=t.meta, index=t.index) for t in texts])
        texts = [Text(t.text, t.words, t.meta, None, t.index) for t in texts]
    as_tensor = torch.from_numpy
    return Batch(as_tensor(ids), as_tensor(mask), None if tt is None else as_tensor(tt), as_tensor(offsets),
                 as_tensor(special), as_tensor(word_ids), list(texts), [t.index for t in items],
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
