"""The sums a circuit's pass adds to its inputs' streams (:mod:`probe.circuits.passplan`): for each
input row r, the sum over its terms (writer u, weight +1 or -1) of w x diff[u], one compiled pass
(numba) over the width in blocks, so that each writer's difference is read from memory once per
layer however many inputs use it, beside torch's products (the fallback: numba missing, another
dtype or device).

Measured on 2 shared CPU cores, one thread (SmolLM2, 20 pairs of 16 tokens: each difference 737 KB):
torch's sparse product costs 0.25-0.4 ms a term, its dense product [16 inputs, 150 writers] x [150,
184,320] 60-65 ms a layer whatever the weights (memory-bound at M = 16); the blocked pass 0.13 ms a
term at 5% of the weights and 0.06 ms at 50% (68 ms a layer), each writer's difference read once per
block. The pass is bound by memory (each term reads a writer's whole difference once): split over two
threads by blocks it took as long as on one (medians of 20 calls, 131 and 715 terms a layer), so it runs
on one.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

#: Columns of one block of the blocked pass (float32: 16 KiB), so that the writers a layer's inputs
#: read stay in the cache while every input's sum over them is taken.
BLOCK = 4096


def rowsums_py(indptr, indices, values, diff, out, block):
    """out[r] += sum over j in indptr[r] .. indptr[r + 1] - 1 of values[j] x diff[indices[j]] (out
    [rows, X], diff [writers, X]), block by block of ``block`` columns (the loops over views from 0
    let the compiler vectorise the innermost one). Plain Python (runnable as it is, slowly), compiled
    by numba (:func:`_compiled`)."""
    rows = len(indptr) - 1
    width = diff.shape[1]
    for b in range((width + block - 1) // block):
        start = b * block
        n = min(width, start + block) - start
        for r in range(rows):
            o = out[r, start:start + n]
            for j in range(indptr[r], indptr[r + 1]):
                d = diff[indices[j], start:start + n]
                w = values[j]
                for x in range(n):
                    o[x] += w * d[x]


@lru_cache(maxsize=1)
def _compiled():
    """The compiled pass, or None without numba (or where it fails to compile: the torch products)."""
    try:
        import numba  # deferred: imported by the first circuit pass only
    except ImportError:
        return None
    try:
        fn = numba.njit(cache=True, nogil=True, fastmath=True)(rowsums_py)  # sums of +-1 x d: exact order
        fn(np.zeros(2, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros((1, 1), np.float32),
           np.zeros((1, 1), np.float32), 1)
    except Exception:  # noqa: BLE001 - numba present but unable to compile here: torch's products, the same sums
        return None
    return fn


def csr(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr [rows + 1], indices, values float32) of ``weights`` [rows, writers]'s nonzero terms."""
    rows, cols = np.nonzero(weights)
    indptr = np.zeros(weights.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=weights.shape[0]), out=indptr[1:])
    return indptr, cols.astype(np.int64), weights[rows, cols].astype(np.float32)


def weighted_rows(terms: tuple, diff: torch.Tensor) -> torch.Tensor | None:
    """[rows, X] the sums of ``diff`` [writers, X] (float32, CPU, contiguous) by the terms of
    :func:`csr`, by the compiled pass; None where it does not apply (the caller's torch product)."""
    fn = _compiled()
    if fn is None or diff.dtype != torch.float32 or diff.device.type != "cpu" or not diff.is_contiguous():
        return None
    indptr, indices, values = terms
    out = torch.zeros(len(indptr) - 1, diff.shape[1], dtype=diff.dtype)
    fn(indptr, indices, values, diff.numpy(), out.numpy(), BLOCK)
    return out
