"""Token classes and labels: punctuation by the characters a token covers (the ``punct``
statistic) and readable display labels, byte-level pieces of emoji and CJK punctuation included."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache

import torch

from .inputs import Batch


@lru_cache(maxsize=2 ** 16)
def is_punctuation_text(text: str) -> bool:
    """True if ``text`` with whitespace removed is non-empty and made only of Unicode punctuation
    (general categories Pc, Pd, Pe, Pf, Pi, Po, Ps): the ``punct`` statistic, applied to the
    characters a token covers in the input. Memoized: a corpus repeats its words and marks."""
    s = "".join(ch for ch in text if not ch.isspace())
    return bool(s) and all(unicodedata.category(ch).startswith("P") for ch in s)


def punctuation_mask(batch: Batch, tokenizer=None) -> torch.Tensor:
    """[batch, T] bool: real, non-special tokens whose covered characters are punctuation.

    A byte-level piece of a punctuation character (byte-level BPE splits 「 or ¿ into pieces)
    covers that character and counts. Tokenizers without character offsets (slow ones)
    fall back to the token's decoded surface form (a WordPiece '##' marker removed).
    """
    B, T = batch.input_ids.shape
    offsets, special = batch.offsets.tolist(), batch.special.tolist()
    ids, lengths = batch.input_ids.tolist(), batch.lengths.tolist()
    has_offsets = bool((batch.offsets[..., 1] > batch.offsets[..., 0]).any())
    out = [[False] * T for _ in range(B)]
    for r in range(B):
        t = batch.texts[r]
        full = t.text if t.pair is None else t.text + " " + t.pair
        for p in range(lengths[r]):
            if special[r][p]:
                continue
            if has_offsets:
                s, e = offsets[r][p]
                out[r][p] = is_punctuation_text(full[s:e])
            elif tokenizer is not None:
                surface = token_surface(tokenizer, tokenizer.convert_ids_to_tokens(ids[r][p]))
                out[r][p] = is_punctuation_text(surface[2:] if surface.startswith("##") and len(surface) > 2
                                                else surface)
    return torch.tensor(out, dtype=torch.bool)


def token_surface(tokenizer, token: str) -> str:
    """The text a token string stands for: byte-level BPE bytes decoded ('Ġ.' -> ' .'),
    sentencepiece markers turned into spaces; a WordPiece continuation keeps its '##'."""
    try:
        text = tokenizer.convert_tokens_to_string([token])
    except Exception:  # noqa: BLE001 - some tokenizers cannot decode lone tokens
        text = token
    if token.startswith("##") and not text.lstrip().startswith("##"):
        text = "##" + text.lstrip()
    return text


def display_tokens(tokenizer, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                   special: Sequence[bool]) -> list[str]:
    """Readable labels of a sequence's tokens (for reports and views).

    Special tokens show as themselves; other tokens as their decoded surface with whitespace
    shown as nothing and newlines as ``\\n``. A byte-level piece of a character (an emoji or CJK
    punctuation split into several tokens, whose lone decoding is the replacement character)
    shows the character it belongs to, marked as a part: ``💩 (1/3)``, ``💩 (2/3)``, ``💩 (3/3)``
    (never an unreadable replacement character). Labels of pieces of one character are distinct.
    """
    tokens = tokenizer.convert_ids_to_tokens(list(ids))
    labels: list[str] = []
    # groups of consecutive tokens that cover the same characters (pieces of one character)
    covered = [text[s:e].strip() if e > s else "" for s, e in offsets]
    i = 0
    n = len(ids)
    while i < n:
        if special[i]:
            labels.append(tokens[i])
            i += 1
            continue
        surface = token_surface(tokenizer, tokens[i])
        if "\ufffd" not in surface or not covered[i]:
            label = surface.replace("\n", "\\n").strip()
            labels.append(label or repr(tokens[i]))
            i += 1
            continue
        # a piece: find the run of tokens whose covered characters overlap this one's
        j = i + 1
        end = offsets[i][1]
        while j < n and not special[j] and offsets[j][0] < end and "\ufffd" in token_surface(tokenizer, tokens[j]):
            end = max(end, offsets[j][1])
            j += 1
        char = text[offsets[i][0]:end].strip()
        k = j - i
        for m in range(k):
            labels.append(f"{char} ({m + 1}/{k})" if k > 1 else f"{char} (part)")
        i = j
    return labels


def label_examples(examples: list, tokenizer) -> list:
    """The analysis examples of an image or audio model with their token labels stored
    (``Example.labels``, and ``target["labels"]`` for an encoder-decoder model's decoder side), so that
    views and reports label them without a tokenizer: image tokens as their special names (``[CLS]``,
    registers) and ``patch (r, c)``, audio frames by their start time (``0.42 s``), decoder tokens by the
    model's tokenizer (:class:`probe.loading.pixels.PixelProcessor`, :class:`probe.loading.sound.SpeechProcessor`).
    A text model's examples are returned as they are (its tokenizer labels them where they are shown).
    """
    if not hasattr(tokenizer, "discovery_inputs"):  # a text tokenizer: the views take it
        return examples
    for ex in examples:
        if ex.labels is None:
            ex.labels = display_tokens(tokenizer, ex.text, ex.ids, ex.offsets, ex.special)
        t = ex.target
        if t is not None and t.get("labels") is None:
            t["labels"] = display_tokens(tokenizer, t["text"], t["ids"], [tuple(o) for o in t["offsets"]],
                                         t["special"])
    return examples
