"""Distance between attention heads: the Jensen-Shannon divergence (docs/statistics.md), accumulated in
the same pass as the statistics.

Definition (docs/statistics.md, "Head distance and redundancy", after Clark et al. 2019, sec. 6): for heads
h and g of one model on the same tokens, the Jensen-Shannon divergence in bits (base 2, so in
[0, 1]) between row i of A_h and row i of A_g, for every real query row i, averaged
token-weighted over the corpus (each real row counts once)::

    JS(p, q) = H(m) - (H(p) + H(q)) / 2,   m = (p + q) / 2,   H(x) = -sum_j x_j log2 x_j

Each row's divergence is computed for every pair of heads at once (:func:`probe.patterns.jsd.row_js`).
The corpus mean is estimated from a fixed-seed sample of query rows per sequence
(:func:`probe.patterns.jsd.sample_rows`: ``sample_rows`` rows of each sequence, drawn by a generator
seeded with its corpus index; a shorter sequence is taken whole), each sequence weighted by its row
count, with the standard error of that estimate (:class:`probe.patterns.jsd.Estimate`); with
``sample_rows=None`` every row is taken and the error is 0. The mean over a corpus does not need
every row: the error is reported beside it (``layer_se``, ``model_se``; run.json).

Two accumulations run in one pass (decided here; the report says which applies where):

- per layer, the heads of each site over the whole corpus (``layer``: [sites, heads, heads]);
- over all heads of the model (for the 2-D map and the groups), on the query rows 0..``map_rows``-1
  of the sequences whose corpus index is below ``map_sequences`` (default: rows 0..63 of the first
  200 sequences; corpus order, not the length-sorted batch order, so the sample is not the shortest
  sequences), of which ``map_sample_rows`` rows per sequence are sampled. Every site's sampled rows
  are kept until the batch ends (heads x rows x keys floats).

Cells are the (query row, real key) pairs a row may see (keys after the query are skipped in causal
models; a key outside a sliding window has probability 0 and adds 0). Memory is independent of the
corpus length; partial results merge by addition. Row blocks (``rows=(i0, i1)``) give the same
result as whole maps: the sample is drawn per sequence, not per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..errors import InputError
from ..measures.accumulators import Accumulator
from ..rules import NEAR_DUPLICATE  # noqa: F401 (re-exported: the near-duplicate distance)
from ..sites import Site
from ..text.inputs import Batch
from .groups import head_groups
from .jsd import SEED, Estimate, folded_size, row_js, sample_rows, to_matrix

#: Defaults of the model-wide (map) accumulation: first sequences of the corpus, query rows of each.
MAP_SEQUENCES = 200
MAP_ROWS = 64
#: Query rows sampled per sequence by the default analysis (:func:`probe.patterns.pattern_accumulators`):
#: per layer, and for the model-wide map. :class:`HeadDistances` alone takes every row unless told.
SAMPLE_ROWS = 8
MAP_SAMPLE_ROWS = 4


@dataclass
class _Plan:
    """Which rows of one batch are sampled: [batch, T] bool masks and per-row counts (CPU)."""

    real: torch.Tensor  # [B, T] bool
    n: torch.Tensor  # [B] real rows
    layer: torch.Tensor  # [B, T] bool: rows in the per-layer sample
    k: torch.Tensor  # [B] rows sampled per layer
    map: torch.Tensor  # [B, T] bool: rows in the map sample
    map_n: torch.Tensor  # [B] candidate rows of the map (rows below map_rows of map sequences)
    map_k: torch.Tensor  # [B] rows sampled for the map


def _mask(rows_by_seq: list[np.ndarray], T: int) -> torch.Tensor:
    out = torch.zeros(len(rows_by_seq), T, dtype=torch.bool)
    for b, rows in enumerate(rows_by_seq):
        out[b, torch.from_numpy(rows)] = True
    return out


@dataclass
class DistanceResult:
    """What :class:`HeadDistances` measured.

    Attributes:
        layer: [sites, heads, heads] mean JS divergence (bits) between the heads of each site,
            over every real query row of the corpus (estimated from the row sample).
        layer_rows: [sites] real query rows per site (N of the mean).
        model: [sites * heads, sites * heads] mean JS divergence (bits) between all heads of the
            model (index = site * heads + head), over the map rows; None when not accumulated.
        model_rows: map rows (N of the model-wide mean: rows below ``map_rows`` of the map sequences).
        map_sequences, map_rows: the sample of the model-wide distance (sequences with corpus index
            below ``map_sequences``, their query rows below ``map_rows``).
        map_seen: sequences that contributed to ``model``.
        sites: the sites, in order.
        groups: :class:`~probe.patterns.groups.HeadGroups` from ``model`` (None without it).
        layer_se: [sites, heads, heads] standard error (bits) of ``layer`` from the row sample (0: every row taken).
        model_se: standard error (bits) of ``model`` (None without it).
        sample_rows, map_sample_rows: query rows sampled per sequence (None: every row).
    """

    layer: np.ndarray
    layer_rows: np.ndarray
    model: np.ndarray | None
    model_rows: int
    map_sequences: int
    map_rows: int
    map_seen: int
    sites: list[Site]
    groups: object = None
    layer_se: np.ndarray | None = None
    model_se: np.ndarray | None = None
    sample_rows: int | None = None
    map_sample_rows: int | None = None


class HeadDistances(Accumulator):
    """Jensen-Shannon divergence between heads (docs/statistics.md), per layer and model-wide, in one pass.

    Args:
        sites: the model's attention sites, in order.
        n_heads: query heads per site.
        map_sequences: sequences (by corpus index) in the model-wide distance; 0 turns it off.
        map_rows: query rows per sequence that may enter the model-wide distance (rows 0..map_rows-1).
        sample_rows: query rows sampled per sequence for the per-layer distance (None: every row, exact;
            :func:`probe.patterns.pattern_accumulators`, what ``probe analyze`` runs, samples
            :data:`SAMPLE_ROWS`).
        map_sample_rows: of rows 0..map_rows-1, how many are sampled for the model-wide distance (None: all;
            ``pattern_accumulators``: :data:`MAP_SAMPLE_ROWS`).
        seed: seed of the row samples (with each sequence's corpus index; the map's sample uses seed + 1).

    Raises:
        InputError: a sample size below 2 (its error could not be estimated).

    Cost: per batch and site, heads^2 / 2 x (sampled rows x keys) logarithms; at the end of each
    batch, (sites * heads)^2 / 2 x (map rows x keys) (``benchmarks/bench_floor.py``).
    """

    name = "distances"
    title = "head distances"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)
    row_blocks = True

    def __init__(self, sites: list[Site], n_heads: int, *, map_sequences: int = MAP_SEQUENCES,
                 map_rows: int = MAP_ROWS, sample_rows: int | None = None,
                 map_sample_rows: int | None = None, seed: int = SEED) -> None:
        for k in (sample_rows, map_sample_rows):
            if k is not None and int(k) < 2:
                raise InputError(f"rows sampled per sequence must be at least 2 (or None: every row), got {k}")
        self.sites = list(sites)
        self.n_heads = n_heads
        self.map_sequences = int(map_sequences)
        self.map_rows = int(map_rows)
        self.sample_rows = None if sample_rows is None else int(sample_rows)
        self.map_sample_rows = None if map_sample_rows is None else int(map_sample_rows)
        self.seed = int(seed)
        self._pos = {s: i for i, s in enumerate(self.sites)}
        S, H = len(self.sites), n_heads
        self.layer_est = Estimate((S,), folded_size(H))
        self.model_est = Estimate((), folded_size(S * H))
        self.m_seen = 0
        self._seq: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._map: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._groups = None

    @property
    def _settings(self) -> tuple:
        return (self.map_sequences, self.map_rows, self.sample_rows, self.map_sample_rows, self.seed)

    # -- per batch ----------------------------------------------------------------------------------

    def _plan(self, batch: Batch, T: int) -> _Plan:
        """The rows of this batch in each sample (computed once per batch and key length)."""
        def build():
            real = batch.real.cpu()[:, :T]
            n = real.sum(1)
            counts = list(zip(batch.index, n.tolist()))
            layer = [sample_rows(i, m, self.sample_rows, self.seed) for i, m in counts]
            cand = [min(m, self.map_rows) if i < self.map_sequences else 0 for i, m in counts]
            maps = [sample_rows(i, c, self.map_sample_rows, self.seed + 1) for i, c in zip(batch.index, cand)]
            return _Plan(real, n, _mask(layer, T), torch.tensor([len(r) for r in layer]), _mask(maps, T),
                         torch.tensor(cand), torch.tensor([len(r) for r in maps]))
        return batch.cached(("distance-plan", T, *self._settings), build)

    @staticmethod
    def _rows_of(chosen: torch.Tensor, probs: torch.Tensor, plan: _Plan, i0: int, causal: bool):
        """The chosen rows of a block: (batch row [R], query position [R], probabilities [R, T, heads]
        on the model's device, visible keys [R]: a prefix of the keys)."""
        b, r = chosen[:, i0:i0 + probs.shape[-2]].nonzero(as_tuple=True)
        dev = probs.device
        x = probs.detach()[b.to(dev), :, r.to(dev), :].transpose(1, 2)  # [R, T, heads]
        keys = plan.n[b]
        if causal:
            keys = torch.minimum(keys, r + i0 + 1)
        return b, r + i0, x, keys

    def begin_batch(self, batch: Batch) -> None:
        self._seq, self._map, self._now = {}, {}, None

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None,
               **_) -> None:
        """Fold in one site: ``probs`` [batch, heads, T, T] attention probabilities, or with ``rows=(i0, i1)``
        the query rows i0..i1-1 of them, [batch, heads, i1 - i0, T]."""
        self._update(site, probs, batch, 0 if rows is None else int(rows[0]))

    def _update(self, site: Site, probs: torch.Tensor, batch: Batch, i0: int) -> None:
        plan = self._now = self._plan(batch, probs.shape[-1])
        i = self._pos[site]
        b, _, x, keys = self._rows_of(plan.layer, probs, plan, i0, site.causal)
        if b.numel():
            js = row_js(x, keys).cpu()
            sums, sq = self._seq.setdefault(i, (torch.zeros(len(batch), js.shape[1], dtype=torch.float64),
                                                torch.zeros(len(batch), js.shape[1], dtype=torch.float64)))
            sums.index_add_(0, b, js)
            sq.index_add_(0, b, js * js)
        if self.map_sequences > 0:
            b, r, x, keys = self._rows_of(plan.map, probs, plan, i0, site.causal)
            if b.numel():
                self._map.setdefault(i, []).append((b, r, x, keys))  # kept until the batch ends
        self._groups = None

    def end_batch(self, batch: Batch) -> None:
        plan = self._now
        for i, (sums, sq) in self._seq.items():
            self.layer_est.add(i, sums, sq, plan.n, plan.k)
        if self._map:
            self._end_map(plan, len(batch))
        self._seq, self._map, self._now = {}, {}, None

    def _end_map(self, plan: _Plan, B: int) -> None:
        """The all-heads distance on this batch's map rows (every site's, stacked site-major)."""
        if len(self._map) != len(self.sites):
            raise RuntimeError("head distances: a site of this batch was not captured")
        parts = [self._map[i] for i in range(len(self.sites))]
        first = parts[0]
        b = torch.cat([p[0] for p in first])
        keys = torch.cat([p[3] for p in first])
        dev = first[0][2].device
        x = torch.cat([torch.cat([p[2].to(dev) for p in site], 0) for site in parts], -1)  # [R, T, sites * heads]
        js = row_js(x, keys).cpu()
        sums = torch.zeros(B, js.shape[1], dtype=torch.float64).index_add_(0, b, js)
        sq = torch.zeros(B, js.shape[1], dtype=torch.float64).index_add_(0, b, js * js)
        self.model_est.add((), sums, sq, plan.map_n, plan.map_k)
        self.m_seen += int((plan.map_k > 0).sum())

    # -- results ------------------------------------------------------------------------------------

    def merge(self, other: HeadDistances) -> HeadDistances:
        """Add another accumulator's sums (same sites, heads, map and sample settings) into this one.

        Raises:
            ValueError: different sites, head counts, map or sample settings.
        """
        if other.sites != self.sites or other.n_heads != self.n_heads or other._settings != self._settings:
            raise ValueError("cannot merge head distances of different models, map or sample settings")
        self.layer_est.merge(other.layer_est)
        self.model_est.merge(other.model_est)
        self.m_seen += other.m_seen
        self._groups = None
        return self

    def _model(self) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        if self.map_sequences <= 0:
            return None, None
        K = len(self.sites) * self.n_heads
        mean, se = self.model_est.mean_se()
        if self.m_rows == 0:
            return np.full((K, K), np.nan), np.full((K, K), np.nan)
        return to_matrix(mean, K), to_matrix(se, K)

    @property
    def m_rows(self) -> int:
        """Rows of the model-wide mean (N)."""
        return int(self.model_est.rows)

    def result(self) -> DistanceResult:
        """The mean distances (bits per row), per layer and model-wide, their standard errors, and the groups."""
        mean, se = self.layer_est.mean_se()
        layer, layer_se = to_matrix(mean, self.n_heads), to_matrix(se, self.n_heads)
        layer[self.layer_est.rows.numpy() == 0] = np.nan
        model, model_se = self._model()
        return DistanceResult(layer, self.layer_est.rows.numpy().copy(), model,
                              self.m_rows, self.map_sequences, self.map_rows, self.m_seen, list(self.sites),
                              self.groups(), layer_se, model_se, self.sample_rows,
                              self.map_sample_rows)

    def groups(self):
        """:class:`~probe.patterns.groups.HeadGroups` of all heads from the model-wide distance (computed
        once per state), or None when the model-wide distance was off or saw no row."""
        if self._groups is None and self.map_sequences > 0 and self.m_rows > 0:
            self._groups = head_groups(self._model()[0])
        return self._groups

    def columns(self):
        """``group`` per head for ``heads.csv`` (replacing the k-means ``cluster``), or None."""
        groups = self.groups()
        if groups is None:
            return None
        S, H = len(self.sites), self.n_heads
        return pd.DataFrame({"layer": np.repeat([s.layer for s in self.sites], H), "head": np.tile(np.arange(H), S),
                             "group": groups.group})
