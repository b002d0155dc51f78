"""Per-head attention statistics (defined in docs/statistics.md), as an accumulator.

Definitions follow Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Kovaleva et al.
2019 and Voita et al. 2019; the exact per-row definitions are in the docstring of
:func:`probe.measures.statweights.contraction_weights`. Corpus values are token-weighted means over real
query rows, kept as running sums and counts (:class:`HeadStatistics`) so memory does not grow with
the corpus and partial results merge across batches, processes or machines.

Every statistic is also computed, by the same code (:func:`map_sums`), on the value-weighted map
N~ of Kobayashi et al. 2020 (:mod:`probe.measures.values`): the column ``<statistic>_by_norm``, with
``norm_mass``, the mean norm of the head's output.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..loading.seq2seq import sides
from ..sites import Site
from ..text.inputs import Batch
from .accumulators import Accumulator, sum_device
from .statweights import (  # re-exported: the statistics' names and definitions
    ALIGN_WINDOW,
    ALL_STATISTICS,
    CROSS_STATISTICS,
    INDEX,
    LINEAR,
    LONG_RANGE,
    STATISTICS,
    ContractionWeights,
    TokenFeatures,
    boundary_token_id,
    contraction_weights,
    token_features,
)
from .values import ValueNorms, norm_weighted

__all__ = [
    "ALIGN_WINDOW", "ALL_STATISTICS", "BY_NORM", "CROSS_STATISTICS", "LINEAR", "LONG_RANGE", "NORM_MASS",
    "STATISTICS", "ContractionWeights", "HeadStatistics", "TokenFeatures", "boundary_token_id", "by_norm",
    "contraction_weights", "map_sums", "token_features",
]

#: Suffix of a statistic computed on the value-weighted map N~ (``first_by_norm``).
BY_NORM = "_by_norm"
#: Column of the mean norm of a head's output, ||sum_j A[i, j] f_h(x_j)|| (hidden-state units).
NORM_MASS = "norm_mass"


def by_norm(name: str) -> str:
    """The column of statistic ``name`` computed on the value-weighted map (``first`` -> ``first_by_norm``)."""
    return name + BY_NORM


def map_sums(a: torch.Tensor, w: ContractionWeights) -> torch.Tensor:
    """Every statistic's sum over the valid rows of one batch of maps (or of one row block of them):
    [heads, len(ALL_STATISTICS)] float64 on ``a``'s device (the CPU for an MPS device, which has no
    float64: :func:`probe.measures.accumulators.sum_device`; a statistic the site's kind lacks: 0).

    The one implementation of the statistics: applied to attention probabilities and to the
    value-weighted map alike. Each query row's value of every statistic is computed in float32
    (a matrix product with the per-key weights, diagonals, per-row weight vectors, the row's
    -sum A ln A and its max: :class:`~probe.measures.statweights.ContractionWeights`), then the rows are
    added in float64 with their weights: row blocks give the same per-row values as whole maps, and
    a long map's sum does not lose digits. Padded query rows are set to 0 before any sum, whatever
    they hold (a half-precision model returns them uniform; a fully masked row may be NaN).

    Args:
        a: [batch, heads, query, key] float32 maps whose real rows sum to 1 (or are all 0); maps of
            a half-precision model are converted to float32 by the caller, before any statistic.
        w: the batch's :class:`~probe.measures.statweights.ContractionWeights`, on ``a``'s device.
    """
    B, H, R, K = a.shape
    vals = torch.zeros(B, H, R, len(ALL_STATISTICS), dtype=torch.float32, device=a.device)
    by_key = torch.matmul(a.reshape(B, H * R, K), w.keys).view(B, H, R, -1)  # [B, H, rows, key channels]
    for c, name in enumerate(w.key_names):
        vals[..., INDEX[name]] = by_key[..., c]
    for name, offset in w.diagonals:
        vals[..., INDEX[name]] = _diagonal(a, offset)
    if w.pos_names:
        by_row = torch.einsum("bhrk,brck->bhrc", a, w.positional)  # [B, H, rows, positional channels]
        for c, name in enumerate(w.pos_names):
            vals[..., INDEX[name]] = by_row[..., c]
    entropy, top = _row_entropy_and_max(a)
    vals[..., INDEX["entropy"]] = entropy
    vals[..., INDEX["norm_entropy"]] = entropy
    vals[..., INDEX["max_weight"]] = top
    vals.masked_fill_(w.real_rows[:, None, :, None] == 0, 0.0)  # padded rows: out before any sum
    dev = sum_device(a.device)
    return torch.einsum("bhrc,brc->hc", vals.to(dev, torch.float64), w.row_weights.to(dev, torch.float64))


#: Maps of at most this many probabilities (batch x heads x rows x keys: 16 MiB of float32) have
#: their attention and value-weighted statistics summed in one :func:`map_sums` call on the two maps
#: stacked along the heads (the per-call operations dominate a short map's cost); larger ones in two.
JOINT_SUMS = 2 ** 22

#: :func:`_row_entropy_and_max` works on this many probabilities at a time (4 MiB of float32: its
#: passes over a chunk stay in the processor's cache).
CHUNK = 2 ** 20


def _row_entropy_and_max(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-sum_j A ln A (nats, 0 ln 0 = 0) and max_j A of every row of [..., keys] maps: two tensors
    of shape ``a.shape[:-1]``. ln A is taken of max(A, the smallest normal float) (a third of
    ``torch.special.entr``'s time), a chunk of rows at a time in one reused buffer."""
    K = a.shape[-1]
    flat = a.reshape(-1, K)
    entropy = torch.empty(flat.shape[0], dtype=a.dtype, device=a.device)
    top = torch.empty_like(entropy)
    step = max(1, CHUNK // max(K, 1))
    buf = torch.empty(min(step, flat.shape[0]), K, dtype=a.dtype, device=a.device)
    tiny = torch.finfo(a.dtype).tiny
    for r0 in range(0, flat.shape[0], step):
        x = flat[r0:r0 + step]
        t = buf[:x.shape[0]]
        torch.clamp_min(x, tiny, out=t)
        t.log_().mul_(x)
        torch.sum(t, -1, out=entropy[r0:r0 + step])
        torch.amax(x, -1, out=top[r0:r0 + step])
    return entropy.neg_().view(a.shape[:-1]), top.view(a.shape[:-1])


def _diagonal(a: torch.Tensor, offset: int) -> torch.Tensor:
    """[batch, heads, rows] A[r, r + offset] of [batch, heads, rows, keys] maps (0 where r + offset
    is not a key)."""
    R, K = a.shape[-2:]
    out = a.new_zeros(a.shape[:-1])
    r0, r1 = max(0, -offset), min(R, K - offset)
    if r1 > r0:
        out[..., r0:r1] = torch.diagonal(a, offset=offset, dim1=-2, dim2=-1)[..., :r1 - r0]
    return out


def _means(sums: torch.Tensor, counts: torch.Tensor) -> np.ndarray:
    """sums / counts, NaN where the count is 0 (``counts`` broadcast to ``sums``)."""
    counts = counts.double().expand_as(sums)
    means = sums / counts.clamp(min=1)
    means[counts == 0] = float("nan")
    return means.numpy()


#: Block capture: the contraction weights of every block of a map are kept for the next sites
#: when all of them together take at most this many bytes (else each block's are built and let go); their
#: size is that of the per-row weight vectors, [batch, rows, 2, keys] float32..
WEIGHT_CACHE_BYTES = 2 ** 28


class HeadStatistics(Accumulator):
    """Running sums and counts of every statistic for every (site, head).

    ``sums`` is [sites, heads, statistics] float64 and ``counts`` [sites, statistics] int64 (every
    head of a site sees the same rows). Corpus values (:meth:`means`) are sums / counts, the
    token-weighted mean over real query rows. Instances merge with :meth:`merge`.

    With ``value_weighted``, the same statistics of the value-weighted map N~ (:mod:`probe.measures.values`)
    are kept in ``norm_sums`` [sites, heads, statistics] and ``norm_counts`` (per head: a row
    whose value-weighted map is all 0 is left out of that head's counts), and the norm of each head's
    output in ``mass_sums`` [sites, heads] (counted over every real query row).

    Args:
        sites: the model's attention sites (``lm.sites``), in order.
        n_heads: query heads per site.
        tokenizer: the model's tokenizer (its sep token, and token surfaces where offsets are missing).
        value_weighted: also keep the value-weighted statistics (:meth:`update` then needs the site's
            :class:`~probe.measures.values.ValueNorms`, which :func:`probe.runs.analysis.run` hands it).
    """

    name = "statistics"
    title = "per-head statistics"
    transient = ("tokenizer",)
    row_blocks = True
    on_device = ("sums", "norm_sums", "norm_counts", "mass_sums")

    def __init__(self, sites: list[Site], n_heads: int, tokenizer=None, value_weighted: bool = False) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.tokenizer = tokenizer
        self.value_weighted = value_weighted
        self._row = {site: i for i, site in enumerate(self.sites)}
        S, n = len(self.sites), len(ALL_STATISTICS)
        self.sums = torch.zeros(S, n_heads, n, dtype=torch.float64)
        self.counts = torch.zeros(S, n, dtype=torch.int64)
        if value_weighted:
            self.norm_sums = torch.zeros(S, n_heads, n, dtype=torch.float64)
            self.norm_counts = torch.zeros(S, n_heads, n, dtype=torch.int64)
            self.mass_sums = torch.zeros(S, n_heads, dtype=torch.float64)

    @property
    def reads_values(self) -> bool:
        """:func:`probe.runs.analysis.run` hands :meth:`update` the site's value norms."""
        return self.value_weighted

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

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, values: ValueNorms | None = None,
               rows: tuple[int, int] | None = None) -> None:
        """Add one batch of one site: ``probs`` is [batch, heads, query, key] attention probabilities
        (queries and keys of the site's sides: :func:`probe.loading.seq2seq.sides`); ``values`` the site's
        value norms (needed with ``value_weighted``; [batch, heads, key] and [batch, heads, query]).
        With ``rows`` = (i0, i1) (block capture), probs and ``values.mass`` hold query rows i0..i1-1
        only; the sums of a site's blocks are those of its whole map.

        Raises:
            ValueError: value-weighted statistics without ``values``.
        """
        queries, keys = sides(site, batch)
        eos = self.encoder_decoder
        feats = token_features(queries, self.tokenizer, eos)
        key_feats = token_features(keys, self.tokenizer, eos) if site.kind == "cross" else None
        a = probs.float()
        B, _, Tq, Tk = a.shape
        T = Tq if rows is None else queries.input_ids.shape[1]  # query rows of the whole map
        nk = Tk
        if rows is not None and site.causal and site.kind != "cross":  # later keys: probability exactly 0
            nk = Tk - (T - rows[1])
            a = a[..., :nk]
        key = ("contraction", site.kind, site.causal, site.window, Tq, Tk, rows, str(a.device))

        def build() -> ContractionWeights:
            return contraction_weights(feats, site, Tk if site.kind != "cross" else T, key_feats, rows,
                                       None if nk == Tk else nk).to(a.device)

        # whole maps, or blocks whose weights for every row of the map fit WEIGHT_CACHE_BYTES: shared by the
        # sites; larger ones are built per block and let go (never [T, 2, T] for a long map)
        w = queries.cached(key, build) if rows is None or B * T * Tk * 2 * 4 <= WEIGHT_CACHE_BYTES else build()
        i = self._row[site]
        self.follow(a.device)
        self.counts[i] += w.counts
        dev = self.sums.device
        if not self.value_weighted:
            self.sums[i] += map_sums(a, w).to(dev)
            return
        if values is None:
            raise ValueError(f"value-weighted statistics of {site.name} need its value norms (probe.runs.analysis.run "
                             "hands them to an accumulator that reads values)")
        H = a.shape[1]
        if a.numel() <= JOINT_SUMS:  # a short map: A and N~ side by side in one call (half the small operations)
            both = a.new_empty(B, 2 * H, *a.shape[2:])
            both[:, :H] = a
            _, empty = norm_weighted(a, values.norms[..., :nk], out=both[:, H:])  # N~ written in place
            sums = map_sums(both, w).to(dev)
            self.sums[i] += sums[:H]
            self.norm_sums[i] += sums[H:]
            del both
        else:  # a long map or block: no joint copy
            tilde, empty = norm_weighted(a, values.norms[..., :nk])
            self.sums[i] += map_sums(a, w).to(dev)
            self.norm_sums[i] += map_sums(tilde, w).to(dev)
            del tilde
        self.norm_counts[i] += w.counts[None, :].to(dev)
        # rows with no value-weighted map: out of that head's counts (no host sync to ask whether any)
        self.norm_counts[i] -= torch.einsum("bhq,bqs->hs", empty.float(), w.rows).round().to(dev, torch.int64)
        mass = torch.where(w.real_rows[:, None, :] > 0, values.mass.float(), 0.0)  # padded rows out before the sum
        self.mass_sums[i] += mass.to(dev, torch.float64).sum((0, 2))

    def merge(self, other: HeadStatistics) -> HeadStatistics:
        """Add another accumulator's sums and counts into this one (in place); returns self.

        Raises:
            ValueError: the other has different sites or head counts, or one is value-weighted and
                the other not.
        """
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge statistics of models with different sites or head counts")
        if other.value_weighted != self.value_weighted:
            raise ValueError("cannot merge statistics with and without value-weighted statistics")
        self.sums += other.sums.to(self.sums.device)
        self.counts += other.counts
        if self.value_weighted:
            self.norm_sums += other.norm_sums.to(self.norm_sums.device)
            self.norm_counts += other.norm_counts.to(self.norm_counts.device)
            self.mass_sums += other.mass_sums.to(self.mass_sums.device)
        return self

    def means(self) -> np.ndarray:
        """[sites, heads, statistics] corpus values (:data:`ALL_STATISTICS` order); NaN where a
        statistic had no defined row."""
        return _means(self.sums.cpu(), self.counts[:, None, :])

    def means_by_norm(self) -> np.ndarray:
        """[sites, heads, statistics] corpus values of the value-weighted map N~ (:data:`ALL_STATISTICS`
        order); NaN where a head had no defined row.

        Raises:
            ValueError: kept without ``value_weighted``.
        """
        if not self.value_weighted:
            raise ValueError("these statistics were kept without value-weighted statistics")
        return _means(self.norm_sums.cpu(), self.norm_counts.cpu())

    def norm_mass(self) -> np.ndarray:
        """[sites, heads] mean over real query rows of ||sum_j A[i, j] f_h(x_j)|| (hidden-state units).

        Raises:
            ValueError: kept without ``value_weighted``.
        """
        if not self.value_weighted:
            raise ValueError("these statistics were kept without value-weighted statistics")
        return _means(self.mass_sums.cpu(), self.counts[:, None, INDEX["entropy"]])  # every real query row

    def result(self) -> pd.DataFrame:
        """One row per head: columns ``layer``, ``head`` and one per statistic (:attr:`statistics`);
        value-weighted, then one ``<statistic>_by_norm`` per statistic and ``norm_mass``. An
        encoder-decoder model's rows also have ``stack`` and ``kind`` (first), its layers counted
        within each stack."""
        n = len(self.statistics)
        blocks, columns = [self.means()[:, :, :n]], list(self.statistics)
        if self.value_weighted:
            blocks += [self.means_by_norm()[:, :, :n], self.norm_mass()[:, :, None]]
            columns += [by_norm(s) for s in self.statistics] + [NORM_MASS]
        means = np.concatenate(blocks, axis=-1)
        S, H, _ = means.shape
        frame = pd.DataFrame(means.reshape(S * H, -1), columns=columns)
        frame.insert(0, "head", np.tile(np.arange(H), S))
        frame.insert(0, "layer", np.repeat([s.layer for s in self.sites], H))
        if self.encoder_decoder:
            frame.insert(0, "kind", np.repeat([s.kind for s in self.sites], H))
            frame.insert(0, "stack", np.repeat([s.stack for s in self.sites], H))
        return frame
