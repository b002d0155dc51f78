"""Redundant heads: Jensen-Shannon divergence between the attention distributions of heads of one
layer on the same tokens (shared/METRICS.md "Head distance and redundancy"; Clark et al. 2019,
sec. 6), and the pruning order it gives.

Distance between heads h and g of one layer: for each real query row i, the Jensen-Shannon
divergence, base 2 (so in [0, 1]), between row i of A_h and row i of A_g,

    JS(p, q) = H((p + q) / 2) - (H(p) + H(q)) / 2   (H = entropy in bits),

which equals ``scipy.spatial.distance.jensenshannon(p, q, base=2) ** 2`` (scipy returns the
square root); averaged token-weighted over the corpus. Heads closer than
:data:`NEAR_DUPLICATE` (0.05) are near-duplicates.

Order (:func:`redundancy_pick`): repeatedly take the closest pair of heads still present in one
layer and prune the less important one of the pair (Michel et al. importance, normalized per
layer), so the more important head of a near-duplicate pair is kept. Near-duplicate pairs come
first by construction; once none is left the order goes on with the next-closest pairs. A layer
down to one head has no pair left; when no layer has two heads, the least important heads go.
"""

from __future__ import annotations

import math

import torch

from ..accumulators import Accumulator

#: Heads of one layer closer than this (bits) are near-duplicates (METRICS.md default).
NEAR_DUPLICATE = 0.05

#: Query rows per chunk of the pairwise computation (bounds memory at heads^2 x rows x T doubles).
ROW_CHUNK = 64


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence, base 2, of distributions along the last dimension (bits, in [0, 1])."""
    m = (p + q) / 2
    ent = torch.special.entr
    js = (ent(m).sum(-1) - (ent(p).sum(-1) + ent(q).sum(-1)) / 2) / math.log(2)
    return js.clamp(min=0)


def pairwise_js(probs: torch.Tensor) -> torch.Tensor:
    """Sum over query rows of JS between every pair of heads of one sequence.

    Args:
        probs: [heads, n, n] attention probabilities of one sequence's n real tokens.

    Returns:
        [heads, heads] float64 sums over the n query rows (bits); 0 on the diagonal.
    """
    p = probs.double()
    H, n, _ = p.shape
    ent = torch.special.entr
    out = torch.zeros(H, H, dtype=torch.float64, device=p.device)
    for start in range(0, n, ROW_CHUNK):
        rows = p[:, start:start + ROW_CHUNK]  # [heads, r, keys]
        h = ent(rows).sum(-1)  # [heads, r] entropy (nats)
        hm = ent((rows[:, None] + rows[None]) / 2).sum(-1)  # [heads, heads, r]
        js = ((hm - (h[:, None] + h[None]) / 2) / math.log(2)).clamp(min=0)
        out += js.sum(-1)
    return out


class HeadDistances(Accumulator):
    """Running sums of the Jensen-Shannon distance between every pair of heads of each layer.

    ``sums`` is [sites, heads, heads] float64 (bits, summed over real query rows), ``rows`` [sites]
    int64; :meth:`result` is their ratio, the token-weighted mean. Removed heads (NaN
    probabilities) give NaN distances.
    """

    name = "head_distances"
    title = "head redundancy"
    model_kinds = ("encoder", "decoder")  # one-stack models
    site_kinds = ("self",)

    def __init__(self, sites, n_heads: int) -> None:
        self.sites = list(sites)
        self._row = {s: i for i, s in enumerate(self.sites)}
        self.sums = torch.zeros(len(self.sites), n_heads, n_heads, dtype=torch.float64)
        self.rows = torch.zeros(len(self.sites), dtype=torch.int64)

    def update(self, site, probs: torch.Tensor, batch) -> None:
        lengths = batch.lengths.tolist()
        i = self._row[site]
        with torch.no_grad():
            for b, n in enumerate(lengths):
                self.sums[i] += pairwise_js(probs[b, :, :n, :n].detach()).cpu()
                self.rows[i] += n

    def merge(self, other: HeadDistances) -> HeadDistances:
        self.sums += other.sums
        self.rows += other.rows
        return self

    def result(self) -> torch.Tensor:
        """[sites, heads, heads] mean distance (bits); NaN where no row was seen."""
        rows = self.rows.double()[:, None, None]
        out = self.sums / rows.clamp(min=1)
        out[(rows == 0).expand_as(out)] = float("nan")
        return out


def nearest(distances: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[layers, heads]: each present head's distance to the closest other present head of its layer
    (NaN where it has none, or is pruned)."""
    L, H, _ = distances.shape
    present = mask.bool()
    pair_ok = present[:, :, None] & present[:, None, :] & ~torch.eye(H, dtype=torch.bool)[None]
    d = torch.where(pair_ok & ~distances.isnan(), distances, torch.full_like(distances, float("inf")))
    best = d.min(-1).values
    return torch.where(torch.isfinite(best), best, torch.full_like(best, float("nan")))


def redundancy_pick(distances: torch.Tensor, importance: torch.Tensor, mask: torch.Tensor,
                    k: int) -> list[tuple[int, int]]:
    """The next ``k`` heads to prune in redundancy order (see the module docstring).

    Args:
        distances: [layers, heads, heads] mean Jensen-Shannon distances (bits).
        importance: [layers, heads] normalized importance (decides which head of a pair goes).
        mask: [layers, heads], 0 for heads already pruned.
        k: how many heads to pick.

    Returns:
        (layer, head) pairs, in the order they are pruned.
    """
    present = mask.bool().clone()
    picked = []
    H = present.shape[1]
    for _ in range(k):
        pair_ok = present[:, :, None] & present[:, None, :] & torch.triu(torch.ones(H, H, dtype=torch.bool), 1)[None]
        d = torch.where(pair_ok & ~distances.isnan(), distances.double(), torch.full(distances.shape, math.inf,
                                                                                     dtype=torch.float64))
        if torch.isfinite(d).any():
            flat = int(torch.argmin(d))
            layer, h, g = flat // (H * H), (flat // H) % H, flat % H
            # the less important of the pair goes (ties: the higher-numbered head)
            head = h if float(importance[layer, h]) < float(importance[layer, g]) else g
        else:
            scores = torch.where(present, importance.double(), torch.full(importance.shape, math.inf,
                                                                          dtype=torch.float64))
            if not torch.isfinite(scores).any():
                break
            flat = int(torch.argmin(scores))
            layer, head = flat // H, flat % H
        present[layer, head] = False
        picked.append((layer, head))
    return picked
