"""The compiled pass of :mod:`probe.measures.kernel` (numba): imported only where numba is installed,
by the first statistics that take the kernel path (:func:`probe.measures.kernel.stats_path`).

Parallel over (batch, head) pairs; each pair writes its own row of ``part``, so the sums do not
depend on the number of threads. ``cache=True``: compiled once per machine (numba's cache beside
this file, or in the user's cache folder where that is not writable).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

#: Floating-point liberties the sums take: reassociation (vectorized dot products) and fused
#: multiply-adds; never the assumption that no value is NaN or infinite (a removed head's NaN stays NaN).
FASTMATH = {"reassoc", "contract"}


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _dot(x, w, n):
    """sum_j x[j] w[j] over the first n entries (float64)."""
    s = 0.0
    for j in range(n):
        s += x[j] * w[j]
    return s


@njit(cache=True, inline="always")
def _top(x, n):
    """max_j x[j] of non-negative x (0 for n = 0)."""
    m = 0.0
    for j in range(n):
        if x[j] > m:
            m = x[j]
    return m


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _xlogx(x, n):
    """sum_j x[j] ln x[j], 0 ln 0 = 0 (NaN stays NaN)."""
    s = 0.0
    for j in range(n):
        if x[j] != 0.0:
            s += x[j] * np.log(x[j])
    return s


@njit(parallel=True, cache=True, nogil=True, fastmath=FASTMATH)
def statistics_kernel(a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
                      norms, with_norms, scores_values, scores_top, scored, special, part, empty, bad):
    """Add each real row's statistics, times its row weights, into ``part`` [batch, heads, 2, statistics]
    float64 (index 2: A, then N~), set ``empty`` [batch, heads, rows] where N sums to 0 and ``bad``
    [batch * heads] where an entropy from the scores is not finite: the arithmetic of
    :func:`probe.measures.kernel.kernel_sums` (which documents the arguments), per (batch, head) pair
    in parallel. Numbers are read as float64 (a [batch, heads, rows, key] float32 map); nothing is returned.
    """
    B, H, R, K = a.shape
    C1 = keys.shape[1]
    P = positional.shape[2]
    D = diag_cols.shape[0]
    S = row_weights.shape[2]
    ent_col, nent_col, max_col = special[0], special[1], special[2]
    for bh in prange(B * H):
        b = bh // H
        h = bh - b * H
        acc = np.zeros((2, C1))
        pacc = np.zeros((2, P))
        vals = np.zeros((2, S))
        nlogn = np.zeros(K)
        ns = np.zeros(K)
        xs = np.zeros(K)
        ys = np.zeros(K)
        pw = np.zeros(K)
        kw = np.empty((C1, K))
        for c in range(C1):
            for j in range(K):
                kw[c, j] = np.float64(keys[b, c, j])
        if with_norms:
            for j in range(K):
                n = np.float64(norms[b, h, j])
                ns[j] = n
                nlogn[j] = 0.0 if n == 0.0 else n * np.log(n)
        for r in range(R):
            real = real_rows[b, r] != 0
            if not real:
                if with_norms:  # a padded row adds nothing; only whether its N sums to 0
                    z = 0.0
                    for j in range(K):
                        z += np.float64(a[b, h, r, j]) * np.float64(norms[b, h, j])
                    empty[b, h, r] = z == 0.0
                continue
            for j in range(K):  # the row as float64: A, and N = A n
                xs[j] = np.float64(a[b, h, r, j])
            if with_norms:
                for j in range(K):
                    ys[j] = xs[j] * ns[j]
            for c in range(C1):
                acc[0, c] = _dot(xs, kw[c], K)
                if with_norms:
                    acc[1, c] = _dot(ys, kw[c], K)
            for p in range(P):
                for j in range(K):
                    pw[j] = np.float64(positional[b, r, p, j])
                pacc[0, p] = _dot(xs, pw, K)
                if with_norms:
                    pacc[1, p] = _dot(ys, pw, K)
            top_a = _top(xs, K)
            top_n = _top(ys, K) if with_norms else 0.0
            a_nlogn = 0.0  # sum A n ln n (scores)
            if scored:
                m = np.float64(scores_top[b, h, r])
                for j in range(K):
                    pw[j] = np.float64(scores_values[b, h, r, j]) - m
                log_a = _dot(xs, pw, K)  # sum A (s - m)
                log_n = _dot(ys, pw, K) if with_norms else 0.0  # sum N (s - m)
                if with_norms:
                    a_nlogn = _dot(xs, nlogn, K)
            else:
                log_a = _xlogx(xs, K)  # sum A ln A
                log_n = _xlogx(ys, K) if with_norms else 0.0  # sum N ln N
            total_a = acc[0, C1 - 1]
            z = acc[1, C1 - 1]
            zlogz = 0.0 if z == 0.0 else z * np.log(z)
            if scored:
                lead = -np.log(top_a) - (total_a - 1.0)  # ln Z_A - m, less the row's rounding
                ent_a = lead * total_a - log_a
                ent_n = zlogz + z * lead - log_n - a_nlogn
                if not (np.isfinite(ent_a) and (np.isfinite(ent_n) or not with_norms)):
                    bad[bh] = True
            else:
                ent_a = -log_a
                ent_n = zlogz - log_n
            if total_a != total_a:  # a NaN row (a removed head): its max is NaN too
                top_a = np.nan
            if z != z:
                top_n = np.nan
            G = 2 if with_norms else 1
            for g in range(G):
                vals[g, :] = 0.0
                for c in range(C1 - 1):
                    vals[g, key_cols[c]] = acc[g, c]
                for p in range(P):
                    vals[g, pos_cols[p]] = pacc[g, p]
            for d in range(D):
                j = r + diag_offsets[d]
                if 0 <= j < K:
                    x = np.float64(a[b, h, r, j])
                    vals[0, diag_cols[d]] = x
                    if with_norms:
                        vals[1, diag_cols[d]] = x * np.float64(norms[b, h, j])
            vals[0, ent_col] = ent_a
            vals[0, nent_col] = ent_a
            vals[0, max_col] = top_a
            if with_norms:
                vals[1, ent_col] = ent_n
                vals[1, nent_col] = ent_n
                vals[1, max_col] = top_n
                empty[b, h, r] = z == 0.0
                inv = 0.0 if z == 0.0 else 1.0 / z
                for c in range(S):
                    vals[1, c] *= inv
            for g in range(G):
                for c in range(S):
                    part[b, h, g, c] += vals[g, c] * np.float64(row_weights[b, r, c])


def set_threads(n: int) -> None:
    """Run the kernel on ``n`` threads (at most numba's pool, ``NUMBA_NUM_THREADS``; at least 1)."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
