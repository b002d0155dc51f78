"""Head ablation at the gate site: a head's slice z_h of the output projection's input, replaced by
0 (``zero``), by its mean over the real tokens of reference text (``mean``), or by its value on
another text (``resample``; Chan et al. 2022, causal scrubbing's resampling ablation).

The intervention point is the one of :mod:`probe.causal.gates`: the ``"output"`` point of
:mod:`probe.capture.intervene`, each head's output before the output projection, [batch, seq, heads, d_head]:

    z_h[t] <- (1 - a) z_h[t] + a f_h[t] [t real],   a = 1 for an ablated head, 0 otherwise,

with f = 0 (zero), mu_h (mean) or the donor's z_h[t] (resample); padded positions of an ablated head
become 0. A site is one self-attention layer of a one-stack model, or one of an encoder-decoder
model's encoder self, decoder self and cross layers (``lm.sites`` order); a head is (site index,
head), and for one-stack models the site index is the layer. Decoder-side sites act at the target's
positions, encoder sites at the source's.

mu_h is pooled over positions (texts differ in length). At a causal site row 0 attends only to
itself, so its output has a distribution of its own: position 0 gets the mean over position 0,
positions t >= 1 the mean over t >= 1. Other sites use one mean over every real token.

Resample: each held-out sequence gets one donor, drawn with ``numpy.random.default_rng([seed, corpus
index])`` from the reference texts at least as long (source and target), whose clean z_h at the same
positions replaces the head's; a sequence without such a donor is left out of the resample effect.

Many ablations share one forward pass: the batch is repeated along the batch dimension, one copy
per set of ablated heads (:func:`repeat_batch`), each copy with its own sets. A set is a
[sites, heads] bool mask; the empty set is the clean model, measured by the same code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..architectures import needs_weights
from ..bounds import ABLATION_KINDS
from ..bounds import ablation_kinds as check_kinds
from ..capture.intervene import Cache, intervening
from ..capture.maps import forward
from ..causal.gates import gated
from ..causal.heads import check_head_mask
from ..causal.objectives import CausalLM, MaskedLM
from ..errors import InputError
from ..text.inputs import Batch
from .objective import Seq2SeqLM

KINDS = ABLATION_KINDS
#: The kinds measured unless asked otherwise.
DEFAULT_KINDS = ("zero", "mean")


def check_model(lm) -> None:
    """Refuse what the ablation does not cover.

    Raises:
        UnsupportedAnalysisError: a model whose heads were physically removed (slots no longer follow
            the original numbering; :meth:`probe.core.LoadedModel.require_all_heads`).
        UnsupportedArchitectureError: a discovered spec without the output projection the ablation acts
            at (gated or differential attention), before any work.
    """
    lm.require_all_heads("ablation")
    needs_weights(lm.spec, "ablation (at the output projection's input)", ("o",))


def causal(lm) -> bool:
    """True when some site of ``lm`` is causal (the means then keep position 0 apart)."""
    return any(site.causal for site in lm.sites)


def site_real(batch: Batch, site) -> torch.Tensor:
    """[batch, T] real positions of ``site``'s queries: the target's for decoder-side sites of an
    encoder-decoder model, else the batch's own."""
    return batch.target.real if site.stack == "decoder" and batch.target is not None else batch.real


@torch.no_grad()
def site_z(lm, batch: Batch) -> list[torch.Tensor]:
    """One clean pass: every site's output-projection input, [batch, T_site, heads * d_head], ``lm.sites`` order."""
    cache = Cache()
    with intervening(lm) as iv:
        iv.edit("output", lambda site: cache.reader(site))
        forward(lm, batch)
    return [cache[site].flatten(2).clone() for site in lm.sites]


