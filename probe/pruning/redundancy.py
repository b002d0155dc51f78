"""Redundant heads: the pruning order given by the Jensen-Shannon distance between the heads of
one layer (Clark et al. 2019, sec. 6).

The distance is :mod:`probe.patterns.distance`'s, its one implementation: per layer, the mean over
the corpus's real query rows of the Jensen-Shannon divergence in bits between the heads' rows
(:attr:`probe.patterns.distance.DistanceResult.layer`, [layers, heads, heads]); heads closer than
:data:`probe.patterns.distance.NEAR_DUPLICATE` (0.05 bits) are near-duplicates.

Order (:func:`redundancy_pick`): repeatedly take the closest pair of heads still present in one
layer and prune the less important one of the pair (Michel et al. importance, normalized per
layer), so the more important head of a near-duplicate pair is kept. Near-duplicate pairs come
first by construction; once none is left the order goes on with the next-closest pairs. A layer
down to one head has no pair left; when no layer has two heads, the least important heads go.
"""

from __future__ import annotations

import math

import torch


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
