"""Capturing attention probabilities with forward hooks.

Each layer's attention module (see :mod:`probe.architectures`) returns
``(attn_output, attn_probs)``; a forward hook hands ``attn_probs`` ([batch, heads, query, key]) to a
callback as soon as that layer has run, so a caller can reduce it (e.g. to statistics) and let it
go before the next layer: no n x n maps are kept for the whole corpus.

Two silent failures of other tools are ruled out here (shared/CASES.md F01, F02): a model loaded
with ``sdpa``/flash attention returns no probabilities, so :func:`ensure_eager` switches it to eager
(and says so); a model in train mode applies dropout to the probabilities, so capture runs in eval
mode and restores the mode afterwards.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from .architectures import attention_modules
from .errors import CaptureError, InputError
from .hooks import Hooks
from .models import LoadedModel, quiet_transformers

log = logging.getLogger(__name__)


def ensure_eager(model) -> str | None:
    """Switch a model to eager attention if it uses another implementation.

    ``sdpa`` and flash attention return ``None`` for the attention probabilities
    (transformers 5.x), so probe never silently gets empty weights.

    Returns:
        A note saying what was switched, or None if the model already ran eager attention.
    """
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl in (None, "eager"):
        return None
    model.set_attn_implementation("eager")
    note = f"switched attention implementation from {impl!r} to 'eager' so that attention probabilities exist"
    log.warning(note)
    return note


@contextmanager
def attention_hooks(lm: LoadedModel, callback: Callable[[int, torch.Tensor], None]) -> Iterator[list[str]]:
    """Context manager: call ``callback(layer, probs)`` for every layer on every forward pass.

    ``probs`` is [batch, heads, query, key] (query = key = T without a cache). Inside the context
    the model runs eager attention in eval mode; on exit (also on exceptions) every hook is removed
    and the attention implementation and train/eval mode are restored.

    Yields:
        Notes on what was changed to make capture correct (attention implementation, train mode).

    Raises:
        CaptureError: a layer returned no attention probabilities.
    """
    model = lm.model
    notes = []
    impl = getattr(model.config, "_attn_implementation", "eager")
    note = ensure_eager(model)
    if note:
        notes.append(note + " (restored afterwards)")
    was_training = model.training
    if was_training:
        notes.append("model was in train mode; captured in eval mode (attention dropout off) and restored")
        model.eval()

    def make_hook(layer: int):
        def hook(module, args, output):
            probs = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if probs is None:
                raise CaptureError(
                    f"layer {layer} returned no attention probabilities "
                    f"(attention implementation {model.config._attn_implementation!r}); load with eager attention")
            callback(layer, probs.detach())
        return hook

    try:
        with Hooks() as hooks:
            for layer, module in enumerate(attention_modules(model, lm.spec)):
                hooks.forward(module, make_hook(layer))
            yield notes
    finally:
        model.train(was_training)
        if note:
            model.set_attn_implementation(impl)


@dataclass
class Encoded:
    """A tokenized batch and what truncation did to it.

    Attributes:
        input_ids: [batch, T] token ids, right-padded.
        attention_mask: [batch, T] 1 for real tokens.
        token_type_ids: [batch, T] or None.
        truncated: how many sequences were cut to ``max_length``.
        lengths: [batch] real tokens per sequence.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    truncated: int

    @property
    def lengths(self) -> torch.Tensor:
        """[batch] number of real tokens per row (tokens)."""
        return self.attention_mask.sum(1)

    def model_inputs(self) -> dict:
        """Keyword arguments for the model's forward: input_ids, attention_mask (, token_type_ids)."""
        kw = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        if self.token_type_ids is not None:
            kw["token_type_ids"] = self.token_type_ids
        return kw

    def tokens(self, tokenizer, row: int) -> list[str]:
        """The token strings of one row, without padding."""
        n = int(self.attention_mask[row].sum())
        return tokenizer.convert_ids_to_tokens(self.input_ids[row, :n].tolist())