@torch.no_grad()
def head_means(lm, batches: Sequence[Batch]) -> torch.Tensor:
    """Mean of each head's output before the output projection, over the real tokens of ``batches``.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel` (clean: no gate in force).
        batches: the reference texts.

    Returns:
        [sites, P, heads, d_head] float32 means (sites in ``lm.sites`` order: the layers of a
        one-stack model): P = 2 when a site is causal (index 0: position 0, index 1: positions
        t >= 1; a non-causal site holds its one mean over every real token at both), else P = 1.

    Raises:
        InputError: no reference batch, or (causal) no reference text with two real tokens.
    """
    g, sites = lm.geometry, lm.sites
    if not batches:
        raise InputError("mean ablation needs reference texts (none given)")
    sums = torch.zeros(len(sites), 2, g.n_heads, g.d_head, dtype=torch.float64)
    counts = torch.zeros(len(sites), 2, dtype=torch.float64)
    for batch in batches:
        for i, (site, z) in enumerate(zip(sites, site_z(lm, batch))):
            x = z.double().reshape(*z.shape[:2], g.n_heads, g.d_head).cpu()  # [B, T, heads, d_head]
            real = site_real(batch, site)[:, :x.shape[1]].cpu()
            sums[i, 0] += x[:, 0][real[:, 0]].sum(0)
            sums[i, 1] += x[:, 1:][real[:, 1:]].sum(0)
            counts[i] += torch.stack([real[:, 0].sum(), real[:, 1:].sum()]).double()
    pooled = sums.sum(1) / counts.sum(1)[:, None, None]  # [sites, heads, d_head]
    if not causal(lm):
        return pooled[:, None].float()
    if (counts[[s.causal for s in sites]] == 0).any():
        raise InputError("mean ablation needs reference texts with at least two real tokens")
    split = sums / counts[:, :, None, None].clamp(min=1)
    keep = torch.tensor([s.causal for s in sites])[:, None, None, None]
    return torch.where(keep, split, pooled[:, None].expand_as(split)).float()


def repeat_batch(batch: Batch, k: int) -> Batch:
    """``batch`` repeated ``k`` times along the batch dimension (rows of copy c: c*B .. c*B+B-1),
    its target and cached objective constants (masks, references, labels) repeated alike."""
    def rep(t):
        if isinstance(t, torch.Tensor):
            return t.repeat(k, *([1] * (t.dim() - 1)))
        if isinstance(t, tuple):
            return tuple(rep(v) for v in t)
        return t

    out = Batch(rep(batch.input_ids), rep(batch.attention_mask), rep(batch.token_type_ids), rep(batch.offsets),
                rep(batch.special), rep(batch.word_ids), list(batch.texts) * k, list(batch.index) * k,
                list(batch.truncated) * k, target=None if batch.target is None else repeat_batch(batch.target, k))
    out._cache.update({key: rep(v) for key, v in batch._cache.items()})
    return out


def unit_rows(objective, batch: Batch) -> torch.Tensor:
    """[units] the row of ``batch`` each per-unit loss of ``objective.losses`` belongs to (in its order)."""
    if isinstance(objective, CausalLM):
        return batch.real[:, 1:].nonzero()[:, 0]
    if isinstance(objective, Seq2SeqLM):
        return batch.target.real[:, 1:].nonzero()[:, 0]
    if isinstance(objective, MaskedLM):
        return batch._cache["probe.mlm"][1].nonzero()[:, 0]
    return torch.arange(len(batch))


@dataclass
class Ablation:
    """State of :func:`ablating`: :meth:`arm` before each ablated pass, :meth:`disarm` after.

    Attributes:
        kind: ``zero``, ``mean`` or ``resample``.
        means: [sites, P, heads, d_head] (``mean``) or None.
        sets: [copies, sites, heads] bool, the heads ablated in each copy (None: no ablation).
        batch: the repeated batch of the next pass (its real positions).
        donors: ``resample``: per site the donors' z [B, T_site, heads * d_head] for the B rows of one copy.
    """

    kind: str
    means: torch.Tensor | None
    sets: torch.Tensor | None = None
    batch: Batch | None = None
    donors: list | None = None

    def arm(self, lm, sets: torch.Tensor, batch: Batch) -> None:
        """Ablate ``sets[c]`` ([copies, sites, heads] bool) in copy c of ``batch`` (its rows c*B ..
        c*B+B-1, :func:`repeat_batch`) on the next forward passes.

        Raises:
            InputError: ``sets`` does not fit ``lm``'s heads. ValueError: ``sets`` is not
                [copies, sites, heads], or ``batch``'s rows are not a whole number of copies.
        """
        check_head_mask(sets, len(lm.sites), lm.geometry.n_heads, what="ablation sets")
        if sets.dim() != 3 or len(batch) % len(sets):
            raise ValueError(f"ablation sets must be [copies, sites, heads] with the batch's {len(batch)} rows "
                             f"a whole number of copies; got {list(sets.shape)}")
        self.sets, self.batch = sets, batch

    def disarm(self) -> None:
        """No ablation on the next forward passes."""
        self.sets, self.batch = None, None


