"""Per-head attention statistics (defined in docs/statistics.md), as an accumulator.

Definitions follow Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Kovaleva et al.
2019 and Voita et al. 2019; the exact per-row definitions are in the docstring of
:func:`contraction_weights`. Corpus values are token-weighted means over real query rows, kept as
running sums and counts (:class:`HeadStatistics`) so memory does not grow with the corpus and
partial results merge across batches, processes or machines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .accumulators import Accumulator
from .inputs import Batch
from .seq2seq import sides
from .sites import Site, visible_keys
from .tokens import punctuation_mask

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
_INDEX = {name: i for i, name in enumerate(ALL_STATISTICS)}


@dataclass
class ContractionWeights:
    """Per-batch weights turning one site's probabilities into statistic sums by contraction.

    Attributes:
        linear: [batch, Tq*Tk, len(names)]: weight of A[b, :, q, k] in each linear statistic's sum
            over valid rows (row validity folded in).
        entropy: [batch, Tq*Tk, 2]: weights of -A ln A for ``entropy`` and ``norm_entropy``
            (the latter 1 / ln k_q on rows with k_q >= 2).
        real_rows: [batch, Tq] float, 1 on real query rows (for ``max_weight``).
        counts: [len(ALL_STATISTICS)] int64 valid rows per statistic.
        names: the linear statistics of ``linear``'s channels, in order (those of :data:`LINEAR`
            the site's kind defines: a self-attention site has no ``aligned`` channel).
    """

    linear: torch.Tensor
    entropy: torch.Tensor
    real_rows: torch.Tensor
    counts: torch.Tensor
    names: tuple[str, ...] = LINEAR

    def to(self, device) -> ContractionWeights:
        """The weights on ``device`` (the device of the layer whose probabilities they reduce);
        ``counts`` stay on the CPU."""
        return ContractionWeights(self.linear.to(device), self.entropy.to(device), self.real_rows.to(device),
                                  self.counts, self.names)


def contraction_weights(feats: TokenFeatures, site: Site, T: int,
                        keys: TokenFeatures | None = None) -> ContractionWeights:
    """The weights used by :meth:`HeadStatistics.update` for one batch and one kind of site.

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

    Each of these except ``max_weight`` is a weighted sum of the row's A (or of -A ln A), so its sum
    over the valid rows of a batch is A contracted with one weight tensor, built once per batch for
    all sites that share the same visible keys.
    """
    if site.kind == "cross":
        if keys is None:
            raise ValueError("a cross-attention site needs the features of its keys (the source)")
        return _cross_weights(feats, keys, site)
    real = feats.real
    pos = torch.arange(T)
    lengths = real.sum(1)
    realf = real.float()
    q, k = pos[:, None], pos[None, :]
    offset = (q - k).abs().float()  # [T, T]
    sep = feats.sep.float()
    far = ((q - k).abs() > LONG_RANGE)[None] & (pos != 0)[None, None, :] & ~feats.sep[:, None, :]
    next_rows = torch.zeros_like(real) if site.causal else real & (pos[None, :] <= lengths[:, None] - 2)
    row = realf[:, :, None]  # [B, T(query), 1]
    chans = {
        "self": (q == k).float()[None] * row,
        "prev": (k == q - 1).float()[None] * row,
        "next": (k == q + 1).float()[None] * next_rows.float()[:, :, None],
        "first": (k == 0).float()[None] * row,
        "sep": sep[:, None, :] * (row if feats.has_sep else torch.zeros_like(row)),
        "punct": feats.punct.float()[:, None, :] * row,
        "distance": offset[None] * row,
        "long": far.float() * row,
    }
    kq = visible_keys(site, lengths, T).float()  # [B, T]
    counts = _row_counts(real, kq, feats.has_sep)
    counts[_INDEX["prev"]] = int((real & (pos >= 1)).sum())
    counts[_INDEX["next"]] = int(next_rows.sum())
    counts[_INDEX["aligned"]] = 0
    return _pack(chans, realf, kq, T, counts)


def _row_counts(real: torch.Tensor, kq: torch.Tensor, has_sep: bool) -> torch.Tensor:
    """Valid rows per statistic: every real query row, but ``sep`` needs a sep token and
    ``norm_entropy`` two visible keys."""
    counts = torch.full((len(ALL_STATISTICS),), int(real.sum()), dtype=torch.int64)
    counts[_INDEX["sep"]] = counts[0] if has_sep else 0
    counts[_INDEX["norm_entropy"]] = int((real & (kq >= 2)).sum())
    return counts


def _pack(chans: dict, realf: torch.Tensor, kq: torch.Tensor, n_keys: int, counts) -> ContractionWeights:
    """Stack the per-statistic weights into :class:`ContractionWeights` (``kq`` [B, Tq] visible keys)."""
    B, Tq = realf.shape
    names = tuple(n for n in LINEAR if n in chans)
    linear = torch.stack([chans[n].expand(B, Tq, n_keys) for n in names], -1).reshape(B, Tq * n_keys, len(names))
    inv_log_k = torch.where(kq >= 2, 1.0 / torch.log(kq.clamp(min=2)), torch.zeros(())) * realf
    ent = torch.stack([realf[:, :, None].expand(B, Tq, n_keys), inv_log_k[:, :, None].expand(B, Tq, n_keys)], -1)
    return ContractionWeights(linear.contiguous(), ent.reshape(B, Tq * n_keys, 2).contiguous(), realf, counts, names)


def _cross_weights(feats: TokenFeatures, keys: TokenFeatures, site: Site) -> ContractionWeights:
    """:func:`contraction_weights` of a cross-attention site: target rows [B, T], source keys [B, S]."""
    real, realf = feats.real, feats.real.float()
    B, Tq = real.shape
    Tk = keys.real.shape[1]
    T = real.sum(1).double()[:, None, None]  # real target tokens per row
    S = keys.real.sum(1).double()[:, None, None]  # real source tokens per row
    i = torch.arange(Tq, dtype=torch.float64)[None, :, None]
    j = torch.arange(Tk, dtype=torch.float64)[None, None, :]
    offset = (i * S / T - j).abs().float()  # [B, T, S]
    # d_i = round(i (S-1) / (T-1)), halves rounded up (torch.round would round them to even)
    diag = torch.where(T > 1, torch.floor(i * (S - 1) / (T - 1).clamp(min=1) + 0.5), torch.zeros(()))
    aligned = ((j - diag).abs() <= ALIGN_WINDOW).float()
    row = realf[:, :, None]
    chans = {  # self, prev, next and long are undefined here: no channel, count 0
        "first": (j == 0).float() * row,
        "sep": keys.sep.float()[:, None, :] * (row if keys.has_sep else torch.zeros_like(row)),
        "punct": keys.punct.float()[:, None, :] * row,
        "distance": offset * row,
        "aligned": aligned * row,
    }
    kq = visible_keys(site, keys.real.sum(1), Tq).float()  # every real source key: S
    counts = _row_counts(real, kq, keys.has_sep)
    for name in ("self", "prev", "next", "long"):
        counts[_INDEX[name]] = 0
    return _pack(chans, realf, kq, Tk, counts)


class HeadStatistics(Accumulator):
    """Running sums and counts of every statistic for every (site, head).

    ``sums`` is [sites, heads, statistics] float64 and ``counts`` [sites, statistics] int64 (every
    head of a site sees the same rows). Corpus values (:meth:`means`) are sums / counts, the
    token-weighted mean over real query rows. Instances merge with :meth:`merge`.

    Args:
        sites: the model's attention sites (``lm.sites``), in order.
        n_heads: query heads per site.
        tokenizer: the model's tokenizer (its sep token, and token surfaces where offsets are missing).
    """

    name = "statistics"
    title = "per-head statistics"
    transient = ("tokenizer",)

    def __init__(self, sites: list[Site], n_heads: int, tokenizer=None) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.tokenizer = tokenizer
        self._row = {site: i for i, site in enumerate(self.sites)}
        self.sums = torch.zeros(len(self.sites), n_heads, len(ALL_STATISTICS), dtype=torch.float64)
        self.counts = torch.zeros(len(self.sites), len(ALL_STATISTICS), dtype=torch.int64)

    @property
    def encoder_decoder(self) -> bool:
        """The sites are those of an encoder-decoder model (it has cross-attention)."""
        return any(s.kind == "cross" for s in self.sites)

    @property
    def statistics(self) -> tuple[str, ...]:
        """The statistics of :meth:`result`: :data:`STATISTICS`, and :data:`CROSS_STATISTICS` for an
        encoder-decoder model."""
        return ALL_STATISTICS if self.encoder_decoder else STATISTICS

    @property
    def n_sites(self) -> int:
        """Attention sites measured (layers of a one-stack model; every stack and kind of an
        encoder-decoder model)."""
        return len(self.sites)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        """Add one batch of one site: ``probs`` is [batch, heads, query, key] attention probabilities
        (queries and keys of the site's sides: :func:`probe.seq2seq.sides`).

        Every statistic except ``max_weight`` is linear in A (or in A ln A), so its sum over valid
        rows is one contraction of A with a per-batch weight tensor (:func:`contraction_weights`).
        """
        queries, keys = sides(site, batch)
        eos = self.encoder_decoder
        feats = token_features(queries, self.tokenizer, eos)
        key_feats = token_features(keys, self.tokenizer, eos) if site.kind == "cross" else None
        a = probs.float()
        B, H, Tq, Tk = a.shape
        dev = a.device
        w = queries.cached(("contraction", site.kind, site.causal, site.window, Tq, Tk, str(dev)),  # once per batch
                           lambda: contraction_weights(feats, site, Tq, key_feats).to(dev))
        flat = a.reshape(B, H, Tq * Tk)
        linear = torch.bmm(flat, w.linear).sum(0)  # [heads, len(w.names)]
        # entr(x) = -x ln x with entr(0) = 0 (about twice as fast as xlogy on CPU)
        ent = torch.bmm(torch.special.entr(a).reshape(B, H, Tq * Tk), w.entropy).sum(0)  # [heads, 2]
        mx = (a.amax(-1) * w.real_rows[:, None, :]).sum((0, 2))  # [heads]
        sums = torch.zeros(H, len(ALL_STATISTICS), dtype=torch.float64)  # a statistic the kind lacks: 0, count 0
        for c, name in enumerate(w.names):
            sums[:, _INDEX[name]] = linear[:, c].double().cpu()
        sums[:, _INDEX["entropy"]] = ent[:, 0].double().cpu()
        sums[:, _INDEX["norm_entropy"]] = ent[:, 1].double().cpu()
        sums[:, _INDEX["max_weight"]] = mx.double().cpu()
        i = self._row[site]
        self.sums[i] += sums
        self.counts[i] += w.counts

    def merge(self, other: HeadStatistics) -> HeadStatistics:
        """Add another accumulator's sums and counts into this one (in place); returns self.

        Raises:
            ValueError: the other has different sites or head counts.
        """
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge statistics of models with different sites or head counts")
        self.sums += other.sums
        self.counts += other.counts
        return self

    def means(self) -> np.ndarray:
        """[sites, heads, statistics] corpus values (:data:`ALL_STATISTICS` order); NaN where a
        statistic had no defined row."""
        counts = self.counts[:, None, :].double()
        means = self.sums / counts.clamp(min=1)
        means[(counts == 0).expand_as(means)] = float("nan")
        return means.numpy()

    def result(self) -> pd.DataFrame:
        """One row per head: columns ``layer``, ``head`` and one per statistic (:attr:`statistics`);
        an encoder-decoder model's rows also have ``stack`` and ``kind`` (first), its layers counted
        within each stack."""
        means = self.means()[:, :, : len(self.statistics)]
        S, H, _ = means.shape
        frame = pd.DataFrame(means.reshape(S * H, -1), columns=list(self.statistics))
        frame.insert(0, "head", np.tile(np.arange(H), S))
        frame.insert(0, "layer", np.repeat([s.layer for s in self.sites], H))
        if self.encoder_decoder:
            frame.insert(0, "kind", np.repeat([s.kind for s in self.sites], H))
            frame.insert(0, "stack", np.repeat([s.stack for s in self.sites], H))
        return frame
