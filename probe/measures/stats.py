"""Per-head attention statistics (defined in docs/statistics.md), as an accumulator.

Definitions follow Clark et al. 2019 ("What Does BERT Look At?", sections 3-4), Kovaleva et al.
2019 and Voita et al. 2019; the exact per-row definitions are in the docstring of
:func:`probe.measures.statweights.contraction_weights`. Corpus values are token-weighted means over real
query rows, kept as running sums and counts (:class:`HeadStatistics`) so memory does not grow with
the corpus and partial results merge across batches, processes or machines.

Every statistic is also computed, by the same code (:func:`map_sums`), on the value-weighted map
N~ of Kobayashi et al. 2020 (:mod:`probe.capture.values`): the column ``<statistic>_by_norm``, with
``norm_mass``, the mean norm of the head's output.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..capture.op import Scores
from ..capture.values import ValueNorms
from ..loading.seq2seq import sides
from ..sites import Site
from ..text.inputs import Batch
from .accumulators import Accumulator, sum_device
from .kernel import kernel_sums, stats_path
from .statweights import (  # re-exported: the statistics' names and definitions
    ALIGN_WINDOW,
    ALL_STATISTICS,
    CROSS_STATISTICS,
    INDEX,
    LINEAR,
    LONG_RANGE,
    STATISTICS,
    ContractionWeights,
    TokenFeatures,
    boundary_token_id,
    contraction_weights,
    token_features,
)

__all__ = [
    "ALIGN_WINDOW", "ALL_STATISTICS", "BY_NORM", "CROSS_STATISTICS", "LINEAR", "LONG_RANGE", "NORM_MASS",
    "STATISTICS", "ContractionWeights", "HeadStatistics", "TokenFeatures", "boundary_token_id", "by_norm",
    "contraction_weights", "map_sums", "token_features",
]

#: Suffix of a statistic computed on the value-weighted map N~ (``first_by_norm``).
BY_NORM = "_by_norm"
#: Column of the mean norm of a head's output, ||sum_j A[i, j] f_h(x_j)|| (hidden-state units).
NORM_MASS = "norm_mass"


def by_norm(name: str) -> str:
    """The column of statistic ``name`` computed on the value-weighted map (``first`` -> ``first_by_norm``)."""
    return name + BY_NORM


def map_sums(a: torch.Tensor, w: ContractionWeights, norms: torch.Tensor | None = None,
             scores: Scores | None = None, path: str | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Every statistic's sum over the valid rows of one batch of maps (or of one row block of them),
    for the attention probabilities A and, with ``norms``, for the value-weighted map N~ of the same
    call: ``(sums, norm_sums, empty)``, sums and norm_sums [heads, len(ALL_STATISTICS)] float64 on
    ``a``'s device (the CPU for an MPS device, which has no float64:
    :func:`probe.measures.accumulators.sum_device`; a statistic the site's kind lacks: 0); without
    ``norms``, norm_sums and empty are None.

    The one implementation of the statistics. Each query row's value of every statistic is computed
    in float32 (a matrix product with the per-key weights, diagonals, per-row weight vectors, the
    row's entropy and its max: :class:`~probe.measures.statweights.ContractionWeights`), then the
    rows are added in float64 with their weights: row blocks give the same per-row values as whole
    maps, and a long map's sum does not lose digits. Padded query rows are set to 0 before any sum,
    whatever they hold (a half-precision model returns them uniform; a fully masked row may be NaN).

    The value-weighted map is never built: its row values are those of N[i, j] = A[i, j] n_j
    (n_j = ||f_h(x_j)||) divided by the row's total Z_i = sum_j N[i, j] (each statistic of N~ is
    linear in the row, or its max), computed beside A's in the same operations. The entropy of a
    row comes from the scores its softmax read where ``scores`` are given and the map has at least
    :data:`SCORED_FROM` probabilities (no logarithm over the map): with ln Z_A = top - ln max_j
    A[i, j] the row's log normalizer, ``-sum A ln A = ln Z_A sum_j A - sum_j A s`` and ``-sum N~ ln
    N~ = ln Z + ln Z_A - (sum_j N s + sum_j A n ln n) / Z`` (:func:`_entropy_from_scores`); else
    (eager maps, an edited pattern, scores that are not finite, a small map on the torch path) from ln A.

    Args:
        a: [batch, heads, query, key] float32 maps whose real rows sum to 1 (or are all 0); maps of
            a half-precision model are converted to float32 by the caller, before any statistic.
        w: the batch's :class:`~probe.measures.statweights.ContractionWeights`, on ``a``'s device.
        norms: [batch, heads, key] n_j = ||f_h(x_j)|| (:class:`~probe.capture.values.ValueNorms`), or
            None: A's statistics only.
        scores: the :class:`~probe.capture.op.Scores` A was computed from, its keys cut to ``a``'s, or None.
        path: ``"torch"`` (the tensor operations below), ``"kernel"`` (the same sums in one compiled
            pass: :mod:`probe.measures.kernel`, where it applies) or None (the environment variable
            ``PROBE_STATS_PATH``, else the kernel where it applies): :func:`probe.measures.kernel.stats_path`.

    Returns:
        empty: [batch, heads, query] bool, the rows whose N sums to 0 (no value-weighted map: all
        their values 0); NaN stays NaN (the removed heads of a pruned model).

    Raises:
        ValueError: ``path`` (or ``PROBE_STATS_PATH``) is not ``torch`` or ``kernel``.
    """
    if stats_path(a, path) == "kernel":  # the scores at every size: a product per probability, not a logarithm
        *out, finite = _kernel(a, w, norms, scores)
        if scores is not None and not finite:  # as below: a real row's entropy from the scores is not finite
            *out, _ = _kernel(a, w, norms, None)
        return tuple(out)
    return _torch_sums(a, w, norms, scores)