def _fill(state: Ablation, i: int, N: int, T: int, shape: tuple, like: torch.Tensor) -> torch.Tensor | None:
    """[N or 1, T, heads, d_head] what an ablated head's slice becomes at site ``i`` (None: 0)."""
    if state.kind == "mean":
        mu = state.means[i].to(device=like.device, dtype=like.dtype)  # [P, heads, d_head]
        fill = mu[-1].expand(T, *shape).clone()
        fill[0] = mu[0]
        return fill[None]
    if state.kind == "resample":
        donor = state.donors[i][:, :T].to(device=like.device, dtype=like.dtype)
        return donor.reshape(len(donor), T, *shape).repeat(N // len(donor), 1, 1, 1)
    return None


def _ablator(state: Ablation, i: int, site, n_sites: int, n_heads: int):
    """Site ``i``'s ``"output"`` editor: z [N, T, heads, d_head] with the armed sets ablated."""
    def editor(z, call):
        if state.sets is None:
            return z
        N, T = z.shape[:2]
        check_head_mask(state.sets, n_sites, n_heads, what="ablation sets")  # set directly: checked where read
        a = state.sets[:, i].repeat_interleave(N // len(state.sets), 0).to(device=z.device, dtype=z.dtype)  # [N, H]
        if not a.any():
            return z
        x4 = z * (1 - a)[:, None, :, None]
        fill = _fill(state, i, N, T, z.shape[2:], z)
        if fill is not None:
            real = site_real(state.batch, site)[:, :T].to(device=z.device, dtype=z.dtype)
            x4 = x4 + a[:, None, :, None] * fill * real[:, :, None, None]
        return x4
    return editor


@contextmanager
def ablating(lm, kind: str, means: torch.Tensor | None = None) -> Iterator[Ablation]:
    """Context manager: the ablation hooks on every site, ready for :func:`sequence_losses`.

    Args:
        lm: a complete model (:func:`check_model`).
        kind: ``"zero"``, ``"mean"`` or ``"resample"`` (set ``donors`` per batch: :func:`set_donors`).
        means: [sites, P, heads, d_head] from :func:`head_means` (``mean`` only).

    Raises:
        InputError: an unknown kind.
        ValueError: ``mean`` without means (a programming mistake).
        ProbeError: the editors do not act on this model (:func:`probe.causal.gates.check_gates`).
    """
    check_kinds([kind])
    if kind == "mean" and means is None:
        raise ValueError("mean ablation needs the heads' means (head_means)")
    index = {site: i for i, site in enumerate(lm.sites)}
    with gated(lm, None) as gates:  # the gates' check that the point acts; its editors stay open
        state = Ablation(kind, means if kind == "mean" else None)
        gates.intervention.edit("output", lambda site: _ablator(state, index[site], site, len(lm.sites),
                                                                lm.geometry.n_heads))
        yield state


@torch.no_grad()
def sequence_losses(lm, objective, state: Ablation, batch: Batch, sets: torch.Tensor) -> np.ndarray:
    """Per-sequence sums of the objective's per-unit losses, one row per ablation set, in one pass.

    Args:
        lm: the model.
        objective: a set-up :class:`~probe.causal.objectives.Objective`.
        state: the :class:`Ablation` of the enclosing :func:`ablating`.
        batch: [B rows] held-out batch.
        sets: [k, layers, heads] bool, True = ablated.

    Returns:
        [k, B] float64 sums (divide by the per-sequence unit counts, :func:`unit_counts`).
    """
    rep = repeat_batch(batch, len(sets)) if len(sets) > 1 else batch
    state.arm(lm, sets, rep)
    try:
        losses = objective.losses(lm, rep).double().cpu()
    finally:
        state.disarm()
    rows = unit_rows(objective, rep).cpu()
    k = len(sets)
    return torch.zeros(len(rep), dtype=torch.float64).index_add_(0, rows, losses).reshape(k, len(batch)).numpy()


def unit_counts(objective, batch: Batch) -> np.ndarray:
    """[B] units (predicted tokens, masked tokens, sequences) per row of ``batch``."""
    return np.bincount(unit_rows(objective, batch).cpu().numpy(), minlength=len(batch)).astype(float)
