"""Head groups and the 2-D head map, from the model-wide Jensen-Shannon distance.

Following Clark et al. 2019 (sec. 6, "Clustering attention heads"): the dissimilarity between two
heads is their Jensen-Shannon divergence (bits, :mod:`probe.patterns.distance`), the map is
multidimensional scaling of that matrix (scikit-learn ``MDS`` with precomputed dissimilarities,
metric MDS, classical-MDS start, fixed seed), and the groups come from a clustering on the same
matrix.

Decided here:

- Clustering: agglomerative with average linkage on the precomputed divergence (scikit-learn
  ``AgglomerativeClustering``); it takes a dissimilarity as it is (k-means would need coordinates,
  and the 2-D map loses information).
- Number of groups: the k in 2..``max_groups`` (default 12, capped at heads - 1) with the largest
  mean silhouette (Rousseeuw 1987; scikit-learn ``silhouette_samples`` on the precomputed
  divergence) over the heads that share their group with another head. A head alone in its group is
  an outlier, not structure (its silhouette is 0 by convention): with the plain mean, one far-away
  head (MiniLM's single previous-token head, 0.75 bits from everything) makes k = 2 "best" by
  splitting it off from the other 71. Only partitions with at least two groups of two or more heads
  qualify; when none does, the plain mean decides. Ties go to the smaller k. Fewer than 3 heads,
  or heads all at distance 0 (nothing to separate): one group.
- Group ids are renumbered by the first head (layer-major order) in each, so group 0 holds head
  (0, 0) and ids read top to bottom.

Group ids replace the k-means ``cluster`` column of ``heads.csv`` (k-means on z-scored summary
statistics, kept only for runs without head distances): groups from the divergence compare what
heads actually attend to, token by token, on the same text, as Clark et al. do; a profile of eleven
averages can put two heads with the same averages but different maps together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Silhouette bands of Kaufman & Rousseeuw (1990, "Finding Groups in Data", ch. 2, sec. 2): the
#: strength of the structure a clustering found, by its mean silhouette (lower bound, words).
SILHOUETTE_BANDS = ((0.70, "strong"), (0.50, "reasonable"), (0.25, "weak"), (float("-inf"), "no substantial"))

#: A group holding at least this share of the heads makes the grouping lopsided (said in the report).
DOMINANT_SHARE = 0.75


def structure_note(silhouette: float | None, sizes: list[int]) -> str:
    """What a grouping's mean silhouette and group sizes say about it, in words ('' for a strong or
    reasonable grouping without a dominant group).

    Args:
        silhouette: the mean silhouette of the chosen k (None: not scored).
        sizes: heads per group.

    Returns:
        A sentence: the silhouette's band (Kaufman & Rousseeuw 1990: above 0.70 strong, above 0.50
        reasonable, above 0.25 weak, else no substantial structure) when weak or none, and the share
        of the largest group when it holds at least :data:`DOMINANT_SHARE` of the heads.
    """
    parts = []
    if silhouette is not None and math.isfinite(silhouette):
        band = next(name for low, name in SILHOUETTE_BANDS if silhouette > low)
        if band in ("weak", "no substantial"):
            parts.append(f"The grouping shows {band} structure: silhouette {silhouette:.2f} "
                         "(Kaufman & Rousseeuw: above 0.70 strong, above 0.50 "
                         "reasonable, above 0.25 weak, else no substantial structure): read the groups as a rough "
                         "sorting of the heads, not as kinds of head.")
    total = sum(sizes)
    if total and len(sizes) > 1 and max(sizes) >= DOMINANT_SHARE * total:
        g = sizes.index(max(sizes))
        parts.append(f"Group {g} holds {max(sizes)} of the {total} heads; the other groups are small.")
    return " ".join(parts)


#: Largest number of groups tried.
MAX_GROUPS = 12


@dataclass
class HeadGroups:
    """Groups and map coordinates of all heads.

    Attributes:
        group: [heads] int group id per head (index = site * heads + head); -1 for a head without
            attention (removed by pruning).
        xy: [heads, 2] MDS coordinates (bits: distances in the map approximate the divergences); NaN
            for a head without attention.
        k: number of groups.
        silhouette: k -> the criterion for k groups: the mean silhouette of the heads in groups of two
            or more (see the module docstring).
        stress: normalized stress of the MDS map (Stress-1, Kruskal 1964: 0 = perfect, < 0.1 good,
            > 0.2 the map distorts), or NaN when not computed.
        criterion: how k was chosen, in words.
    """

    group: np.ndarray
    xy: np.ndarray
    k: int
    silhouette: dict[int, float] = field(default_factory=dict)
    stress: float = float("nan")
    criterion: str = ""


def _symmetric(distance: np.ndarray) -> np.ndarray:
    d = np.asarray(distance, dtype=float)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    return np.clip(d, 0.0, None)


def head_map(distance: np.ndarray, seed: int = 0) -> tuple[np.ndarray, float]:
    """2-D metric MDS coordinates of heads from a [heads, heads] divergence matrix.

    Returns:
        ([heads, 2] coordinates, normalized stress). Fewer than 3 heads: coordinates on a line
        (exact), stress 0.

    Raises:
        ValueError: a NaN in ``distance`` (heads without measured rows).
    """
    d = _symmetric(distance)
    if np.isnan(d).any():
        raise ValueError("the head distance has NaN entries (no rows were measured)")
    n = len(d)
    if n < 3 or not d.any():
        xy = np.zeros((n, 2))
        if n == 2:
            xy[1, 0] = d[0, 1]
        return xy, 0.0
    from sklearn.manifold import MDS  # deferred: scikit-learn takes ~1.5-2 s to import

    # scikit-learn >= 1.8 (pyproject's bound): classical MDS as the start; the random starts of older
    # releases missed the distances by up to 0.02 on a 10-point test map
    mds = MDS(n_components=2, metric_mds=True, metric="precomputed", init="classical_mds", random_state=seed,
              normalized_stress=True)
    xy = mds.fit_transform(d)
    return xy, float(getattr(mds, "stress_", float("nan")))


def cluster_by_distance(distance: np.ndarray, max_groups: int = MAX_GROUPS) -> tuple[np.ndarray, dict[int, float]]:
    """Average-linkage clustering of a divergence matrix; k by the largest mean silhouette.

    Returns:
        ([heads] group ids renumbered by first appearance, k -> silhouette of every k tried).
    """
    from sklearn.cluster import AgglomerativeClustering  # deferred: scikit-learn takes ~1.5-2 s to import

    d = _symmetric(distance)
    n = len(d)
    if n < 3 or not d.any():
        return np.zeros(n, dtype=int), {}
    tried: dict[int, tuple[np.ndarray, float, float | None]] = {}
    for k in range(2, min(max_groups, n - 1) + 1):
        labels = AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage="average").fit_predict(d)
        if len(set(labels)) < 2:
            continue
        tried[k] = (labels, *silhouettes(d, labels))
    if not tried:
        return np.zeros(n, dtype=int), {}
    shared = {k: v[2] for k, v in tried.items() if v[2] is not None}
    scores = shared or {k: v[1] for k, v in tried.items()}
    best = max(scores, key=lambda k: (scores[k], -k))  # ties: the smaller k
    return _renumber(tried[best][0]), scores


def silhouettes(d: np.ndarray, labels: np.ndarray) -> tuple[float, float | None]:
    """Mean silhouette of all heads, and of the heads in groups of two or more (None when fewer
    than two such groups)."""
    from sklearn.metrics import silhouette_samples  # deferred: scikit-learn takes ~1.5-2 s to import

    s = silhouette_samples(d, labels, metric="precomputed")
    sizes = np.bincount(labels)
    shared = sizes[labels] >= 2
    return float(s.mean()), (float(s[shared].mean()) if (sizes >= 2).sum() >= 2 else None)


def _renumber(labels: np.ndarray) -> np.ndarray:
    order: dict[int, int] = {}
    for lab in labels:
        order.setdefault(int(lab), len(order))
    return np.array([order[int(lab)] for lab in labels], dtype=int)


def head_groups(distance: np.ndarray, *, max_groups: int = MAX_GROUPS, seed: int = 0) -> HeadGroups:
    """Groups (clustering) and 2-D map (MDS) of all heads from their [heads, heads] divergence.

    A head whose every distance is NaN had no attention probabilities (a head physically removed by
    :mod:`probe.pruning`, whose probabilities are NaN): it is left out of the map and the groups
    (group -1, coordinates NaN) and the others are grouped among themselves.

    Raises:
        ValueError: a NaN between two heads that both have measured distances.
    """
    d = np.asarray(distance, dtype=float)
    off = d.copy()
    np.fill_diagonal(off, np.nan)
    keep = ~np.isnan(off).all(axis=1) if len(d) > 1 else np.ones(len(d), dtype=bool)
    sub = d[np.ix_(keep, keep)]
    xy_kept, stress = head_map(sub, seed)
    group_kept, scores = cluster_by_distance(sub, max_groups)
    group = np.full(len(d), -1, dtype=int)
    group[keep] = group_kept
    xy = np.full((len(d), 2), np.nan)
    xy[keep] = xy_kept
    k = int(group_kept.max()) + 1 if len(group_kept) else 0
    tried = max(2, min(max_groups, len(group_kept) - 1))
    criterion = (f"average-linkage clustering of the Jensen-Shannon divergence; k = {k} of 2..{tried} with the "
                 "largest mean silhouette of the heads that share their group") if scores else \
        "one group (fewer than 3 heads or no distance)"
    if not keep.all():
        criterion += f"; {int((~keep).sum())} heads without attention (removed) left out (group -1)"
    return HeadGroups(group, xy, k, scores, stress, criterion)
