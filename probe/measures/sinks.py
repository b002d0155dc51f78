"""Attention sinks by query position: how much of each row goes to the first tokens, as the row
moves away from them.

Xiao et al. 2023 ("Efficient Streaming Language Models with Attention Sinks", sec. 3.1) find that
decoders put a large share of attention on the first few tokens whatever they say, and that this
holds (and matters) thousands of tokens in. :class:`SinkProfile` measures it at every length: for
each self-attention site and head, the mean over real query rows i of

- ``first``: A[i, 0], the weight on the sequence's first token (the BOS token where the tokenizer
  adds one, else the first word piece), and
- ``first4``: sum of A[i, j] over j < 4 (:data:`SINK_TOKENS`, the four sink tokens of StreamingLLM),

in bins of the query position i: [0, 1), [1, 2), [2, 4), [4, 8), ... (powers of two,
:func:`bin_edges`). It reads only the first columns of each row, so it takes row blocks (block
capture, :mod:`probe.capture.blocks`) and costs nothing next to the statistics. Cross-attention sites are
not measured (their first key is the source's, not a sink of the row's own sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..loading.seq2seq import sides
from ..sites import Site, site_prefix
from ..text.inputs import Batch
from .accumulators import Accumulator

#: ``first4`` sums the weight on keys 0..SINK_TOKENS-1 (StreamingLLM keeps four sink tokens).
SINK_TOKENS = 4
#: Query positions are binned up to 2^MAX_POWER (beyond any model's limit here).
MAX_POWER = 20


def bin_edges(n_bins: int = MAX_POWER + 2) -> np.ndarray:
    """Bin edges of query positions: 0, 1, 2, 4, 8, ... (``n_bins`` + 1 edges; bin b is
    [edges[b], edges[b + 1]))."""
    return np.array([0] + [2 ** k for k in range(n_bins)], dtype=np.int64)


def position_bins(positions: torch.Tensor) -> torch.Tensor:
    """Bin of each query position (0 for position 0, else floor(log2 i) + 1), same shape, int64."""
    p = positions.long()
    return torch.where(p > 0, torch.floor(torch.log2(p.clamp(min=1).double())).long() + 1, torch.zeros_like(p))


@dataclass
class SinkProfileResult:
    """What :class:`SinkProfile` measured.

    Attributes:
        sites: the measured (self-attention) sites, in order.
        sums: [sites, heads, bins, 2] float64 sums over real query rows of A[i, 0] and of
            sum_{j<4} A[i, j], by position bin.
        rows: [sites, bins] int64 real query rows per bin (the same for every head of a site).
        edges: [bins + 1] bin edges (:func:`bin_edges`).
        longest: tokens of the longest sequence measured.
    """

    sites: list[Site]
    sums: np.ndarray
    rows: np.ndarray
    edges: np.ndarray
    longest: int

    def means(self) -> np.ndarray:
        """[sites, heads, bins, 2] mean ``first`` and ``first4`` per bin; NaN where a bin has no row."""
        rows = self.rows[:, None, :, None].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rows > 0, self.sums / np.maximum(rows, 1), np.nan)

    def frame(self) -> pd.DataFrame:
        """One row per (site, bin with rows): ``site`` ("L3"; "enc L3", "dec L3" for an encoder-decoder
        model), ``layer``, ``start``/``end`` (query positions [start, end)), ``rows``, and the mean over
        heads (removed heads left out) of ``first`` and ``first4``."""
        means = self.means()
        out = []
        for s, site in enumerate(self.sites):
            name = f"{site_prefix(site.stack if len({x.stack for x in self.sites}) > 1 else None, site.kind)} " \
                   f"L{site.layer}".strip()
            for b in np.flatnonzero(self.rows[s] > 0):
                out.append({"site": name, "layer": site.layer, "start": int(self.edges[b]),
                            "end": int(self.edges[b + 1]), "rows": int(self.rows[s, b]),
                            "first": float(np.nanmean(means[s, :, b, 0])),
                            "first4": float(np.nanmean(means[s, :, b, 1]))})
        return pd.DataFrame(out, columns=["site", "layer", "start", "end", "rows", "first", "first4"])


def _rows_and_bins(real: torch.Tensor, i0: int, i1: int, n_bins: int, device: torch.device) -> tuple:
    """([batch, i1 - i0] bool real query rows, [i1 - i0, n_bins] float64 one-hot position bins) on ``device``."""
    bins = torch.nn.functional.one_hot(position_bins(torch.arange(i0, i1, device=device)), n_bins).double()
    return real[:, i0:i1].to(device), bins


class SinkProfile(Accumulator):
    """Attention to the first tokens by query position, per self-attention site and head
    (module docstring: ``first`` and ``first4``, in power-of-two bins of the query position).

    Takes row blocks (:attr:`row_blocks`). Merges by addition.

    Args:
        sites: the model's attention sites (``lm.sites``); cross-attention sites are skipped.
        n_heads: query heads per site.
    """

    name = "sink_profile"
    title = "attention to the first tokens by position"
    row_blocks = True
    on_device = ("sums", "rows")

    def __init__(self, sites: list[Site], n_heads: int) -> None:
        self.sites = [s for s in sites if s.kind != "cross"]
        self._index = {s: i for i, s in enumerate(self.sites)}
        self.n_heads = n_heads
        self.edges = bin_edges()
        n_bins = len(self.edges) - 1
        self.sums = torch.zeros(len(self.sites), n_heads, n_bins, 2, dtype=torch.float64)
        self.rows = torch.zeros(len(self.sites), n_bins, dtype=torch.int64)
        self.longest = 0

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, rows: tuple[int, int] | None = None) -> None:
        """Add one site's probabilities [batch, heads, query, key] (with ``rows`` = (i0, i1): query
        rows i0..i1-1 only)."""
        if site not in self._index:
            return
        queries, _ = sides(site, batch)
        i0, i1 = (0, probs.shape[2]) if rows is None else rows
        self.follow(probs.device)
        dev = self.sums.device  # probs' device (the CPU for MPS: no float64 there)
        # the block's real rows and position bins: built on the device once per batch and block, for every site
        real, one_hot = queries.cached(("sink_rows", i0, i1, self.rows.shape[1], str(dev)),
                                       lambda: _rows_and_bins(queries.real, i0, i1, self.rows.shape[1], dev))
        first = probs[..., 0].to(dev, torch.float64)  # [B, H, r]
        first4 = probs[..., :SINK_TOKENS].to(dev, torch.float64).sum(-1)
        s = self._index[site]
        for c, share in enumerate((first, first4)):  # padded rows out before the sum (whatever they hold)
            self.sums[s, :, :, c] += torch.where(real[:, None, :], share, 0.0).sum(0) @ one_hot  # [H, bins]
        self.rows[s] += (real.double().sum(0) @ one_hot).round().long()
        self.longest = max(self.longest, int(queries.lengths.max()))

    def merge(self, other: SinkProfile) -> SinkProfile:
        """Add another profile of the same model into this one (in place); returns self.

        Raises:
            ValueError: other sites or head counts.
        """
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge sink profiles of models with different sites or head counts")
        self.sums += other.sums.to(self.sums.device)
        self.rows += other.rows.to(self.rows.device)
        self.longest = max(self.longest, other.longest)
        return self

    def result(self) -> SinkProfileResult:
        """The :class:`SinkProfileResult`."""
        return SinkProfileResult(list(self.sites), self.sums.cpu().numpy().copy(), self.rows.cpu().numpy().copy(),
                                 self.edges.copy(), self.longest)

