"""Kovaleva pattern types per (head, sequence) (docs/statistics.md, "Kovaleva pattern types").

After Kovaleva et al. 2019 ("Revealing the Dark Secrets of BERT", sec. 3: vertical, diagonal,
vertical + diagonal, block, heterogeneous), with the rules below. For one head on one sequence of
T real tokens, averaged over its real query rows i:

- v = attention to the "vertical" positions: position 0 ([CLS] / BOS / the first token), the
  tokenizer's sep tokens and punctuation tokens (the statistics ``sep`` and ``punct``), each position
  counted once (a sep token that is also at position 0 counts once);
- d = A[i, i-1] + A[i, i] + A[i, i+1] (the terms that exist; in a causal model A[i, i+1] = 0);
- s = the attention that stays within the query's own segment (sentence pairs only).

The type is the first rule that holds: ``vertical+diagonal`` (v >= 0.3 and d >= 0.3), ``vertical``
(v >= 0.5), ``diagonal`` (d >= 0.5), ``block`` (two segments and s >= 0.8), else
``heterogeneous``. A head's distribution is the share of sequences of each type; a layer's is the
mean over its heads.

Segments (decided here): a sequence has two segments when its text has a pair
(:class:`probe.text.inputs.Text` ``pair``). A token's segment is its ``token_type_ids`` entry where the
tokenizer gives segment ids that differ within the sequence (BERT: [CLS] A [SEP] -> 0, B [SEP] -> 1);
otherwise (RoBERTa, byte-level BPE tokenizers: no segment ids) a real token is in segment 1 when its
characters start after the first text, and a special token takes the segment of the token before it
(position 0 takes segment 0), which gives BERT's assignment on BERT's layout.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..measures.accumulators import Accumulator, present_heads
from ..measures.stats import token_features
from ..sites import Site
from ..text.inputs import Batch

#: Pattern types, in rule order, and the heads.csv column of each share.
TYPES: tuple[str, ...] = ("vertical+diagonal", "vertical", "diagonal", "block", "heterogeneous")
COLUMNS: dict[str, str] = {t: "type_" + t.replace("+", "_") for t in TYPES}

#: Rule thresholds (docs/statistics.md).
VD_V, VD_D, V_MIN, D_MIN, BLOCK_MIN = 0.3, 0.3, 0.5, 0.5, 0.8


def segments(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Segment of each token and which rows are sentence pairs.

    Returns:
        ([batch, T] long segment ids (0 or 1; padding 0), [batch] bool: the row has two segments).
    """
    B, T = batch.input_ids.shape
    pair = torch.tensor([t.pair is not None for t in batch.texts], dtype=torch.bool)
    seg = torch.zeros(B, T, dtype=torch.long)
    real = batch.real.cpu()
    lengths = batch.lengths.tolist()
    tt = batch.token_type_ids.cpu() if batch.token_type_ids is not None else None
    for r in range(B):
        if not pair[r]:
            continue
        n = lengths[r]
        if tt is not None and len(set(tt[r, :n].tolist())) > 1:
            seg[r, :n] = (tt[r, :n] != tt[r, 0]).long()
            continue
        first = len(batch.texts[r].text)
        special, starts = batch.special[r].tolist(), batch.offsets[r, :, 0].tolist()
        current = 0
        for p in range(n):
            if not special[p]:
                current = 1 if starts[p] > first else 0
            seg[r, p] = current
    return seg * real, pair


