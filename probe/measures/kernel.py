"""The per-head statistics of one call as one compiled pass over its maps (numba), beside the torch
path of :func:`probe.measures.stats.map_sums` (defined in docs/statistics.md).

:func:`probe.measures.stats.map_sums` runs some 65 small tensor operations per site and batch; on
short texts their dispatch, not their arithmetic, is the time. :func:`kernel_sums` reads each
probability once and keeps, per query row, every statistic of the attention map A and of the
value-weighted map N~ (Kobayashi et al. 2020) in float64, then adds the real rows with their
weights: the same sums as the torch path (which stays the reference in the tests and the fallback).
The statistics are those of Clark et al. 2019 (sections 3-4), Kovaleva et al. 2019 and Voita et al.
2019, defined in :func:`probe.measures.statweights.contraction_weights`.

The kernel is plain Python (:func:`statistics_kernel`, runnable as it is, slowly) compiled by numba
on first use. Which path runs is decided in one place, :func:`stats_path`: the kernel where numba
imports and the maps are float32 on the CPU, unless the environment variable :data:`PATH_ENV` is
``torch``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..threads import torch_threads_kept

#: Environment variable choosing the statistics' path: ``torch`` (the tensor operations), ``kernel``
#: (the compiled pass where it applies) or unset (the same as ``kernel``).
PATH_ENV = "PROBE_STATS_PATH"
#: The paths :func:`stats_path` chooses from.
PATHS = ("torch", "kernel")
#: Maps of at least this many probabilities (batch x heads x rows x keys) are shared among torch's
#: threads (numba's parallel loop over (batch, head) pairs) when torch has more than one; smaller ones,
#: and every map under one thread, run on the calling thread alone.
PARALLEL_FROM = 2 ** 18
#: The first call's compile (or cache load) is announced on stderr when it takes longer than this (seconds).
ANNOUNCE_AFTER = 1.0


def stats_path(a: torch.Tensor, requested: str | None = None) -> str:
    """Which path computes the statistics of maps ``a`` ([batch, heads, query, key]): ``"kernel"``
    where numba imports, ``a`` is float32 on the CPU and neither ``requested`` nor the environment
    variable :data:`PATH_ENV` says ``torch``; else ``"torch"`` (GPU and MPS maps, numba missing).
    The one place the choice is made; a fallback is silent (the numbers are the same), except a
    kernel that fails to compile, said once in one line on stderr (:func:`_compiled`).

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
    """The compiled kernel (:class:`Compiled`; numba's cache on disk: compiled once per machine), or
    None without numba or where it fails to compile (said in one line on stderr)."""
    t = time.perf_counter()
    try:
        import numba  # deferred: imported (0.3-0.6 s) by the first statistics on the kernel path only
    except ImportError:
        return None
    try:
        fn = _jit(numba)
        # the first call compiles (or loads numba's cache): do it here, on a tiny input, and time it; the
        # parallel kernel only where torch has more than one thread (else compiled when it is first needed)
        for parallel in (False, True)[:1 + (torch.get_num_threads() > 1)]:
            with torch_threads_kept():  # the first parallel call starts numba's pool (probe.threads)
                _run_kernel(fn, np.zeros((1, 1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32),
                            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                            np.zeros((1, 1, 0, 1), np.float32), np.zeros(0, np.int64), np.ones((1, 1, 1), np.float32),
                            np.ones((1, 1), np.float32), None, None, None, (0, 1, 2), parallel)
    except Exception as err:  # numba present but unable to compile here: the tensor operations, the same numbers
        print(f"probe: the statistics kernel did not compile ({type(err).__name__}); the statistics use "
              "the tensor operations", file=sys.stderr)
        return None
    seconds = time.perf_counter() - t
    if seconds > ANNOUNCE_AFTER:
        compiled = any(k.stats.cache_misses for k in (fn.statistics_kernel, fn.statistics_kernel_serial))
        what = "compiled the statistics kernel (cached for later runs)" if compiled else \
            "loaded the statistics kernel from numba's cache"
        print(f"probe: {what} in {seconds:.1f} s", file=sys.stderr)
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
                norms, scores_values, scores_top, special, parallel: bool | None = None):
    B, H, R, K = a.shape
    S = row_weights.shape[-1]
    with_norms = norms is not None
    scored = scores_values is not None
    part = np.zeros((B, H, 2, S), np.float64)
    empty = np.zeros((B, H, R), np.bool_)
    bad = np.zeros(B * H, np.bool_)
    dummy3 = np.zeros((1, 1, 1), np.float32)
    threads = torch.get_num_threads()  # as many threads as torch's operations
    if parallel is None:
        parallel = threads > 1 and a.size >= PARALLEL_FROM
    if parallel:
        fn.set_threads(threads)
        kernel = fn.statistics_kernel
    else:  # one thread, or a map too small to share: no thread pool (whose idle workers may spin)
        kernel = fn.statistics_kernel_serial
    kernel(a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
           norms if with_norms else dummy3, with_norms,
           scores_values if scored else np.zeros((1, 1, 1, 1), np.float32),
           scores_top if scored else dummy3, scored, np.asarray(special, np.int64), part, empty, bad)
    return part, empty, bool(bad.any())


