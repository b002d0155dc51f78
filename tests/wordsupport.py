"""Helpers for the linguistic tests: batches from a real tokenizer without a model, and the Wilson
interval written out from its formula (to check the library's intervals against)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from probe.text.inputs import Text, collate, tokenize

#: z for a two-sided 95% interval (the 0.975 quantile of the standard normal).
Z95 = 1.959963984540054


def tokenizer_only(tokenizer, max_length: int = 512):
    """What :func:`probe.text.inputs.tokenize` and :func:`collate` need of a loaded model."""
    return SimpleNamespace(tokenizer=tokenizer, max_length=max_length)


def batch_of(tokenizer, texts: list[Text], max_length: int | None = None):
    """One right-padded batch of ``texts`` in the given order (no length sorting)."""
    lm = tokenizer_only(tokenizer)
    return collate(lm, tokenize(lm, texts, max_length), texts)


def wilson_by_hand(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return centre - half, centre + half
