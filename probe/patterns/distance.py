"""Distance between attention heads: the Jensen-Shannon divergence (docs/statistics.md), accumulated in
the same pass as the statistics.

Definition (docs/statistics.md, "Head distance and redundancy", after Clark et al. 2019, sec. 6): for heads
h and g of one model on the same tokens, the Jensen-Shannon divergence in bits (base 2, so in
[0, 1]) between row i of A_h and row i of A_g, for every real query row i, averaged
token-weighted over the corpus (each real row counts once)::

    JS(p, q) = H(m) - (H(p) + H(q)) / 2,   m = (p + q) / 2,   H(x) = -sum_j x_j log2 x_j

Every term is a sum over the cells (query row, key) of one batch, so the corpus sum of JS over rows
is three running sums (:class:`HeadDistances` keeps them, float64):

- ``ent[h]``   = sum over cells of -p ln p (nats; the sum of the rows' entropies);
- ``mass[h]``  = sum over cells of p (the number of rows, up to rounding: each real row sums to 1);
- ``cross[h, g]`` = sum over cells of (p + q) ln(p + q);

and sum over rows of H(m) in nats = -cross / 2 + ln 2 * (mass[h] + mass[g]) / 2. Memory is
independent of the corpus length; partial results merge by addition.

Two accumulations run in one pass (decided here; the report says which applies where):

- per layer, the heads of each site over the whole corpus (``layer``: [sites, heads, heads]);
- over all heads of the model (for the 2-D map and the groups), on the query rows 0..``map_rows``-1
  of the sequences whose corpus index is below ``map_sequences`` (default: rows 0..63 of the first
  200 sequences; corpus order, not the length-sorted batch order, so the sample is not the shortest
  sequences). The row cap bounds the memory of one batch (every site's cells are kept until the
  batch ends: heads x cells floats) whatever the sequence length.

Cells are the (real query row, real key) pairs a row may see (keys after the query are skipped in
causal models; a key outside a sliding window has probability 0 and adds 0).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..accumulators import Accumulator
from ..inputs import Batch
from ..sites import Site
from .groups import head_groups

LN2 = math.log(2.0)

#: Heads of one layer closer than this (bits) are near-duplicates: the health check's
#: ``duplicates`` and pruning's redundancy both read it here.
NEAR_DUPLICATE = 0.05

#: Defaults of the model-wide (map) accumulation: first sequences of the corpus, query rows of each.
MAP_SEQUENCES = 200
MAP_ROWS = 64

#: Cells per chunk of the pairwise loop (two [heads, chunk] float32 buffers stay in the CPU cache).
CHUNK_CELLS = 4096
#: Added to every probability in the pairwise sums so that p + q > 0 (a 0 then gives 2e-30 ln 2e-30,
#: about -1e-28, instead of 0 ln 0 = NaN): below float32 resolution of any sum of real rows.
TINY = 1e-30


@contextmanager
def _one_cpu_thread(device: torch.device):
    """Run the pairwise loop on one CPU thread (restored afterwards). Its operations are small (about a
    millisecond each), so a second thread gains little, and on a machine whose cores are busy each
    multi-threaded operation waits for a descheduled thread: measured on two shared cores at load 4,
    0.7 s on one thread against 1.8-22 s on two for 270 heads x 4,600 cells."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pair_sums(x: torch.Tensor, chunk: int = CHUNK_CELLS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The running-sum terms of the Jensen-Shannon divergence for every pair of rows of ``x``.

    Args:
        x: [heads, cells] attention probabilities of each head on the same cells (query row, key).

    Returns:
        ``cross`` [heads, heads] float64: sum over cells of (p + q) ln(p + q) (upper triangle and its
        mirror; the diagonal is left 0 and never used), ``ent`` [heads] float64: sum of -p ln p
        (nats), ``mass`` [heads] float64: sum of p; on the device of ``x``.

    Cost: heads^2 / 2 x cells elementwise sums, ln and products (about 4 ns per pair and cell on
    one CPU core), in 2 x heads small operations per chunk of cells; on CPU they run on one thread
    (:func:`_one_cpu_thread`).
    """
    with _one_cpu_thread(x.device):
        return _pair_sums(x, chunk)


def _pair_sums(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    K, N = x.shape
    x = x.float()
    cross = torch.zeros(K, K, dtype=torch.float64, device=x.device)
    ent = torch.special.entr(x).sum(-1, dtype=torch.float64)
    mass = x.sum(-1, dtype=torch.float64)
    if K < 2:
        return cross, ent, mass
    # ln and a dot product into reused buffers: 2.4x faster than xlogy(m, m).sum(-1) on CPU
    buf, logs = torch.empty(K - 1, min(chunk, N), device=x.device), torch.empty(K - 1, min(chunk, N), device=x.device)
    acc = torch.zeros(K, K, dtype=torch.float32, device=x.device)
    for c0 in range(0, N, chunk):
        xc = x[:, c0:c0 + chunk] + TINY  # [K, w]
        w = xc.shape[1]
        for i in range(K - 1):
            m = torch.add(xc[i:i + 1], xc[i + 1:], out=buf[:K - 1 - i, :w])  # [K - i - 1, w] = p + q
            ln = torch.log(m, out=logs[:K - 1 - i, :w])
            acc[i, i + 1:] += torch.linalg.vecdot(m, ln)  # sum over the chunk of (p + q) ln(p + q)
        if (c0 // chunk) % 16 == 15:  # fold into float64 every 16 chunks (float32 sums stay short)
            cross += acc.double()
            acc.zero_()
    cross += acc.double()
    cross = cross + cross.T
    return cross, ent, mass


def js_from_sums(cross: np.ndarray, ent: np.ndarray, mass: np.ndarray, rows: int) -> np.ndarray:
    """[heads, heads] mean Jensen-Shannon divergence per row (bits) from :func:`pair_sums` totals.

    NaN everywhere when ``rows`` is 0. Values are clipped to [0, 1] (float rounding can leave
    -1e-9 on identical heads); the diagonal is exactly 0.
    """
    K = ent.shape[-1]
    if rows == 0:
        return np.full((K, K), np.nan)
    h_m = -cross / 2 + LN2 * (mass[:, None] + mass[None, :]) / 2  # sum over rows of H(m), nats
    js = (h_m - (ent[:, None] + ent[None, :]) / 2) / LN2 / rows
    js = np.clip(js, 0.0, 1.0)
    np.fill_diagonal(js, 0.0)
    return js


@dataclass
class DistanceResult:
    """What :class:`HeadDistances` measured.

    Attributes:
        layer: [sites, heads, heads] mean JS divergence (bits) between the heads of each site,
            over every real query row of the corpus.
        layer_rows: [sites] rows counted per site.
        model: [sites * heads, sites * heads] mean JS divergence (bits) between all heads of the
            model (index = site * heads + head), over the map rows; None when not accumulated.
        model_rows: rows counted for ``model``.
        map_sequences, map_rows: the sample of the model-wide distance (sequences with corpus index
            below ``map_sequences``, their query rows below ``map_rows``).
        map_seen: sequences that contributed to ``model``.
        sites: the sites, in order.
        groups: :class:`~probe.patterns.groups.HeadGroups` from ``model`` (None without it).
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


