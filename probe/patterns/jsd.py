"""The Jensen-Shannon divergence of every pair of heads on the same query rows, batched, and its
estimate from a fixed-seed sample of query rows per sequence (with the standard error).

Per query row r and heads h, g (bits; the definition is in docs/statistics.md, "Head distance and
redundancy")::

    JS_r(h, g) = [H(m) - (H(p) + H(q)) / 2] / ln 2,   m = (p + q) / 2,   H in nats
               = [-cross / 2 + ln 2 * (mass_h + mass_g) / 2 - (ent_h + ent_g) / 2] / ln 2

with, over the row's visible keys, ``cross = sum (p + q) ln(p + q)``, ``ent = sum -p ln p`` and
``mass = sum p`` (1 up to rounding). :func:`row_js` computes ``cross`` for every pair at once (one
broadcast sum over a shifted view of the heads, one ``log``, one product and one sum per chunk of
rows; no loop over pairs).

Sampling (:func:`sample_rows`, :class:`Estimate`): the corpus mean over all N real rows is
estimated from k rows drawn per sequence without replacement (a generator seeded by the sequence's
corpus index, so the sample does not depend on batching or on the other sequences), each sequence
a stratum weighted by its row count n_s::

    mean = sum_s n_s * mean_{sampled rows of s} JS_r / N
    se^2 = sum_s n_s^2 * (1 - k_s / n_s) * S_s^2 / k_s / N^2

where S_s^2 is the sample variance of JS_r over the k_s sampled rows of sequence s (the standard
stratified-sampling estimator with the finite-population correction, Cochran 1977, ch. 5). A
sequence of at most k rows is taken whole and adds no error; with no sample (``k`` None) every row
is taken and the standard error is 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch

LN2 = math.log(2.0)

#: Added to every probability in the pair sums so that p + q > 0 (a 0 then gives 2e-30 ln 2e-30,
#: about -1e-28, instead of 0 ln 0 = NaN): below float32 resolution of any sum of real rows.
TINY = 1e-30
#: Elements (rows x keys x heads^2 / 2) of one chunk of :func:`row_js` (two float32 buffers of 1 MiB, in the CPU cache).
CHUNK_ELEMENTS = 1 << 18
#: Seed of the row sample (with each sequence's corpus index).
SEED = 19

_PAIRS: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def pairs(K: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column indices ([K (K - 1) / 2] long each) of the upper triangle of a K x K matrix,
    row-major: pair p is (I[p], J[p]) with I < J."""
    key = (K, str(device))
    if key not in _PAIRS:
        I, J = torch.triu_indices(K, K, 1, device=device)
        _PAIRS[key] = (I.contiguous(), J.contiguous())
    return _PAIRS[key]


def _log(src: torch.Tensor, out: torch.Tensor) -> None:
    """``out = ln(src)``; on the CPU by NumPy (its vectorized float32 log measured 3-4x faster than torch's here)."""
    if src.device.type == "cpu":
        np.log(src.numpy(), out=out.numpy())
    else:
        torch.log(src, out=out)


