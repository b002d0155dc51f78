"""Donors of resample ablation (Chan et al. 2022, causal scrubbing: a head's output replaced by its
output on another input drawn from the data).

Each held-out sequence gets one donor per seed: a reference text at least as long as it (source and,
for an encoder-decoder model, target: real tokens), drawn uniformly with
``numpy.random.default_rng([seed, corpus index of the held-out text])``. The donor's clean z_h at
positions 0 .. n-1 (n = the held-out sequence's real tokens) replaces the head's; at a causal site
position t of the donor saw t + 1 of its own tokens, as the held-out sequence did. A sequence
without a donor (every reference text shorter) is left out of the resample effect and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..text.inputs import Batch, Text, collate, tokenize

#: The donors' seed unless given.
RESAMPLE_SEED = 0


@dataclass
class Donors:
    """The donors of the held-out batches.

    Attributes:
        batches: per held-out batch, a batch of its rows' donors (row r: the donor of row r; a row
            without a donor has its own text, which changes nothing, and ``keep`` False).
        keep: [held-out sequences] bool, in the order of the held-out batches' rows: has a donor.
        seed: the draw's seed.
    """

    batches: list[Batch]
    keep: np.ndarray
    seed: int

    @property
    def missing(self) -> int:
        """Held-out sequences without a donor."""
        return int((~self.keep).sum())


def _lengths(batch: Batch) -> np.ndarray:
    """[B, 2] real tokens of each row: source, target (0 without one)."""
    tgt = batch.target.lengths if batch.target is not None else 0 * batch.lengths
    return np.stack([batch.lengths.cpu().numpy(), np.asarray(tgt.cpu())], 1)


def _texts(batch: Batch) -> list[Text]:
    """The rows' texts, an encoder-decoder batch's with their targets again (its source rows keep none)."""
    if batch.target is None:
        return list(batch.texts)
    return [Text(s.text, s.words, s.meta, None, s.index, t.text) for s, t in zip(batch.texts, batch.target.texts)]


def draw_donors(lm, held: Sequence[Batch], ref: Sequence[Batch], *, seed: int = RESAMPLE_SEED,
                max_length: int | None = None) -> Donors:
    """One donor from ``ref`` for every row of ``held`` (see the module docstring).

    Args:
        lm: the model (the donors are tokenized as the held-out texts were).
        held: the held-out batches.
        ref: the reference batches.
        seed: the draw's seed.
        max_length: the token limit the batches were made with.
    """
    pool = [text for b in ref for text in _texts(b)]
    sizes = np.concatenate([_lengths(b) for b in ref])  # [reference texts, 2]
    order = sorted(range(len(pool)), key=lambda j: int(pool[j].meta.get("index", j)))  # corpus order
    pool, sizes = [pool[j] for j in order], sizes[order]
    out, keep = [], []
    for batch in held:
        texts, own_texts = [], _texts(batch)
        for r, need in enumerate(_lengths(batch)):
            fits = np.flatnonzero((sizes >= need).all(1))
            own = own_texts[r]
            if len(fits) == 0:
                texts.append(own)
                keep.append(False)
                continue
            corpus_index = int(own.meta.get("index", batch.index[r]))
            texts.append(pool[fits[np.random.default_rng([seed, corpus_index]).integers(len(fits))]])
            keep.append(True)
        out.append(collate(lm, tokenize(lm, texts, max_length), texts))
    return Donors(out, np.array(keep, dtype=bool), seed)
