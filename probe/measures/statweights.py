"""The per-head statistics' definitions, as per-batch weights (defined in docs/statistics.md).

Definitions follow Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Kovaleva et al.
2019 and Voita et al. 2019; the exact per-row definitions are in the docstring of
:func:`contraction_weights`. Each statistic's sum over the valid rows of a batch is the map reduced
with weights built here once per batch (per-key weights, diagonals, per-row weight vectors and row
weights: :class:`ContractionWeights`; :mod:`probe.measures.stats` applies them, to attention probabilities
and to their value-weighted form alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sites import Site, visible_keys
from ..text.inputs import Batch
from ..text.tokens import punctuation_mask

#: The statistics, in report order. Units: probabilities (0..1) except ``entropy`` (nats),
#: ``norm_entropy`` (0..1) and ``distance`` (tokens).
STATISTICS: tuple[str, ...] = (
    "self", "prev", "next", "first", "sep", "punct",
    "entropy", "norm_entropy", "distance", "long", "max_weight",
)

#: Statistics of cross-attention sites only (encoder-decoder models), after :data:`STATISTICS` in
#: ``heads.csv`` of such a model: ``aligned`` (probability).
CROSS_STATISTICS: tuple[str, ...] = ("aligned",)
#: Every statistic the accumulator keeps, in order.
ALL_STATISTICS: tuple[str, ...] = STATISTICS + CROSS_STATISTICS

#: Keys farther than this many tokens count as long-range (``long``).
LONG_RANGE = 4
#: ``aligned``: keys within this many positions of the diagonal count as aligned.
ALIGN_WINDOW = 1


@dataclass
class TokenFeatures:
    """Per-token facts of one right-padded batch, shared by every site and head.

    Attributes:
        real: [batch, T] bool, True for real tokens (a prefix of each row: right padding).
        sep: [batch, T] bool, True where the token is the tokenizer's sep token.
        punct: [batch, T] bool, True where the token covers only punctuation (``punct``).
        has_sep: whether the tokenizer has a sep token at all (``sep`` is undefined otherwise).
    """

    real: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor
    has_sep: bool


def boundary_token_id(tokenizer, eos_as_sep: bool = False) -> int | None:
    """The token ``sep`` measures: the tokenizer's sep token; with ``eos_as_sep`` (encoder-decoder
    models, whose tokenizers often have none: Marian, T5) its end-of-sequence token where it has no
    sep token. None: ``sep`` is undefined."""
    if getattr(tokenizer, "sep_token", None) is not None:
        return tokenizer.sep_token_id
    if eos_as_sep and getattr(tokenizer, "eos_token", None) is not None:
        return tokenizer.eos_token_id
    return None


def token_features(batch: Batch, tokenizer, eos_as_sep: bool = False) -> TokenFeatures:
    """The :class:`TokenFeatures` of a batch (computed once per batch and cached on it); ``sep``
    marks :func:`boundary_token_id`.

    Raises:
        ValueError: padding is not on the right (real tokens must be a prefix of each row).
    """
    def build() -> TokenFeatures:
        real = batch.real
        if real.shape[1] > 1 and bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError("attention statistics need right padding (real tokens first in each row)")
        sep_id = boundary_token_id(tokenizer, eos_as_sep)
        sep = torch.zeros_like(real) if sep_id is None else (batch.input_ids.cpu() == sep_id) & real.cpu()
        return TokenFeatures(real=real.cpu(), sep=sep, punct=punctuation_mask(batch, tokenizer) & real.cpu(),
                             has_sep=sep_id is not None)
    return batch.cached(("token_features", eos_as_sep), build)


#: Statistics whose per-row value is a weighted sum of the row's probabilities.
LINEAR: tuple[str, ...] = ("self", "prev", "next", "first", "sep", "punct", "distance", "long", "aligned")
#: Position of each statistic in :data:`ALL_STATISTICS` (the last axis of sums and counts).
INDEX: dict[str, int] = {name: i for i, name in enumerate(ALL_STATISTICS)}


@dataclass
class ContractionWeights:
    """Per-batch weights turning one site's probabilities (or a block of their query rows) into
    statistic sums, without a dense [rows, keys, statistics] tensor.

    Each linear statistic's per-row value is one of: a sum of the row's A over keys with a per-key
    weight (``keys``: first, sep, punct: one matrix product of [channels, keys] with the map); one
    entry A[r, r + offset] (``diagonals``: self, prev, next); or a sum with a per-row weight vector over
    the keys (``positional``: distance, long, aligned, which depend on (i, j)). Row values are then
    added over the rows with ``row_weights``.

    Attributes:
        keys: [batch, len(key_names) + 1, keys] float: per-key weights (1 on the first key, on sep
            keys...), and a last channel of ones (the row's total).
        key_names: the statistics of ``keys``' channels.
        diagonals: (statistic, offset) pairs: the statistic's row value is A[r, r + offset] (0 where
            r + offset is not a key); offsets count keys from the block's first row.
        positional: [batch, rows, len(pos_names), keys] float: per-row weight vectors.
        pos_names: the statistics of ``positional``'s channels.
        row_weights: [batch, rows, len(ALL_STATISTICS)] float: weight of each row's value in each
            statistic's sum (1 on valid rows, 0 elsewhere; 1 / ln k_i for ``norm_entropy``).
        real_rows: [batch, rows] float, 1 on real query rows.
        rows: [batch, rows, len(ALL_STATISTICS)] float, 1 where the row is valid for the statistic.
        counts: [len(ALL_STATISTICS)] int64 valid rows per statistic (``rows`` summed; on the CPU).
    """

    keys: torch.Tensor
    key_names: tuple[str, ...]
    diagonals: tuple[tuple[str, int], ...]
    positional: torch.Tensor
    pos_names: tuple[str, ...]
    row_weights: torch.Tensor
    real_rows: torch.Tensor
    rows: torch.Tensor
    counts: torch.Tensor

    def to(self, device) -> ContractionWeights:
        """The weights on ``device`` (the device of the layer whose probabilities they reduce);
        ``counts`` stay on the CPU."""
        return ContractionWeights(self.keys.to(device), self.key_names, self.diagonals, self.positional.to(device),
                                  self.pos_names, self.row_weights.to(device), self.real_rows.to(device),
                                  self.rows.to(device), self.counts)


def contraction_weights(feats: TokenFeatures, site: Site, T: int, keys: TokenFeatures | None = None,
                        rows: tuple[int, int] | None = None, n_keys: int | None = None) -> ContractionWeights:
    """The weights used by :meth:`HeadStatistics.update` for one batch and one kind of site.

    ``rows`` = (i0, i1): the weights of query rows i0..i1-1 only (block capture, :mod:`probe.capture.blocks`):
    ``positional`` [batch, i1 - i0, channels, keys] and every per-row field of those rows, so the
    sums over a series of blocks covering every row are the whole map's. None: every row.
    ``n_keys``: self-attention sites: the weights of keys 0..n_keys-1 only (a causal block's later
    keys have probability 0, so the caller contracts ``probs[..., :n_keys]``); None: all T.

    With A = attention probabilities of one head on one sequence of T real tokens (row i = query,
    column j = key), the per-row values are:

    - ``self`` A[i, i]; ``prev`` A[i, i-1] (i >= 1); ``next`` A[i, i+1] (i <= T-2, non-causal sites);
    - ``first`` A[i, 0]; ``sep`` sum of A[i, j] over sep positions j (only if the tokenizer has a
      sep token); ``punct`` sum of A[i, j] over punctuation positions j;
    - ``entropy`` -sum_j A[i, j] ln A[i, j] (nats, 0 ln 0 = 0); ``norm_entropy`` entropy / ln(k_i)
      with k_i the keys row i may see under the site's own mask (:func:`probe.sites.visible_keys`:
      T, i + 1, or min(i + 1, W) under a sliding window of W keys), rows with k_i >= 2;
    - ``distance`` sum_j A[i, j] |i - j| (tokens); ``long`` sum of A[i, j] over |i - j| > 4,
      j not 0 and not a sep position; ``max_weight`` max_j A[i, j].

    Cross-attention sites (``keys``: the features of the source, S real keys; ``feats``: the
    target's, T real query rows) have a rectangular map [T, S] and these per-row values:

    - ``first`` A[i, 0]; ``sep`` (the sep token, else end-of-sequence: :func:`boundary_token_id`)
      and ``punct`` over the source's positions; ``entropy``; ``norm_entropy`` with k_i = S (every
      real source key); ``max_weight`` as above;
    - ``distance`` sum_j A[i, j] |i S / T - j| (source tokens): the distance from the position
      proportional to the query's place in the target;
    - ``aligned`` sum of A[i, j] over |j - d_i| <= 1 with d_i = round(i (S-1) / (T-1)), halves
      rounded up (d_0 = 0 when T = 1): attention within one source position of the diagonal, the monotonic alignment
      of translation heads (Voita et al. 2019, section 5; Bahdanau et al. 2015, figure 3);
    - ``self``, ``prev``, ``next`` and ``long`` are undefined (they compare positions of one sequence).

    Each of these except ``max_weight`` is a weighted sum of the row's A (or of -A ln A): a per-key
    weight, one diagonal, or a per-row weight vector (:class:`ContractionWeights`), built once per
    batch (and block) for all sites that share the same visible keys.
    """
    i0, i1 = (0, feats.real.shape[1] if site.kind == "cross" else T) if rows is None else rows
    if site.kind == "cross":
        if keys is None:
            raise ValueError("a cross-attention site needs the features of its keys (the source)")
        return _cross_weights(feats, keys, site, i0, i1)
    pos = torch.arange(T)
    nk = T if n_keys is None else n_keys
    lengths = feats.real.sum(1)
    real = feats.real[:, i0:i1]  # [B, rows]: the block's query rows
    q, k = pos[i0:i1, None], pos[None, :nk]
    sep = feats.sep[:, :nk]
    offset = (q - k).abs()  # [rows, nk]
    far = (offset > LONG_RANGE)[None] & (k != 0)[None] & ~sep[:, None, :]  # [B, rows, nk]
    positional = torch.stack([offset.float()[None].expand_as(far), far.float()], 2)  # [B, rows, 2, nk]
    key_w = _channels([(k[0] == 0).float().expand_as(sep), sep.float(), feats.punct[:, :nk].float()])
    next_rows = torch.zeros_like(real) if site.causal else real & (q.T <= lengths[:, None] - 2)
    kq = visible_keys(site, lengths, T).float()[:, i0:i1]  # [B, rows]
    valid = _valid_rows(real, kq, feats.has_sep, {"prev": real & (q.T >= 1), "next": next_rows,
                                                  "aligned": torch.zeros_like(real)})
    return ContractionWeights(key_w, ("first", "sep", "punct"), (("self", i0), ("prev", i0 - 1), ("next", i0 + 1)),
                              positional, ("distance", "long"), _row_weights(valid, kq), real.float(), valid,
                              valid.sum((0, 1)).round().to(torch.int64))


def _channels(weights: list[torch.Tensor]) -> torch.Tensor:
    """[batch, len(weights) + 1, keys]: the per-key weights ([batch, keys] each) and a channel of ones."""
    return torch.stack(weights + [torch.ones_like(weights[0])], 1)


def _valid_rows(real: torch.Tensor, kq: torch.Tensor, has_sep: bool, own: dict) -> torch.Tensor:
    """[B, Tq, len(ALL_STATISTICS)] float: the rows each statistic counts. Every real query row, but
    ``sep`` needs a sep token, ``norm_entropy`` two visible keys, and ``own`` gives the site kind's
    own rule (name -> [B, Tq] bool) for the others."""
    rows = real[:, :, None].expand(*real.shape, len(ALL_STATISTICS)).float().clone()
    if not has_sep:
        rows[..., INDEX["sep"]] = 0
    rows[..., INDEX["norm_entropy"]] = (real & (kq >= 2)).float()
    for name, mask in own.items():
        rows[..., INDEX[name]] = mask.float()
    return rows


def _row_weights(valid: torch.Tensor, kq: torch.Tensor) -> torch.Tensor:
    """The rows' weights in each statistic's sum: ``valid``, with 1 / ln k_i for ``norm_entropy``."""
    weights = valid.clone()
    weights[..., INDEX["norm_entropy"]] *= 1.0 / torch.log(kq.clamp(min=2))
    return weights


def _cross_weights(feats: TokenFeatures, keys: TokenFeatures, site: Site, i0: int, i1: int) -> ContractionWeights:
    """:func:`contraction_weights` of a cross-attention site: target rows i0..i1-1 of [B, T], source
    keys [B, S]."""
    real = feats.real[:, i0:i1]
    Tk = keys.real.shape[1]
    T = feats.real.sum(1).double()[:, None, None]  # real target tokens per row
    S = keys.real.sum(1).double()[:, None, None]  # real source tokens per row
    i = torch.arange(i0, i1, dtype=torch.float64)[None, :, None]
    j = torch.arange(Tk, dtype=torch.float64)[None, None, :]
    offset = (i * S / T - j).abs().float()  # [B, T, S]
    # d_i = round(i (S-1) / (T-1)), halves rounded up (torch.round would round them to even)
    diag = torch.where(T > 1, torch.floor(i * (S - 1) / (T - 1).clamp(min=1) + 0.5), torch.zeros(()))
    aligned = ((j - diag).abs() <= ALIGN_WINDOW).float()
    sep = keys.sep.float() if keys.has_sep else torch.zeros_like(keys.sep, dtype=torch.float32)
    key_w = _channels([(j[0] == 0).float().expand_as(sep), sep, keys.punct.float()])  # [B, 4, S]
    kq = visible_keys(site, keys.real.sum(1), i1 - i0).float()  # every real source key: S
    none = torch.zeros_like(real)  # self, prev, next and long are undefined here: count 0
    valid = _valid_rows(real, kq, keys.has_sep, {name: none for name in ("self", "prev", "next", "long")})
    return ContractionWeights(key_w, ("first", "sep", "punct"), (), torch.stack([offset, aligned], 2),
                              ("distance", "aligned"), _row_weights(valid, kq), real.float(), valid,
                              valid.sum((0, 1)).round().to(torch.int64))
