"""One input sequence, :class:`Text`: its characters, its words, and a second segment or an
encoder-decoder model's target; strings wrapped as texts and checked as they are read.

The first step of the data flow (:mod:`probe.text.inputs` has the rest): texts -> tokenization
(:mod:`probe.text.tokenization`, :mod:`probe.text.targets`) -> batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..errors import InputError

_NONSPACE = re.compile(r"\S+")  # runs of characters that are not str.isspace() (re's \s is the same set)


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
            (None: counted from the first text given to :func:`probe.text.inputs.tokenize` /
            :func:`probe.text.inputs.iter_batches`).
        target: encoder-decoder models: the text the decoder reads (``text`` is the source the
            encoder reads); None for encoders and decoder-only models, which refuse one.
        parse_special_tokens: this text's typed special-token strings ("[MASK]") are special tokens, as
            ``parse_special_tokens=True`` makes them for every text of a call (for calls that take no such
            argument: ``probe.why``, ``probe.attention_steps``); the texts of one call agree.
    """

    text: str
    words: list[tuple[int, int]] | None = None
    meta: dict = field(default_factory=dict)
    pair: str | None = None
    index: int | None = None
    target: str | None = None
    parse_special_tokens: bool = False

    def word_spans(self) -> list[tuple[int, int]]:
        """Character spans of the words: the given ones, or the whitespace-separated runs of ``text``."""
        if self.words is not None:
            return list(self.words)
        return [m.span() for m in _NONSPACE.finditer(self.text)]


def target_text(text: Text) -> str | None:
    """An encoder-decoder model's target of ``text``: ``text.target``, else the deprecated
    ``text.pair`` (:func:`probe.text.targets.tokenize_pairs` warns about it), else None."""
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
