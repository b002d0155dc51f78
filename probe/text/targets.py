"""The encoder-decoder tokenization: a source for the encoder and a target for the decoder, the
target tokenized as a target and put after the decoder's start token.

(The rest of the encoder-decoder inputs, the sides of a site and generated targets, are in
:mod:`probe.loading.seq2seq`.)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from .. import validate
from ..errors import InputError
from .sequence import Text, target_text
from .tokenization import Tokenized, tokenize_side


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
        One :class:`~probe.text.tokenization.Tokenized` per pair (the source) with ``target`` set (offsets
        into the target text; the start token is special and covers no character).

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
