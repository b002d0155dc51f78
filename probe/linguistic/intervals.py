"""95% Wilson score intervals for accuracies (Wilson 1927), from statsmodels.

The Wilson interval keeps its coverage near 95% for small n and accuracies near 0 or 1, where the
normal approximation fails (Brown, Cai and DasGupta 2001); probe reports one with every accuracy.
"""

from __future__ import annotations

import numpy as np

#: Confidence level of every interval probe reports.
LEVEL = 0.95


def wilson(correct, n) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of ``correct / n`` (elementwise).

    Args:
        correct: successes (array-like of ints).
        n: trials (same shape); where n is 0 the interval is NaN.

    Returns:
        (low, high) float arrays in [0, 1].
    """
    from statsmodels.stats.proportion import proportion_confint  # deferred: statsmodels takes ~1 s to import

    correct = np.asarray(correct, dtype=float)
    n = np.asarray(n, dtype=float)
    empty = n == 0
    low, high = proportion_confint(correct, np.where(empty, 1, n), alpha=1 - LEVEL, method="wilson")
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    return np.where(empty, np.nan, low), np.where(empty, np.nan, high)


def accuracy(correct, n) -> np.ndarray:
    """``correct / n`` (NaN where n is 0)."""
    correct = np.asarray(correct, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n == 0, np.nan, correct / np.where(n == 0, 1, n))