def tokenize(lm: LoadedModel, texts: Sequence[str], max_length: int | None = None, *,
             per_text: bool = False) -> tuple[list[dict], int | list[bool]]:
    """Tokenize texts (no padding), truncating each to ``max_length`` tokens.

    Args:
        texts: the sequences (special tokens are added as the tokenizer does by default).
        max_length: token limit, >= 2 (default and upper bound: the model's limit ``lm.max_length``).
        per_text: return one truncated flag per text instead of the count.

    Returns:
        (one dict of token lists per text, number of texts that were truncated, or the flags).

    Raises:
        InputError: no texts, max_length below 2, or a text with no token besides the special
            tokens (an unknown-word token counts as a token).
    """
    if not texts:
        raise InputError("no text given")
    if max_length is not None and max_length < 2:
        raise InputError(f"max length must be at least 2 tokens, got {max_length}")
    limit = min(max_length or lm.max_length, lm.max_length)
    tok = lm.tokenizer
    with quiet_transformers(progress_bars=True):  # the over-length warning is moot: probe truncates and counts
        full = tok(list(texts), add_special_tokens=True)["input_ids"]
    special = set(getattr(tok, "all_special_ids", []) or []) - {getattr(tok, "unk_token_id", None)}
    for i, (text, ids) in enumerate(zip(texts, full)):
        if not any(t not in special for t in ids):
            raise InputError(f"text {i + 1} has no tokens besides special tokens: {text[:40]!r}")
    flags = [len(ids) > limit for ids in full]
    truncated = sum(flags)
    if truncated:
        enc = tok(list(texts), truncation=True, max_length=limit)
    else:
        enc = tok(list(texts))
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    return [{k: enc[k][i] for k in keys} for i in range(len(texts))], (flags if per_text else truncated)


def pad(lm: LoadedModel, features: Sequence[dict], truncated: int = 0) -> Encoded:
    """Right-pad tokenized sequences (from :func:`tokenize`) into one batch (whatever the
    tokenizer's own ``padding_side``: the statistics need real tokens first)."""
    enc = lm.tokenizer.pad(list(features), padding=True, padding_side="right", return_tensors="pt")
    return Encoded(enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"), truncated)


def encode(lm: LoadedModel, texts: Sequence[str], max_length: int | None = None) -> Encoded:
    """Tokenize texts into one right-padded batch (:func:`tokenize` then :func:`pad`).

    Raises:
        InputError: no texts, or a text that yields no tokens.
    """
    features, truncated = tokenize(lm, texts, max_length)
    return pad(lm, features, truncated)


@dataclass
class Captured:
    """Attention probabilities of one batch, for notebooks and tests.

    Attributes:
        attentions: one tensor per layer, [batch, heads, T, T] (padded positions included; use
            ``encoded.attention_mask`` to drop them).
        encoded: the tokenized batch.
        outputs: the model's own outputs of the same forward pass.
        notes: what capture changed (attention implementation, train mode).
    """

    attentions: list[torch.Tensor]
    encoded: Encoded
    outputs: object
    notes: list[str]


@torch.no_grad()
def capture_attention(lm: LoadedModel, texts: Sequence[str] | str, max_length: int | None = None) -> Captured:
    """Run one batch of texts and return every layer's attention probabilities.

    Keeps every map in memory: for corpora use :func:`probe.analysis.analyze`, which reduces each
    layer to statistics as it goes.

    Args:
        lm: a loaded model.
        texts: one text or a list of texts (one batch, right-padded).
        max_length: token limit per text, >= 2 (default: the model's limit).

    Returns:
        :class:`Captured`: ``attentions[layer]`` is [batch, heads, T, T] (rows of real query tokens
        sum to 1; padded keys get exactly 0), with the tokenized batch and the model's outputs.

    Raises:
        InputError: empty input or max_length below 2. CaptureError: attention probabilities missing.
    """
    if isinstance(texts, str):
        texts = [texts]
    enc = encode(lm, texts, max_length)
    maps: dict[int, torch.Tensor] = {}
    with attention_hooks(lm, lambda layer, probs: maps.__setitem__(layer, probs)) as notes:
        outputs = lm.model(**enc.model_inputs(), use_cache=False) if lm.causal else lm.model(**enc.model_inputs())
    return Captured([maps[i] for i in range(len(maps))], enc, outputs, notes)