class HeadDistances(Accumulator):
    """Jensen-Shannon divergence between heads (docs/statistics.md), per layer and model-wide, in one pass.

    Args:
        sites: the model's attention sites, in order.
        n_heads: query heads per site.
        map_sequences: sequences (by corpus index) in the model-wide distance; 0 turns it off.
        map_rows: query rows per sequence in the model-wide distance (bounds per-batch memory).

    Cost: per batch and site, heads^2 / 2 elementwise passes over the site's cells; at the end of
    each batch, (sites * heads)^2 / 2 passes over the map cells (see ``benchmarks/bench_patterns.py``).
    """

    name = "distances"
    title = "head distances"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)

    def __init__(self, sites: list[Site], n_heads: int, *, map_sequences: int = MAP_SEQUENCES,
                 map_rows: int = MAP_ROWS) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.map_sequences = int(map_sequences)
        self.map_rows = int(map_rows)
        self._pos = {s: i for i, s in enumerate(self.sites)}
        S, H, K = len(self.sites), n_heads, len(self.sites) * n_heads
        self.cross = torch.zeros(S, H, H, dtype=torch.float64)
        self.ent = torch.zeros(S, H, dtype=torch.float64)
        self.mass = torch.zeros(S, H, dtype=torch.float64)
        self.rows = torch.zeros(S, dtype=torch.int64)
        self.m_cross = torch.zeros(K, K, dtype=torch.float64)
        self.m_ent = torch.zeros(K, dtype=torch.float64)
        self.m_mass = torch.zeros(K, dtype=torch.float64)
        self.m_rows = 0
        self.m_seen = 0
        self._map: list[torch.Tensor | None] = []
        self._groups = None

    # -- per batch ----------------------------------------------------------------------------------

    def _cells(self, batch: Batch, T: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
        """Boolean [batch, T, T] cells of the real rows outside the map and the map cells; real rows,
        map rows, and sequences in the map."""
        def build():
            real = batch.real.cpu()[:, :T]
            cells = real[:, :, None] & real[:, None, :]
            if causal:
                cells &= torch.ones(T, T, dtype=torch.bool).tril()[None]
            chosen = torch.tensor([i < self.map_sequences for i in batch.index], dtype=torch.bool)
            map_rows = real & chosen[:, None] & (torch.arange(T) < self.map_rows)[None]
            map_cells = cells & map_rows[:, :, None]
            return cells & ~map_cells, map_cells, int(real.sum()), int(map_rows.sum()), int(chosen.sum())
        return batch.cached(("distance-cells", T, causal, self.map_sequences, self.map_rows), build)

    def begin_batch(self, batch: Batch) -> None:
        self._map = [None] * len(self.sites)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch) -> None:
        """Fold in one site: ``probs`` [batch, heads, T, T] attention probabilities."""
        T = probs.shape[-1]
        rest, map_cells, n_rows, n_map_rows, _ = self._cells(batch, T, site.causal)
        a = probs.detach().float().transpose(0, 1)  # [heads, batch, T, T]
        dev = a.device
        i = self._pos[site]
        # cells outside the map here; the map cells' share of this layer comes from the all-heads sums
        # at the end of the batch (their diagonal blocks), so no cell is summed twice
        cross, ent, mass = pair_sums(a[:, rest.to(dev)])  # on the model's device
        self.cross[i] += cross.cpu()
        self.ent[i] += ent.cpu()
        self.mass[i] += mass.cpu()
        self.rows[i] += n_rows
        if self.map_sequences > 0 and n_map_rows > 0:
            self._map[i] = a[:, map_cells.to(dev)]  # [heads, map cells], kept until the batch ends
        self._groups = None

    def end_batch(self, batch: Batch) -> None:
        kept = [x for x in self._map if x is not None]
        if kept and len(kept) != len(self.sites):
            raise RuntimeError("head distances: a site of this batch was not captured")
        if kept:
            # [sites * heads, map cells], site-major, on the first layer's device (a device map puts
            # layers on several)
            x = torch.cat([k.to(kept[0].device) for k in kept], 0)
            cross, ent, mass = (t.cpu() for t in pair_sums(x))
            self.m_cross += cross
            self.m_ent += ent
            self.m_mass += mass
            H = self.n_heads
            for i in range(len(self.sites)):  # each layer's pairs on the map cells
                block = slice(i * H, (i + 1) * H)
                self.cross[i] += cross[block, block]
                self.ent[i] += ent[block]
                self.mass[i] += mass[block]
            T = int(batch.input_ids.shape[1])
            _, _, _, n_map_rows, n_seq = self._cells(batch, T, self.sites[0].causal)
            self.m_rows += n_map_rows
            self.m_seen += n_seq
        self._map = []

    # -- results ------------------------------------------------------------------------------------

    def merge(self, other: HeadDistances) -> HeadDistances:
        """Add another accumulator's sums (same sites, heads and map settings) into this one.

        Raises:
            ValueError: different sites, head counts or map settings.
        """
        if (other.sites != self.sites or other.n_heads != self.n_heads
                or (other.map_sequences, other.map_rows) != (self.map_sequences, self.map_rows)):
            raise ValueError("cannot merge head distances of different models or map settings")
        for name in ("cross", "ent", "mass", "rows", "m_cross", "m_ent", "m_mass"):
            getattr(self, name).add_(getattr(other, name))
        self.m_rows += other.m_rows
        self.m_seen += other.m_seen
        self._groups = None
        return self

    def _model(self) -> np.ndarray | None:
        if self.map_sequences <= 0:
            return None
        return js_from_sums(self.m_cross.numpy(), self.m_ent.numpy(), self.m_mass.numpy(), self.m_rows)

    def result(self) -> DistanceResult:
        """The mean distances (bits per row), per layer and model-wide, and the groups."""
        layer = np.stack([js_from_sums(self.cross[i].numpy(), self.ent[i].numpy(), self.mass[i].numpy(),
                                       int(self.rows[i])) for i in range(len(self.sites))])
        return DistanceResult(layer, self.rows.numpy().copy(), self._model(), self.m_rows, self.map_sequences,
                              self.map_rows, self.m_seen, list(self.sites), self.groups())

    def groups(self):
        """:class:`~probe.patterns.groups.HeadGroups` of all heads from the model-wide distance (computed
        once per state), or None when the model-wide distance was off or saw no row."""
        if self._groups is None and self.map_sequences > 0 and self.m_rows > 0:
            self._groups = head_groups(self._model())
        return self._groups

    def columns(self):
        """``group`` per head for ``heads.csv`` (replacing the k-means ``cluster``), or None."""
        groups = self.groups()
        if groups is None:
            return None
        S, H = len(self.sites), self.n_heads
        return pd.DataFrame({"layer": np.repeat([s.layer for s in self.sites], H), "head": np.tile(np.arange(H), S),
                             "group": groups.group})