_BUFFERS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _buffers(device, n: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 work buffers of at least ``n`` (and :data:`CHUNK_ELEMENTS`) elements on ``device``,
    kept between calls: allocating megabytes anew each call costs page faults (measured: as much as
    the sum itself)."""
    key = str(device)
    have = _BUFFERS.get(key)
    if have is None or have[0].numel() < max(n, CHUNK_ELEMENTS):
        size = max(n, CHUNK_ELEMENTS)
        have = _BUFFERS[key] = (torch.empty(size, device=device), torch.empty(size, device=device))
    return have


def _mul(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a *= b`` (NumPy on the CPU: measured faster than torch's in-place product on these buffers)."""
    if a.device.type == "cpu":
        np.multiply(a.numpy(), b.numpy(), out=a.numpy())
    else:
        a.mul_(b)


def _folded(K: int, device=None) -> torch.Tensor:
    """For each pair p of :func:`pairs`, its index in the folded layout [K // 2, K] of :func:`row_js`,
    where entry (d - 1, i) holds heads (i, (i + d) mod K), d = 1..K // 2."""
    I, J = pairs(K)
    d = J - I  # (cached by pairs(); this runs once per call on K^2 / 2 entries)
    wrap = d > K // 2  # (i, j) with j - i > K / 2 is (j, j + (K - d) mod K)
    shift = torch.where(wrap, K - d, d)
    first = torch.where(wrap, J, I)
    return ((shift - 1) * K + first).to(device)


def _shifted(v: torch.Tensor, D: int) -> torch.Tensor:
    """[..., K] -> [..., D, K] view whose entry (d - 1, i) is v[..., (i + d) mod K] (d = 1..D), on a
    doubled copy of v; no copy per shift."""
    K = v.shape[-1]
    twice = torch.cat([v, v], -1).contiguous()
    lead = twice.shape[:-1]
    strides = list(twice.stride()[:-1])
    return twice.as_strided((*lead, D, K), (*strides, 1, 1), 1)


def row_js(x: torch.Tensor, n_keys: torch.Tensor) -> torch.Tensor:
    """Per-row Jensen-Shannon divergence (bits) of every pair of heads, all pairs at once.

    Args:
        x: [rows, keys, heads] attention probabilities of each head on the same query rows; row r
            sees keys 0..n_keys[r]-1 (a prefix: batches are right-padded, later keys of a causal row
            are 0), the other entries are ignored.
        n_keys: [rows] visible keys of each row.

    Returns:
        [rows, K // 2 * K] float64 in the folded layout: entry (d - 1) * K + i is heads (i, (i + d) mod K),
        d = 1..K // 2 (each pair once, twice for d = K / 2); :func:`to_matrix` unfolds it. Not clipped.

    Method: one broadcast sum of the probabilities with a strided view of them shifted by d
    ([rows, keys, K // 2, K]: about rows x keys x heads^2 / 2 elements, no copy of the pairs, no
    loop over heads or pairs), one logarithm, one product and one sum over the keys, per chunk of
    rows of similar key counts (at most :data:`CHUNK_ELEMENTS` elements); the rows' entropies and
    masses are paired by the same shift. On an Apple MPS device, which has no float64, the rows are
    computed on the CPU.
    """
    if x.device.type == "mps":
        x = x.cpu()
    return _row_js(x, n_keys)


def _row_js(x: torch.Tensor, n_keys: torch.Tensor) -> torch.Tensor:
    R, T, K = x.shape
    dev = x.device
    D = K // 2
    n_keys = n_keys.to(dev)
    x = x.float() * (torch.arange(T, device=dev)[None, :] < n_keys[:, None])[:, :, None]  # ignored entries: 0
    ent = torch.special.entr(x).sum(1, dtype=torch.float64)  # [R, K] nats
    mass = x.sum(1, dtype=torch.float64)
    out = torch.zeros(R, D, K, dtype=torch.float64, device=dev)
    order = torch.argsort(n_keys).tolist()
    counts = n_keys.tolist()
    m, ln = _buffers(dev)
    start = 0
    while D and start < R:
        chunk = order[start:start + max(1, CHUNK_ELEMENTS // (max(1, counts[order[start]]) * D * K))]
        w = max(1, counts[chunk[-1]])  # the widest row of the chunk (sorted by key count)
        r = len(chunk)
        if r * w * D * K > m.numel():
            m, ln = _buffers(dev, r * w * D * K)
        xc = x[chunk, :w] + TINY  # [r, w, K]
        mc, lc = m[:r * w * D * K].view(r, w, D, K), ln[:r * w * D * K].view(r, w, D, K)
        torch.add(xc[:, :, None], _shifted(xc, D), out=mc)  # p + q
        _log(mc, lc)
        _mul(mc, lc)  # (p + q) ln(p + q)
        cross = mc.sum(1).double()  # [r, D, K] sum over keys of (p + q) ln(p + q)
        e, ms = ent[chunk], mass[chunk]  # the pair's entropies and masses, paired by the same shift
        h_m = (ms[:, None] + _shifted(ms, D)).mul_(LN2 / 2).sub_(cross / 2)  # sum over keys of H(m), nats
        out[chunk] = h_m.sub_((e[:, None] + _shifted(e, D)) / 2).div_(LN2)
        start += r
    return out.reshape(R, D * K)


def to_matrix(values: np.ndarray, K: int) -> np.ndarray:
    """[..., K // 2 * K] values in the folded layout of :func:`row_js` as [..., K, K] symmetric matrices
    (diagonal 0)."""
    I, J = (t.numpy() for t in pairs(K))
    paired = np.asarray(values)[..., _folded(K).numpy()]
    out = np.zeros(paired.shape[:-1] + (K, K))
    out[..., I, J] = paired
    out[..., J, I] = paired
    return out


def folded_size(K: int) -> int:
    """Entries of the folded layout of :func:`row_js` for K heads."""
    return (K // 2) * K


def sample_rows(index: int, n: int, k: int | None, seed: int = SEED) -> np.ndarray:
    """Sorted rows (0..n-1) sampled for the sequence of corpus index ``index``: all when ``k`` is None
    or n <= k, else k drawn without replacement by a generator seeded with (``seed``, index)."""
    if k is None or n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng([int(seed), int(index)]).choice(n, k, replace=False))


class Estimate:
    """Running stratified estimate of a corpus mean per pair (float64; merges by addition).

    Args:
        shape: leading shape (e.g. [sites]) of the estimates; each holds ``pairs`` values.
        pairs: pairs per estimate.
    """

    def __init__(self, shape: tuple[int, ...], pairs: int) -> None:
        self.total = torch.zeros(*shape, pairs, dtype=torch.float64)  # sum_s n_s * mean_s
        self.var = torch.zeros(*shape, pairs, dtype=torch.float64)  # sum_s n_s^2 (1 - k/n) S^2 / k
        self.rows = torch.zeros(shape, dtype=torch.int64)  # N: every real row

    def add(self, where, seq_sum: torch.Tensor, seq_sq: torch.Tensor, n: torch.Tensor, k: torch.Tensor) -> None:
        """Fold in sequences: ``seq_sum``/``seq_sq`` [seqs, pairs] sums of JS_r and JS_r^2 over their
        sampled rows, ``n``/``k`` [seqs] their rows and sampled rows (sequences with k = 0 add nothing)."""
        n, k = n.double()[:, None], k.double()[:, None]
        kk = k.clamp(min=1)
        mean = seq_sum / kk
        s2 = ((seq_sq - seq_sum * mean) / (k - 1).clamp(min=1)).clamp(min=0)
        var = torch.where(k < n, n * n * (1 - k / n) * s2 / kk, torch.zeros_like(s2))
        self.total[where] += (n * mean).sum(0)
        self.var[where] += var.sum(0)
        self.rows[where] += int(n[k > 0].sum())

    def merge(self, other: Estimate) -> None:
        self.total += other.total
        self.var += other.var
        self.rows += other.rows

    def mean_se(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard error) per pair, [..., pairs]; NaN where no row was counted. The mean is
        clipped to [0, 1] (float rounding can leave -1e-9 on identical heads)."""
        rows = self.rows.double()[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (self.total / rows).numpy()
            se = (self.var.sqrt() / rows).numpy()
        return np.clip(mean, 0.0, 1.0), se
