"""Label groups against random heads: which heads are ablated together, and the intervals.

- A label group S is every head whose ``labels`` include the label; a head group, every head of one
  ``group`` (or k-means ``cluster``) of the heads table. Its baseline: per seed, k = |S|
  heads drawn uniformly without replacement from the heads not in S (from all heads when fewer than
  k are left), ``numpy.random.default_rng([seed, k])``; seeds 0 .. n-1 (at least 5, default 10).
- The random sets' effects: their mean, sample standard deviation (ddof 1) and the 95% interval of
  the mean from Student's t with n - 1 degrees of freedom.
- An effect's interval over held-out sequences: the paired percentile bootstrap. The effect is a
  ratio of sums, sum_i (ablated_i - clean_i) / sum_i units_i over held-out sequences i; each of
  1,000 resamples (``numpy.random.default_rng(0)``) draws n sequences with replacement and computes
  the same ratio, so the clean and ablated losses of one sequence stay paired; the interval is the
  2.5th and 97.5th percentile (Efron & Tibshirani 1993, ch. 13).
- What the baseline is drawn from: the pool's size and its most common primary label with its share
  (on a model where most heads are ``mixed``, a large group is compared with mostly mixed heads).
- Verdict "group > random" when the bootstrap interval's low end lies above the random mean's t
  interval's high end; else "not above random".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import stdtrit

from ..errors import InputError

#: Defaults: random seeds per group, bootstrap resamples and seed, interval level.
SEEDS, MIN_SEEDS, BOOTSTRAP, BOOTSTRAP_SEED, LEVEL = 10, 5, 1000, 0, 0.95


def label_groups(heads: pd.DataFrame) -> dict[str, list[tuple[int, int]]]:
    """label -> [(layer, head), ...] of every head whose ``labels`` (';'-separated) include it, in
    table order; labels sorted by name."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for row in heads.itertuples():
        for label in str(getattr(row, "labels", "") or "").split(";"):
            if label.strip() and label.strip() != "nan":
                groups.setdefault(label.strip(), []).append((int(row.layer), int(row.head)))
    return dict(sorted(groups.items()))


def head_groups(heads: pd.DataFrame) -> dict[str, list[tuple[int, int]]]:
    """``"group N"`` / ``"cluster N"`` -> its heads: the heads table's ``group`` column (the
    Jensen-Shannon grouping) where there is one, else its k-means ``cluster`` column; -1 (not
    grouped) and empty values are left out."""
    column = "group" if "group" in heads else "cluster" if "cluster" in heads else None
    groups: dict[str, list[tuple[int, int]]] = {}
    if column is None:
        return groups
    for row in heads.itertuples():
        value = getattr(row, column)
        if pd.notna(value) and int(value) >= 0:
            groups.setdefault(f"{column} {int(value)}", []).append((int(row.layer), int(row.head)))
    return dict(sorted(groups.items(), key=lambda kv: int(kv[0].split()[1])))


def random_sets(group: list[tuple[int, int]], n_layers: int, n_heads: int, seeds: int = SEEDS) -> list[list]:
    """``seeds`` random sets of len(group) heads outside ``group`` (all heads when too few are left).

    Raises:
        InputError: fewer than :data:`MIN_SEEDS` seeds, or an empty group.
    """
    if seeds < MIN_SEEDS:
        raise InputError(f"the random baseline needs at least {MIN_SEEDS} seeds, got {seeds}")
    k = len(group)
    if k == 0:
        raise InputError("an empty head group has no random baseline")
    inside = set(group)
    every = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    pool = [x for x in every if x not in inside]
    if len(pool) < k:
        pool = every
    out = []
    for seed in range(seeds):
        pick = np.random.default_rng([seed, k]).choice(len(pool), size=k, replace=False)
        out.append([pool[i] for i in sorted(pick)])
    return out


def pool_makeup(primary: dict, group: list[tuple[int, int]], n_layers: int, n_heads: int) -> tuple[int, str, float]:
    """(pool size, most common primary label in the pool, its share) of :func:`random_sets`'s pool
    (``""`` and NaN without primary labels).

    Args:
        primary: (layer or site index, head) -> primary label (``label`` of the heads table).
        group: the group's heads.
        n_layers: layers (sites) of the model.
        n_heads: heads per layer.
    """
    inside = set(group)
    every = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    pool = [x for x in every if x not in inside]
    if len(pool) < len(group):
        pool = every
    if not primary:
        return len(pool), "", float("nan")
    labels = pd.Series([str(primary.get(x, "")) for x in pool])
    counts = labels.value_counts()
    return len(pool), str(counts.index[0]), float(counts.iloc[0] / len(pool))


def t_interval(values, level: float = LEVEL) -> tuple[float, float, float, float]:
    """(mean, std with ddof 1, low, high): the t interval of the mean of ``values`` (n >= 2)."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    mean, std = float(v.mean()), float(v.std(ddof=1))
    half = float(stdtrit(n - 1, 0.5 + level / 2)) * std / np.sqrt(n)
    return mean, std, mean - half, mean + half


def paired_bootstrap(delta: np.ndarray, units: np.ndarray, n_boot: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED,
                     level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Effects and their paired percentile bootstrap intervals over held-out sequences.

    Args:
        delta: [sets, sequences] per-sequence loss sums, ablated minus clean (objective units x units).
        units: [sequences] units per sequence (tokens, masked tokens, 1 per sequence).
        n_boot: resamples.
        seed: of ``numpy.random.default_rng``.
        level: interval level.

    Returns:
        (effect [sets], low [sets], high [sets]); every set uses the same resamples.
    """
    delta, units = np.atleast_2d(np.asarray(delta, dtype=float)), np.asarray(units, dtype=float)
    n = units.shape[0]
    effect = delta.sum(1) / units.sum()
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    counts = np.stack([np.bincount(row, minlength=n) for row in idx]).astype(float)  # [n_boot, n]
    boot = (delta @ counts.T) / (counts @ units)[None]  # [sets, n_boot]
    tail = 100 * (1 - level) / 2
    return effect, np.percentile(boot, tail, axis=1), np.percentile(boot, 100 - tail, axis=1)


def verdict(low: float, random_high: float) -> str:
    """``"group > random"`` when the group's bootstrap low exceeds the random t interval's high."""
    return "group > random" if low > random_high else "not above random"