def sequence_scores(probs: torch.Tensor, batch: Batch, tokenizer, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """[batch, heads, 3] per-sequence v, d and s (row means; s is 0 where the row has no pair), or with
    ``rows=(i0, i1)`` the share of those means from query rows i0..i1-1 (the shares of disjoint blocks
    covering every row add up to the means).

    Args:
        probs: [batch, heads, T, T] attention probabilities of one site, or [batch, heads, i1 - i0, T]
            with ``rows``.
    """
    def weights():
        feats = token_features(batch, tokenizer)
        B, T = feats.real.shape
        real = feats.real
        rows = real.float() / real.sum(1, keepdim=True).clamp(min=1).float()  # [B, T] 1 / n_rows on real rows
        vertical = (feats.sep | feats.punct) & real
        vertical[:, 0] = True
        pos = torch.arange(T)
        near = ((pos[:, None] - pos[None, :]).abs() <= 1).float()  # [T, T]
        seg, pair = batch.cached("segments", lambda: segments(batch))
        same = (seg[:, :, None] == seg[:, None, :]) & real[:, None, :] & pair[:, None, None]
        w = torch.stack([vertical.float()[:, None, :].expand(B, T, T), near[None].expand(B, T, T),
                         same.float()], -1)  # [B, T(query), T(key), 3]
        return (w * rows[:, :, None, None]).reshape(B, T * T, 3)

    B, H, r, T = probs.shape
    i0 = 0 if rows is None else int(rows[0])
    w = batch.cached(("kovaleva-weights", T, str(probs.device)),  # moved to the model's device once per batch
                     lambda: batch.cached(("kovaleva-weights", T), weights).to(probs.device))
    w = w.view(B, T, T, 3)[:, i0:i0 + r].reshape(B, r * T, 3)  # the block's query rows
    return torch.bmm(probs.float().reshape(B, H, r * T), w)  # [B, H, 3], on the model's device


def classify(scores: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """[batch, heads] type index into :data:`TYPES` from [batch, heads, 3] (v, d, s) and [batch] pair flags."""
    v, d, s = scores.unbind(-1)
    out = torch.full(v.shape, TYPES.index("heterogeneous"), dtype=torch.long, device=scores.device)
    rules = [(v >= VD_V) & (d >= VD_D), v >= V_MIN, d >= D_MIN, pair.to(scores.device)[:, None] & (s >= BLOCK_MIN)]
    for index in reversed(range(len(rules))):  # the first rule that holds wins
        out = torch.where(rules[index], torch.full_like(out, index), out)
    return out


@dataclass
class TypeResult:
    """What :class:`PatternTypes` measured.

    Attributes:
        per_layer: one row per layer: ``layer`` and the mean share over its heads of each type.
        shares: [sites, heads, types] share of sequences of each type (order :data:`TYPES`).
        sequences: sequences classified; pairs: of which sentence pairs (two segments).
    """

    per_layer: pd.DataFrame
    shares: np.ndarray
    sequences: int
    pairs: int


class PatternTypes(Accumulator):
    """Counts of each Kovaleva type per (site, head) over the sequences of the corpus.

    Args:
        sites: the model's attention sites.
        n_heads: query heads per site.
        tokenizer: the model's tokenizer (its sep token; punctuation).
    """

    name = "pattern_types"
    title = "Kovaleva pattern types"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)
    transient = ("tokenizer",)  # not sent to the other processes of a data-parallel run
    row_blocks = True  # v, d and s are sums over query rows: a batch's blocks are added, then classified
    on_device = ("counts",)

    def __init__(self, sites: list[Site], n_heads: int, tokenizer=None) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.tokenizer = tokenizer
        self._pos = {s: i for i, s in enumerate(self.sites)}
        self.counts = torch.zeros(len(self.sites), n_heads, len(TYPES), dtype=torch.int64)
        self.sequences = 0
        self.pairs = 0
        self._partial: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # site -> (scores so far, present)

    def begin_batch(self, batch: Batch) -> None:
        self.sequences += len(batch)
        self.pairs += sum(t.pair is not None for t in batch.texts)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None,
               **_) -> None:
        """Classify every (head, sequence) of one site: ``probs`` [batch, heads, T, T], or with
        ``rows=(i0, i1)`` its query rows i0..i1-1 ([batch, heads, i1 - i0, T]; blocks in row order,
        classified once the last row is in)."""
        i = self._pos[site]
        i0, i1 = (0, probs.shape[-2]) if rows is None else (int(rows[0]), int(rows[1]))
        part = sequence_scores(probs, batch, self.tokenizer, (i0, i1))
        if i0 == 0:  # the first row's first key (present_heads) is in the first block
            self._partial[i] = (torch.zeros_like(part), present_heads(probs))
        total, present = self._partial[i]
        part = part + total
        if i1 < probs.shape[-1]:
            self._partial[i] = (part, present)
            return
        del self._partial[i]
        pair = batch.cached("segments", lambda: segments(batch))[1]
        types = classify(part, pair)  # [B, H], on the probabilities' device
        counted = torch.nn.functional.one_hot(types, len(TYPES)).sum(0)  # [H, types]
        self.follow(probs.device)
        self.counts[i] += (counted * present[:, None]).to(self.counts.device)  # removed heads: none

    def merge(self, other: PatternTypes) -> PatternTypes:
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge pattern types of different models")
        self.counts += other.counts.to(self.counts.device)
        self.sequences += other.sequences
        self.pairs += other.pairs
        return self

    def shares(self) -> np.ndarray:
        """[sites, heads, types] share of sequences of each type (rows sum to 1; NaN before any batch)."""
        counts = self.counts.cpu().double().numpy()
        total = counts.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, counts / np.where(total > 0, total, 1), np.nan)

    def result(self) -> TypeResult:
        """Shares per head and per layer (the mean over its heads; heads removed by pruning, whose
        shares are NaN, left out)."""
        shares = self.shares()
        with warnings.catch_warnings():  # a layer with every head removed: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            frame = pd.DataFrame(np.nanmean(shares, 1), columns=list(TYPES))
        frame.insert(0, "layer", [s.layer for s in self.sites])
        return TypeResult(frame, shares, self.sequences, self.pairs)

    def columns(self) -> pd.DataFrame:
        """Per head: ``pattern`` (its most frequent type; ties: rule order) and one share column per type."""
        S, H = len(self.sites), self.n_heads
        shares = self.shares().reshape(S * H, len(TYPES))
        frame = pd.DataFrame({"layer": np.repeat([s.layer for s in self.sites], H), "head": np.tile(np.arange(H), S)})
        frame["pattern"] = [TYPES[int(np.argmax(row))] if not np.isnan(row).any() else "" for row in shares]
        for j, t in enumerate(TYPES):
            frame[COLUMNS[t]] = shares[:, j]
        return frame