@dataclass(frozen=True)
class Compiled:
    """numba's compiled :func:`statistics_kernel` (parallel) and :func:`statistics_kernel_serial`, and
    how to set the parallel one's threads."""

    statistics_kernel: Callable
    statistics_kernel_serial: Callable
    numba: object

    def set_threads(self, n: int) -> None:
        """Run the kernel on ``n`` threads (at most numba's pool, ``NUMBA_NUM_THREADS``; at least 1)."""
        n = max(1, min(int(n), self.numba.config.NUMBA_NUM_THREADS))
        with torch_threads_kept():  # the first call starts numba's pool (probe.threads)
            if self.numba.get_num_threads() != n:
                self.numba.set_num_threads(n)


def _jit(numba) -> Compiled:
    """Compile the kernel with numba (``cache=True``: numba's cache beside this file, or in the user's
    cache folder where that is not writable). The helpers become numba functions in this module's
    namespace, where the kernel finds them when it is compiled; ``prange`` becomes numba's parallel range."""
    space = globals()
    options = {"_work_shape": {}, "_dot": {"fastmath": FASTMATH, "inline": "always"}, "_top": {"inline": "always"},
               "_xlogx": {"fastmath": FASTMATH, "inline": "always"}, "_pair": {"nogil": True, "fastmath": FASTMATH}}
    for name, kw in options.items():
        if not hasattr(space[name], "py_func"):  # not yet numba's (a second call keeps the first's)
            space[name] = numba.njit(cache=True, **kw)(space[name])
    space["prange"] = numba.prange
    return Compiled(numba.njit(parallel=True, cache=True, nogil=True)(statistics_kernel),
                    numba.njit(cache=True, nogil=True)(statistics_kernel_serial), numba)


#: The kernel's parallel range: ``range`` in Python, numba's ``prange`` once compiled (:func:`_jit`).
prange = range


#: Floating-point liberties the compiled sums take: reassociation (vectorized dot products) and fused
#: multiply-adds; never the assumption that no value is NaN or infinite (a removed head's NaN stays NaN).
FASTMATH = {"reassoc", "contract"}


def _dot(work, i, k, n):
    """sum_j work[i, j] work[k, j] over the first n entries (rows of one buffer: no array view, whose
    reference count would cost more than the product on short rows)."""
    s = 0.0
    for j in range(n):
        s += work[i, j] * work[k, j]
    return s


def _top(work, i, n):
    """max_j work[i, j] of non-negative entries (0 for n = 0)."""
    m = 0.0
    for j in range(n):
        if work[i, j] > m:
            m = work[i, j]
    return m


def _xlogx(work, i, n):
    """sum_j x_j ln x_j of x = work[i, :n], 0 ln 0 = 0 (NaN stays NaN)."""
    s = 0.0
    for j in range(n):
        x = work[i, j]
        if x != 0.0:
            s += x * np.log(x)
    return s


def statistics_kernel(a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
                      norms, with_norms, scores_values, scores_top, scored, special, part, empty, bad):
    """Add each real row's statistics, times its row weights, into ``part`` [batch, heads, 2, statistics]
    float64 (index 2: A, then N~), set ``empty`` [batch, heads, rows] where N sums to 0 and ``bad``
    [batch * heads] where an entropy from the scores is not finite: the arithmetic of
    :func:`kernel_sums` (which documents the arguments), the (batch, head) pairs in parallel
    (:func:`_pair`). Numbers are read as float64 (a [batch, heads, rows, key] float32 map).
    """
    B, H = a.shape[0], a.shape[1]
    for bh in prange(B * H):
        work = np.empty(_work_shape(a, keys, positional, row_weights))  # each pair its own
        _pair(bh, a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
              norms, with_norms, scores_values, scores_top, scored, special, part, empty, bad, work)