def _kernel(a: torch.Tensor, w: ContractionWeights, norms: torch.Tensor | None, scores: Scores | None):
    """:func:`probe.measures.kernel.kernel_sums` of one call, with ``w``'s channels as statistic columns."""
    return kernel_sums(a, w.keys, [INDEX[n] for n in w.key_names], [(INDEX[n], o) for n, o in w.diagonals],
                       w.positional, [INDEX[n] for n in w.pos_names], w.row_weights, w.real_rows, norms,
                       None if scores is None else scores.values, None if scores is None else scores.top,
                       (INDEX["entropy"], INDEX["norm_entropy"], INDEX["max_weight"]))


def _torch_sums(a: torch.Tensor, w: ContractionWeights, norms: torch.Tensor | None,
                scores: Scores | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`map_sums` by tensor operations (on any device): the reference the kernel is tested against."""
    B, H, R, K = a.shape
    if norms is None:
        parts = [a]
    elif a.numel() <= JOINT_SUMS:  # a short map: A and N side by side along the heads, one operation for both
        x = a.new_empty(B, 2 * H, R, K)
        x[:, :H] = a
        torch.mul(a, norms[:, :, None, :], out=x[:, H:])
        parts = [x]
    else:  # a long map or block: one after the other (no joint copy)
        parts = [a, a * norms[:, :, None, :]]
    columns = [_linear_values(x, w) for x in parts]
    cols = columns[0] if len(columns) == 1 else {k: torch.cat([c[k] for c in columns], 1) for k in columns[0]}
    total = cols.pop("total")  # [B, G, rows]: sum_j A, and Z = sum_j N
    # entropies, N's in units of its row total (times Z: N's row values are all divided by Z below)
    if scores is not None and a.numel() >= SCORED_FROM:
        entropy = _entropy_from_scores(parts, a, norms, scores, cols["max_weight"], total, w)
    else:
        entropy = None
    if entropy is None:
        entropy = torch.cat([_row_entropy(x) for x in parts], 1)
        if norms is not None:  # Z (-sum N~ ln N~) = -sum_j N ln N + Z ln Z
            entropy[:, H:] += torch.special.xlogy(total[:, H:], total[:, H:])
    cols["entropy"] = cols["norm_entropy"] = entropy
    zero = a.new_zeros(()).expand_as(total)
    vals = torch.stack([cols.get(name, zero) for name in ALL_STATISTICS], -1)  # [B, G, rows, statistics]
    empty = None
    if norms is not None:  # N~'s row values: N's divided by Z (0 on rows where Z = 0; NaN stays NaN)
        Z = total[:, H:]
        empty = Z == 0
        vals[:, H:] *= (1.0 / torch.where(empty, torch.inf, Z))[..., None]
    vals.masked_fill_(w.real_rows[:, None, :, None] == 0, 0.0)  # padded rows: out before any sum
    dev = sum_device(a.device)
    sums = torch.einsum("bhrc,brc->hc", vals.to(dev, torch.float64), w.row_weights.to(dev, torch.float64))
    return (sums, None, None) if norms is None else (sums[:H], sums[H:], empty)


def _linear_values(x: torch.Tensor, w: ContractionWeights) -> dict[str, torch.Tensor]:
    """The row values of [batch, G, rows, keys] maps (A, N, or both side by side) of every statistic
    but the entropies, each [batch, G, rows] float32 (N's not yet divided by its row total), and
    each row's total sum_j x (``"total"``)."""
    B, G, R, K = x.shape
    # per-key channels and the row total: [batch, channels, keys] x [batch, keys, G * rows]
    by_key = torch.matmul(w.keys, x.reshape(B, G * R, K).transpose(1, 2)).view(B, -1, G, R)
    cols = {name: by_key[:, c] for c, name in enumerate(w.key_names)}
    cols["total"] = by_key[:, -1]
    for name, offset in w.diagonals:
        cols[name] = _diagonal(x, offset)
    if w.pos_names:
        by_row = torch.einsum("bhrk,brck->bhrc", x, w.positional)  # [B, G, rows, positional channels]
        cols.update({name: by_row[..., c] for c, name in enumerate(w.pos_names)})
    cols["max_weight"] = x.amax(-1)
    return cols


def _entropy_from_scores(parts: list[torch.Tensor], a: torch.Tensor, norms: torch.Tensor | None, scores: Scores,
                         top: torch.Tensor, total: torch.Tensor, w: ContractionWeights) -> torch.Tensor | None:
    """[B, G, rows] the entropy of every row of A (and Z times that of N~) from the scores
    (:func:`map_sums`), or None where a real row's value is not finite (then :func:`_row_entropy`).

    The scores are taken relative to the row's largest kept score m (s_j - m <= 0, 0 at the top key),
    so that a near one-hot row's small entropy is not the difference of two large numbers:
    ln Z_A - s_j = -ln max_j A - (s_j - m)."""
    B, H, R, K = a.shape
    shifted = scores.values[..., :K].float() - scores.top.float()[..., None]  # s_j - m
    lead = -torch.log(top[:, :H])  # -ln max_j A = ln Z_A - m
    dots = torch.cat([_row_dots(x, shifted) for x in parts], 1)  # sum_j A (s - m) (and sum_j N (s - m))
    # A as captured is the softmax rounded to float32, A_j = p_j (1 + e_j): its entropy is that of p,
    # sum_j A (ln Z_A - s_j), less sum_j A e_j = sum_j A - 1 (to first order): the row's rounding
    drift = total[:, :H] - 1
    entropy = (lead - drift) * total[:, :H] - dots[:, :H]
    if norms is not None:  # Z H(N~) = Z ln Z + Z (ln Z_A - m) - sum_j N (s - m) - sum_j A n ln n, less Z drift
        nlogn = torch.matmul(torch.special.xlogy(norms, norms)[:, :, None, :], a.transpose(-1, -2))[:, :, 0]
        Z = total[:, H:]
        entropy = torch.cat([entropy, torch.special.xlogy(Z, Z) + Z * (lead - drift) - dots[:, H:] - nlogn], 1)
    real = w.real_rows[:, None, :] > 0
    if not bool((torch.isfinite(entropy) | ~real).all()):
        return None
    return entropy


def _row_dots(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """sum_j x[b, g, i, j] s[b, h, i, j] of [batch, G, rows, keys] maps (G a multiple of s's heads H,
    g = c H + h), [batch, G, rows]; a chunk of rows at a time (no product of a long map is kept whole)."""
    B, G, R, K = x.shape
    H = s.shape[1]
    x5 = x.view(B, G // H, H, R, K)
    step = max(1, CHUNK // max(B * G * K, 1))
    if step >= R:
        return (x5 * s[:, None]).sum(-1).view(B, G, R)
    out = torch.empty(B, G // H, H, R, dtype=x.dtype, device=x.device)
    for r0 in range(0, R, step):
        out[..., r0:r0 + step] = (x5[..., r0:r0 + step, :] * s[:, None, :, r0:r0 + step]).sum(-1)
    return out.view(B, G, R)


#: Maps of at least this many probabilities (batch x heads x rows x keys) take their entropies from the
#: scores where given; smaller ones from ln A, whose few operations cost less there (measured on
#: minilm's and smollm2's maps: the two break even near 100,000 probabilities, and the scores save
#: about 10% of :func:`map_sums` on maps of 300,000 and more).
SCORED_FROM = 2 ** 17

#: Maps of at most this many probabilities (batch x heads x rows x keys: 16 MiB of float32) have
#: their attention and value-weighted statistics computed side by side (A and N along the heads in
#: one buffer: half the operations); larger ones one after the other.
JOINT_SUMS = 2 ** 22

#: :func:`_row_entropy` works on this many probabilities at a time (4 MiB of float32: its passes
#: over a chunk stay in the processor's cache).
CHUNK = 2 ** 20


def _row_entropy(a: torch.Tensor) -> torch.Tensor:
    """-sum_j A ln A (nats, 0 ln 0 = 0) of every row of [..., keys] maps: shape ``a.shape[:-1]``.
    ln A is taken of max(A, the smallest normal float) (a third of ``torch.special.entr``'s time), a
    chunk of rows at a time in one reused buffer."""
    K = a.shape[-1]
    flat = a.reshape(-1, K)
    entropy = torch.empty(flat.shape[0], dtype=a.dtype, device=a.device)
    step = max(1, CHUNK // max(K, 1))
    buf = torch.empty(min(step, flat.shape[0]), K, dtype=a.dtype, device=a.device)
    tiny = torch.finfo(a.dtype).tiny
    for r0 in range(0, flat.shape[0], step):
        x = flat[r0:r0 + step]
        t = buf[:x.shape[0]]
        torch.clamp_min(x, tiny, out=t)
        t.log_().mul_(x)
        torch.sum(t, -1, out=entropy[r0:r0 + step])
    return entropy.neg_().view(a.shape[:-1])


def _diagonal(a: torch.Tensor, offset: int) -> torch.Tensor:
    """[batch, heads, rows] A[r, r + offset] of [batch, heads, rows, keys] maps (0 where r + offset
    is not a key)."""
    R, K = a.shape[-2:]
    r0, r1 = max(0, -offset), min(R, K - offset)
    diag = torch.diagonal(a, offset=offset, dim1=-2, dim2=-1)
    if r0 == 0 and r1 - r0 == R:
        return diag
    out = a.new_zeros(a.shape[:-1])
    if r1 > r0:
        out[..., r0:r1] = diag[..., :r1 - r0]
    return out


def _means(sums: torch.Tensor, counts: torch.Tensor) -> np.ndarray:
    """sums / counts, NaN where the count is 0 (``counts`` broadcast to ``sums``)."""
    counts = counts.double().expand_as(sums)
    means = sums / counts.clamp(min=1)
    means[counts == 0] = float("nan")
    return means.numpy()


#: Block capture: the contraction weights of every block of a map are kept for the next sites
#: when all of them together take at most this many bytes (else each block's are built and let go); their
#: size is that of the per-row weight vectors, [batch, rows, 2, keys] float32..
WEIGHT_CACHE_BYTES = 2 ** 28


class HeadStatistics(Accumulator):
    """Running sums and counts of every statistic for every (site, head).

    ``sums`` is [sites, heads, statistics] float64 and ``counts`` [sites, statistics] int64 (every
    head of a site sees the same rows). Corpus values (:meth:`means`) are sums / counts, the
    token-weighted mean over real query rows. Instances merge with :meth:`merge`.

    With ``value_weighted``, the same statistics of the value-weighted map N~ (:mod:`probe.capture.values`)
    are kept in ``norm_sums`` [sites, heads, statistics] and ``norm_counts`` (per head: a row
    whose value-weighted map is all 0 is left out of that head's counts), and the norm of each head's
    output in ``mass_sums`` [sites, heads] (counted over every real query row).

    Args:
        sites: the model's attention sites (``lm.sites``), in order.
        n_heads: query heads per site.
        tokenizer: the model's tokenizer (its sep token, and token surfaces where offsets are missing).
        value_weighted: also keep the value-weighted statistics (:meth:`update` then needs the site's
            :class:`~probe.capture.values.ValueNorms`, which :func:`probe.runs.analysis.run` hands it).
    """

    name = "statistics"
    title = "per-head statistics"
    transient = ("tokenizer",)
    row_blocks = True
    on_device = ("sums", "norm_sums", "norm_counts", "mass_sums")

    def __init__(self, sites: list[Site], n_heads: int, tokenizer=None, value_weighted: bool = False) -> None:
        self.sites = list(sites)
        self.n_heads = n_heads
        self.tokenizer = tokenizer
        self.value_weighted = value_weighted
        self._row = {site: i for i, site in enumerate(self.sites)}
        S, n = len(self.sites), len(ALL_STATISTICS)
        self.sums = torch.zeros(S, n_heads, n, dtype=torch.float64)
        self.counts = torch.zeros(S, n, dtype=torch.int64)
        if value_weighted:
            self.norm_sums = torch.zeros(S, n_heads, n, dtype=torch.float64)
            self.norm_counts = torch.zeros(S, n_heads, n, dtype=torch.int64)
            self.mass_sums = torch.zeros(S, n_heads, dtype=torch.float64)

    @property
    def reads_values(self) -> bool:
        """:func:`probe.runs.analysis.run` hands :meth:`update` the site's value norms."""
        return self.value_weighted

    #: :func:`probe.runs.analysis.run` hands :meth:`update` the scores of probe's attention function.
    reads_scores = True

    @property
    def encoder_decoder(self) -> bool:
        """The sites are those of an encoder-decoder model (it has cross-attention)."""
        return any(s.kind == "cross" for s in self.sites)

    @property
    def statistics(self) -> tuple[str, ...]:
        """The statistics of :meth:`result`: :data:`STATISTICS`, and :data:`CROSS_STATISTICS` for an
        encoder-decoder model."""
        return ALL_STATISTICS if self.encoder_decoder else STATISTICS

    @property
    def n_sites(self) -> int:
        """Attention sites measured (layers of a one-stack model; every stack and kind of an
        encoder-decoder model)."""
        return len(self.sites)

    def update(self, site: Site, probs: torch.Tensor, batch: Batch, values: ValueNorms | None = None,
               rows: tuple[int, int] | None = None, scores: Scores | None = None) -> None:
        """Add one batch of one site: ``probs`` is [batch, heads, query, key] attention probabilities
        (queries and keys of the site's sides: :func:`probe.loading.seq2seq.sides`); ``values`` the site's
        value norms (needed with ``value_weighted``; [batch, heads, key] and [batch, heads, query]).
        With ``rows`` = (i0, i1) (block capture), probs and ``values.mass`` hold query rows i0..i1-1
        only; the sums of a site's blocks are those of its whole map. ``scores``: the
        :class:`~probe.capture.op.Scores` probe's attention function computed ``probs`` from (the
        entropies then need no logarithm of the map: :func:`map_sums`), or None.

        Raises:
            ValueError: value-weighted statistics without ``values``.
        """
        queries, keys = sides(site, batch)
        eos = self.encoder_decoder
        feats = token_features(queries, self.tokenizer, eos)
        key_feats = token_features(keys, self.tokenizer, eos) if site.kind == "cross" else None
        a = probs.float()
        B, _, Tq, Tk = a.shape
        T = Tq if rows is None else queries.input_ids.shape[1]  # query rows of the whole map
        nk = Tk
        if rows is not None and site.causal and site.kind != "cross":  # later keys: probability exactly 0
            nk = Tk - (T - rows[1])
            a = a[..., :nk]
        key = ("contraction", site.kind, site.causal, site.window, site.ahead, Tq, Tk, rows, str(a.device))

        def build() -> ContractionWeights:
            return contraction_weights(feats, site, Tk if site.kind != "cross" else T, key_feats, rows,
                                       None if nk == Tk else nk).to(a.device)

        # whole maps, or blocks whose weights for every row of the map fit WEIGHT_CACHE_BYTES: shared by the
        # sites; larger ones are built per block and let go (never [T, 2, T] for a long map)
        w = queries.cached(key, build) if rows is None or B * T * Tk * 2 * 4 <= WEIGHT_CACHE_BYTES else build()
        i = self._row[site]
        self.follow(a.device)
        self.counts[i] += w.counts
        dev = self.sums.device
        if self.value_weighted and values is None:
            raise ValueError(f"value-weighted statistics of {site.name} need its value norms (probe.runs.analysis.run "
                             "hands them to an accumulator that reads values)")
        norms = values.norms[..., :nk] if self.value_weighted else None
        if scores is not None and scores.values.shape[:-1] != probs.shape[:-1]:
            scores = None  # not this call's (a module that called the function more than once)
        sums, norm_sums, empty = map_sums(a, w, norms, scores)
        self.sums[i] += sums.to(dev)
        if not self.value_weighted:
            return
        self.norm_sums[i] += norm_sums.to(dev)
        self.norm_counts[i] += w.counts[None, :].to(dev)
        # rows with no value-weighted map: out of that head's counts (no host sync to ask whether any)
        self.norm_counts[i] -= torch.einsum("bhq,bqs->hs", empty.float(), w.rows).round().to(dev, torch.int64)
        mass = torch.where(w.real_rows[:, None, :] > 0, values.mass.float(), 0.0)  # padded rows out before the sum
        self.mass_sums[i] += mass.to(dev, torch.float64).sum((0, 2))

    def merge(self, other: HeadStatistics) -> HeadStatistics:
        """Add another accumulator's sums and counts into this one (in place); returns self.

        Raises:
            ValueError: the other has different sites or head counts, or one is value-weighted and
                the other not.
        """
        if other.sites != self.sites or other.n_heads != self.n_heads:
            raise ValueError("cannot merge statistics of models with different sites or head counts")
        if other.value_weighted != self.value_weighted:
            raise ValueError("cannot merge statistics with and without value-weighted statistics")
        self.sums += other.sums.to(self.sums.device)
        self.counts += other.counts
        if self.value_weighted:
            self.norm_sums += other.norm_sums.to(self.norm_sums.device)
            self.norm_counts += other.norm_counts.to(self.norm_counts.device)
            self.mass_sums += other.mass_sums.to(self.mass_sums.device)
        return self

    def means(self) -> np.ndarray:
        """[sites, heads, statistics] corpus values (:data:`ALL_STATISTICS` order); NaN where a
        statistic had no defined row."""
        return _means(self.sums.cpu(), self.counts[:, None, :])

    def means_by_norm(self) -> np.ndarray:
        """[sites, heads, statistics] corpus values of the value-weighted map N~ (:data:`ALL_STATISTICS`
        order); NaN where a head had no defined row.

        Raises:
            ValueError: kept without ``value_weighted``.
        """
        if not self.value_weighted:
            raise ValueError("these statistics were kept without value-weighted statistics")
        return _means(self.norm_sums.cpu(), self.norm_counts.cpu())

    def norm_mass(self) -> np.ndarray:
        """[sites, heads] mean over real query rows of ||sum_j A[i, j] f_h(x_j)|| (hidden-state units).

        Raises:
            ValueError: kept without ``value_weighted``.
        """
        if not self.value_weighted:
            raise ValueError("these statistics were kept without value-weighted statistics")
        return _means(self.mass_sums.cpu(), self.counts[:, None, INDEX["entropy"]])  # every real query row

    def result(self) -> pd.DataFrame:
        """One row per head: columns ``layer``, ``head`` and one per statistic (:attr:`statistics`);
        value-weighted, then one ``<statistic>_by_norm`` per statistic and ``norm_mass``. An
        encoder-decoder model's rows also have ``stack`` and ``kind`` (first), its layers counted
        within each stack."""
        n = len(self.statistics)
        blocks, columns = [self.means()[:, :, :n]], list(self.statistics)
        if self.value_weighted:
            blocks += [self.means_by_norm()[:, :, :n], self.norm_mass()[:, :, None]]
            columns += [by_norm(s) for s in self.statistics] + [NORM_MASS]
        means = np.concatenate(blocks, axis=-1)
        S, H, _ = means.shape
        frame = pd.DataFrame(means.reshape(S * H, -1), columns=columns)
        frame.insert(0, "head", np.tile(np.arange(H), S))
        frame.insert(0, "layer", np.repeat([s.layer for s in self.sites], H))
        if self.encoder_decoder:
            frame.insert(0, "kind", np.repeat([s.kind for s in self.sites], H))
            frame.insert(0, "stack", np.repeat([s.stack for s in self.sites], H))
        return frame
