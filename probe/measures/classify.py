"""Head labels from per-head statistics (docs/statistics.md, "Labels"), and clusters.

A head gets every label whose rule ``statistic >= threshold`` holds; its primary label is the one
whose statistic is highest relative to its threshold; a head with no label is ``mixed``
(Kovaleva et al. 2019's "heterogeneous" pattern). Clusters group heads with similar statistic
profiles (k-means on standardized statistics, scikit-learn), following Clark et al. 2019 sec. 6.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..rules import LABEL_RULES, MIXED, REMOVED, default_thresholds, validate_thresholds  # noqa: F401 (re-exported)


def label_heads(heads: pd.DataFrame, thresholds: dict[str, float] | None = None,
                extra: list[tuple[int, int, str, float]] = ()) -> pd.DataFrame:
    """Add ``label`` (primary) and ``labels`` (all, separated by ';') columns.

    Args:
        heads: one row per head with the statistic columns of :data:`probe.measures.stats.STATISTICS`
            (a rule whose statistic column is absent never holds).
        thresholds: label -> threshold overriding the defaults (unknown labels raise ValueError).
        extra: labels other analyses give, ``(layer, head, label, strength)`` (see
            :meth:`probe.measures.accumulators.Accumulator.head_labels`), ranked with the rules' value /
            threshold ratios.

    Returns:
        A copy of ``heads`` with ``label`` and ``labels`` inserted after ``head``. A statistic that
        is NaN (undefined for this model, e.g. ``next`` for a decoder) never gives its label.
    """
    validate_thresholds(thresholds)
    thr = default_thresholds()
    thr.update({name: float(value) for name, value in (thresholds or {}).items()})
    given: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for layer, head, label, strength in extra:
        given.setdefault((int(layer), int(head)), []).append((float(strength), label))
    # each rule's value / threshold where it holds (NaN never holds), one column at a time
    ratios = {}
    for label, (stat, _) in LABEL_RULES.items():
        if stat in heads.columns:
            values = heads[stat].to_numpy(dtype=float)
            ratios[label] = [v / thr[label] if v >= thr[label] else None for v in values.tolist()]
    keys = (list(zip(heads["layer"].astype(int), heads["head"].astype(int))) if "layer" in heads.columns
            else [None] * len(heads))
    primaries, alls = [], []
    for i, key in enumerate(keys):
        held = list(given.get(key, []))
        held += [(ratio[i], label) for label, ratio in ratios.items() if ratio[i] is not None]
        if held:
            primaries.append(max(held)[1])
            alls.append(";".join(label for _, label in sorted(held, reverse=True)))
        else:
            primaries.append(MIXED)
            alls.append(MIXED)
    out = heads.copy()
    pos = list(out.columns).index("head") + 1 if "head" in out.columns else 0
    out.insert(pos, "labels", alls)
    out.insert(pos, "label", primaries)
    return out


def cluster_heads(heads: pd.DataFrame, statistics: list[str], n_clusters: int = 6,
                  seed: int = 0) -> np.ndarray:
    """Group heads with similar statistic profiles (k-means on z-scored statistics).

    Args:
        heads: one row per head.
        statistics: the statistic columns to use (columns that are NaN everywhere are dropped).
        n_clusters: clusters wanted (capped at the number of heads).

    Returns:
        [heads] int cluster ids.
    """
    if n_clusters <= 1:  # one cluster whatever the profiles (as below with k == 1), without reading them
        return np.zeros(len(heads), dtype=np.int32)
    from sklearn.cluster import KMeans  # deferred: scikit-learn takes ~1.5-2 s to import
    from sklearn.preprocessing import StandardScaler  # deferred: scikit-learn takes ~1.5-2 s to import

    cols = [c for c in statistics if heads[c].notna().any()]
    x = heads[cols].fillna(heads[cols].mean()).to_numpy(dtype=float)
    distinct = len(np.unique(np.round(x, 12), axis=0))
    k = max(1, min(n_clusters, distinct))  # never more clusters than distinct profiles
    if k == 1:  # one cluster: every head in it (what k-means gives, without its ten restarts)
        return np.zeros(len(heads), dtype=np.int32)
    x = StandardScaler().fit_transform(x)
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(x)