def statistics_kernel_serial(a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights,
                             real_rows, norms, with_norms, scores_values, scores_top, scored, special, part, empty,
                             bad):
    """:func:`statistics_kernel` on the calling thread alone (no thread pool: one torch thread, small maps)."""
    B, H = a.shape[0], a.shape[1]
    work = np.empty(_work_shape(a, keys, positional, row_weights))  # one buffer for every pair
    for bh in range(B * H):
        _pair(bh, a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
              norms, with_norms, scores_values, scores_top, scored, special, part, empty, bad, work)


def _work_shape(a, keys, positional, row_weights):
    """The shape of :func:`_pair`'s float64 scratch buffer: 11 + channels rows of the longest of keys,
    statistics, channels."""
    return (11 + keys.shape[1], max(a.shape[3], row_weights.shape[2], keys.shape[1], positional.shape[2], 1))


def _pair(bh, a, keys, key_cols, diag_cols, diag_offsets, positional, pos_cols, row_weights, real_rows,
          norms, with_norms, scores_values, scores_top, scored, special, part, empty, bad, work):
    """The rows of one (batch, head) pair, ``bh`` = batch x heads + head: :func:`statistics_kernel`;
    ``work`` a scratch buffer (:func:`_work_shape`, no allocation per pair)."""
    B, H, R, K = a.shape
    C1 = keys.shape[1]
    P = positional.shape[2]
    D = diag_cols.shape[0]
    S = row_weights.shape[2]
    ent_col, nent_col, max_col = special[0], special[1], special[2]
    b = bh // H
    h = bh - b * H
    # rows of work: 0-1 the per-key channel sums of A and N, 2-3 the per-row weight vector sums, 4-5 the
    # row's statistics of A and N~, 6 n ln n, 7 n, 8 the row of A, 9 of N, 10 a weight vector, 11.. the
    # per-key weights (float64)
    acc, pacc, vals = work[0:2], work[2:4], work[4:6]
    NLOGN, NS, XS, YS, PW, KW = 6, 7, 8, 9, 10, 11
    for c in range(C1):
        for j in range(K):
            work[KW + c, j] = np.float64(keys[b, c, j])
    if with_norms:
        for j in range(K):
            n = np.float64(norms[b, h, j])
            work[NS, j] = n
            work[NLOGN, j] = 0.0 if n == 0.0 else n * np.log(n)
    for r in range(R):
        real = real_rows[b, r] != 0
        if not real:
            if with_norms:  # a padded row adds nothing; only whether its N sums to 0
                z = 0.0
                for j in range(K):
                    z += np.float64(a[b, h, r, j]) * work[NS, j]
                empty[b, h, r] = z == 0.0
            continue
        for j in range(K):  # the row as float64: A, and N = A n
            work[XS, j] = np.float64(a[b, h, r, j])
        if with_norms:
            for j in range(K):
                work[YS, j] = work[XS, j] * work[NS, j]
        for c in range(C1):
            acc[0, c] = _dot(work, XS, KW + c, K)
            if with_norms:
                acc[1, c] = _dot(work, YS, KW + c, K)
        for p in range(P):
            for j in range(K):
                work[PW, j] = np.float64(positional[b, r, p, j])
            pacc[0, p] = _dot(work, XS, PW, K)
            if with_norms:
                pacc[1, p] = _dot(work, YS, PW, K)
        top_a = _top(work, XS, K)
        top_n = _top(work, YS, K) if with_norms else 0.0
        a_nlogn = 0.0  # sum A n ln n (scores)
        if scored:
            m = np.float64(scores_top[b, h, r])
            for j in range(K):
                work[PW, j] = np.float64(scores_values[b, h, r, j]) - m
            log_a = _dot(work, XS, PW, K)  # sum A (s - m)
            log_n = _dot(work, YS, PW, K) if with_norms else 0.0  # sum N (s - m)
            if with_norms:
                a_nlogn = _dot(work, XS, NLOGN, K)
        else:
            log_a = _xlogx(work, XS, K)  # sum A ln A
            log_n = _xlogx(work, YS, K) if with_norms else 0.0  # sum N ln N
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
            for c in range(S):
                vals[g, c] = 0.0
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
