"""The per-head statistics of one call as one compiled pass over its maps (numba), beside the torch
path of :func:`probe.measures.stats.map_sums` (defined in docs/statistics.md).

:func:`probe.measures.stats.map_sums` runs some 65 small tensor operations per site and batch; on
short texts their dispatch, not their arithmetic, is the time. :func:`kernel_sums` reads each
probability once and keeps, per query row, every statistic of the attention map A and of the
value-weighted map N~ (Kobayashi et al. 2020) in float64, then adds the real rows with their
weights: the same sums as the torch path (which stays the reference in the tests and the fallback).

Which path runs is decided in one place, :func:`stats_path`: the kernel where numba imports and the
maps are float32 on the CPU, unless the environment variable :data:`PATH_ENV` is ``torch``.
"""

from __future__ import annotations

import os
import sys
import time
from functools import lru_cache

import numpy as np
import torch

#: Environment variable choosing the statistics' path: ``torch`` (the tensor operations), ``kernel``
#: (the compiled pass where it applies) or unset (the same as ``kernel``).
PATH_ENV = "PROBE_STATS_PATH"
#: The paths :func:`stats_path` chooses from.
PATHS = ("torch", "kernel")
#: The first call's compile (or cache load) is announced on stderr when it takes longer than this (seconds).
ANNOUNCE_AFTER = 1.0


def stats_path(a: torch.Tensor, requested: str | None = None) -> str:
    """Which path computes the statistics of maps ``a`` ([batch, heads, query, key]): ``"kernel"``
    where numba imports, ``a`` is float32 on the CPU and neither ``requested`` nor the environment
    variable :data:`PATH_ENV` says ``torch``; else ``"torch"`` (GPU and MPS maps, numba missing).
    The one place the choice is made; a fallback is silent (the numbers are the same).

    Raises:
        ValueError: ``requested`` or :data:`PATH_ENV` is not one of :data:`PATHS`.
    """
    want = requested or os.environ.get(PATH_ENV) or "kernel"
    if want not in PATHS:
        raise ValueError(f"the statistics' path must be one of {', '.join(PATHS)} (got {want!r}; {PATH_ENV})")
    if want == "torch" or a.device.type != "cpu" or a.dtype != torch.float32 or _compiled() is None:
        return "torch"
    return "kernel"


@lru_cache(maxsize=1)
def _compiled():
    """The module of the compiled kernel (:mod:`probe.measures.kernel_numba`; numba's cache on disk:
    compiled once per machine), or None without numba."""
    t = time.perf_counter()
    try:
        from . import kernel_numba  # deferred: numba is imported (0.3 s) by the first statistics only
    except ImportError:
        return None
    fn = kernel_numba
    # the first call compiles (or loads numba's cache): do it here, on a tiny input, and time it
    _run_kernel(fn, np.zeros((1, 1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32), np.zeros(0, np.int64),
                np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((1, 1, 0, 1), np.float32), np.zeros(0, np.int64),
                np.ones((1, 1, 1), np.float32), np.ones((1, 1), np.float32), None, None, None, (0, 1, 2))
    seconds = time.perf_counter() - t
    if seconds > ANNOUNCE_AFTER:
        print(f"probe: compiled the statistics kernel in {seconds:.1f} s (cached for later runs)", file=sys.stderr)
    return fn


def kernel_sums(a: torch.Tensor, keys: torch.Tensor, key_cols: list[int], diagonals: list[tuple[int, int]],
                positional: torch.Tensor, pos_cols: list[int], row_weights: torch.Tensor, real_rows: torch.Tensor,
                norms: torch.Tensor | None, scores_values: torch.Tensor | None, scores_top: torch.Tensor | None,
                special: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, bool]:
    """Every statistic's sum over the real rows of maps ``a`` in one compiled pass:
    ``(sums, norm_sums, empty, finite)`` as :func:`probe.measures.stats.map_sums` returns them
    (sums [heads, statistics] float64 on the CPU), and whether every real row's entropy from the
    scores was finite (False: the caller computes again without scores, as the torch path does).

    Per query row i of head h (float64; A as read, N_j = A_j n_j, Z = sum_j N_j): per-key channels
    sum_j A_j k_c(j) (``keys`` [batch, channels + 1, key], the last channel all ones: the row total),
    diagonals A[i, i + offset] ((statistic column, offset) pairs), per-row weight vectors sum_j A_j
    p_c(i, j) (``positional`` [batch, rows, channels, key]), max_j A_j, and the entropy: from the
    scores (``scores_values`` [batch, heads, rows, key], ``scores_top`` [batch, heads, rows]) as
    ln Z_A sum_j A - sum_j A s with ln Z_A = top - ln max_j A, less the row's float32 rounding
    sum_j A - 1; without them -sum_j A ln A. N~'s values are N's divided by Z (0 where Z = 0: the
    row is ``empty``; NaN stays NaN). Rows with ``real_rows`` 0 add nothing; the others add each
    value times ``row_weights`` [batch, rows, statistics]. ``special`` = the columns of the entropy,
    the normalized entropy and the max weight. A statistic no channel fills is 0.

    Args:
        a: [batch, heads, rows, key] float32 on the CPU.
        norms: [batch, heads, key] value norms n_j (hidden-state units), or None (A only).

    Raises:
        RuntimeError: numba is not installed (:func:`stats_path` says ``torch`` then).
    """
    fn = _compiled()
    if fn is None:
        raise RuntimeError("the statistics kernel needs numba (pip install numba)")
    part, empty, bad = _run_kernel(
        fn, _np(a), _np(keys), np.asarray(key_cols, np.int64), np.asarray([c for c, _ in diagonals], np.int64),
        np.asarray([o for _, o in diagonals], np.int64), _np(positional), np.asarray(pos_cols, np.int64),
        _np(row_weights), _np(real_rows), None if norms is None else _np(norms),
        None if scores_values is None else _np(scores_values[..., :a.shape[-1]]),
        None if scores_top is None else _np(scores_top), special)
    sums = torch.from_numpy(part.sum(0))  # [heads, 2, statistics]: the batch's rows added in order
    if norms is None:
        return sums[:, 0].contiguous(), None, None, not bad
    return sums[:, 0].contiguous(), sums[:, 1].contiguous(), torch.from_numpy(empty), not bad


def _np(x: torch.Tensor) -> np.ndarray:
    """A contiguous float32 numpy view (a copy where needed) of a CPU tensor."""
    return np.ascontiguousarray(x.detach().to(torch.float32).numpy())


def _run_kernel(fn, a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
                norms, scores_values, scores_top, special):
    B, H, R, K = a.shape
    S = row_weights.shape[-1]
    with_norms = norms is not None
    scored = scores_values is not None
    part = np.zeros((B, H, 2, S), np.float64)
    empty = np.zeros((B, H, R), np.bool_)
    bad = np.zeros(B * H, np.bool_)
    dummy3 = np.zeros((1, 1, 1), np.float32)
    fn.set_threads(torch.get_num_threads())  # as many threads as torch's operations
    fn.statistics_kernel(a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
                         norms if with_norms else dummy3, with_norms,
                         scores_values if scored else np.zeros((1, 1, 1, 1), np.float32),
                         scores_top if scored else dummy3, scored, np.asarray(special, np.int64), part, empty, bad)
    return part, empty, bool(bad.any())
