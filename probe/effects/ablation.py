"""Head ablation at the gate site: a head's slice z_h of the output projection's input, replaced by
0 (``zero``) or by its mean over the real tokens of reference text (``mean``).

The intervention point is the one of :mod:`probe.pruning.gates`: a forward pre-hook on each
layer's output projection, whose input is the heads' outputs side by side, [batch, seq, heads *
d_head]. Zero ablation is the gate 0 itself (:func:`probe.pruning.gates.gated` with one gate per
sequence); mean ablation closes the gate and adds the mean back in a second pre-hook on the same
module, at real positions only:

    z_h[t] <- (1 - a) z_h[t] + a mu_h[t],   a = 1 for an ablated head, 0 otherwise.

mu_h is pooled over positions (texts differ in length). In a causal model row 0 attends only to
itself, so its output has a distribution of its own: position 0 gets the mean over position 0,
positions t >= 1 the mean over t >= 1. Encoders use one mean over every real token.

Many ablations share one forward pass: the batch is repeated along the batch dimension, one copy
per set of ablated heads (:func:`repeat_batch`), each copy with its own gates. A set is a
[layers, heads] bool mask; the empty set is the clean model, measured by the same code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ..architectures import site_outputs
from ..capture import forward
from ..errors import InputError
from ..hooks import measuring
from ..inputs import Batch
from ..pruning.gates import gated, ones
from ..pruning.objectives import CausalLM, MaskedLM

KINDS = ("zero", "mean")


def check_model(lm) -> None:
    """Refuse what the ablation does not cover.

    Raises:
        InputError: an encoder-decoder model (the gates act on one-stack models), or a model whose
            heads were physically removed (slots no longer follow the original numbering).
    """
    if lm.kind == "encoder-decoder":
        raise InputError(f"head ablation covers one-stack models (encoders, decoders); {lm.name} is an "
                         "encoder-decoder model")
    if lm.pruned is not None:
        raise InputError(f"{lm.name} has physically removed heads; measure ablation effects on the model as trained")


def causal(lm) -> bool:
    """True when every site of ``lm`` is causal (position 0 then gets its own mean)."""
    return all(site.causal for site in lm.sites)


@torch.no_grad()
def head_means(lm, batches: Sequence[Batch]) -> torch.Tensor:
    """Mean of each head's output before the output projection, over the real tokens of ``batches``.

    Args:
        lm: a one-stack :class:`~probe.models.LoadedModel` (clean: no gate in force).
        batches: the reference texts.

    Returns:
        [layers, P, heads, d_head] float32 means: P = 2 for a causal model (index 0: position 0,
        index 1: positions t >= 1), else P = 1 (every real token).

    Raises:
        InputError: no reference batch, or (causal) no reference text with two real tokens.
    """
    g, two = lm.geometry, causal(lm)
    if not batches:
        raise InputError("mean ablation needs reference texts (none given)")
    P = 2 if two else 1
    sums = torch.zeros(g.n_layers, P, g.n_heads, g.d_head, dtype=torch.float64)
    counts = torch.zeros(P, dtype=torch.float64)
    real_now: dict = {}

    def hook_for(layer: int):
        def hook(module, args):
            x = args[0].double().reshape(*args[0].shape[:2], g.n_heads, g.d_head)  # [B, T, heads, d_head]
            real = real_now["mask"].to(x.device)
            if two:
                sums[layer, 0] += x[:, 0][real[:, 0]].sum(0).cpu()
                sums[layer, 1] += x[:, 1:][real[:, 1:]].sum(0).cpu()
            else:
                sums[layer, 0] += x[real].sum(0).cpu()
        return hook

    with measuring(lm.model, eager=False) as m:
        for site, o in site_outputs(lm.model, lm.spec):
            m.hooks.forward_pre(o, hook_for(site.layer))
        for batch in batches:
            real_now["mask"] = batch.real
            counts += (torch.tensor([batch.real[:, 0].sum(), batch.real[:, 1:].sum()]) if two
                       else batch.real.sum().reshape(1)).double()
            forward(lm, batch)
    if (counts == 0).any():
        raise InputError("mean ablation needs reference texts with at least two real tokens")
    return (sums / counts[None, :, None, None]).float()


def repeat_batch(batch: Batch, k: int) -> Batch:
    """``batch`` repeated ``k`` times along the batch dimension (rows of copy c: c*B .. c*B+B-1),
    its cached objective constants (masks, references, labels) repeated alike."""
    def rep(t):
        if isinstance(t, torch.Tensor):
            return t.repeat(k, *([1] * (t.dim() - 1)))
        if isinstance(t, tuple):
            return tuple(rep(v) for v in t)
        return t

    out = Batch(rep(batch.input_ids), rep(batch.attention_mask), rep(batch.token_type_ids), rep(batch.offsets),
                rep(batch.special), rep(batch.word_ids), list(batch.texts) * k, list(batch.index) * k,
                list(batch.truncated) * k)
    out._cache.update({key: rep(v) for key, v in batch._cache.items()})
    return out


def unit_rows(objective, batch: Batch) -> torch.Tensor:
    """[units] the row of ``batch`` each per-unit loss of ``objective.losses`` belongs to (in its order)."""
    if isinstance(objective, CausalLM):
        return batch.real[:, 1:].nonzero()[:, 0]
    if isinstance(objective, MaskedLM):
        return batch._cache["probe.mlm"][1].nonzero()[:, 0]
    return torch.arange(len(batch))


@dataclass
class Ablation:
    """State of :func:`ablating`: set ``sets`` ([copies, layers, heads] bool) and ``real`` before each pass."""

    gates: object
    means: torch.Tensor | None
    sets: torch.Tensor | None = None
    real: torch.Tensor | None = None

    def arm(self, lm, sets: torch.Tensor, batch: Batch) -> None:
        """Ablate ``sets[c]`` ([copies, layers, heads] bool) in copy c of ``batch`` (its rows c*B ..
        c*B+B-1, :func:`repeat_batch`) on the next forward passes."""
        per = len(batch) // len(sets)
        self.sets, self.real = sets, batch.real
        self.gates.values = (ones(lm)[None] * (~sets).float()).repeat_interleave(per, 0)  # [rows, layers, heads]

    def disarm(self) -> None:
        """No ablation on the next forward passes."""
        self.gates.values, self.sets, self.real = None, None, None


def _fill_hook(state: Ablation, layer: int, n_heads: int, d_head: int):
    def hook(module, args):
        if state.means is None or state.sets is None:
            return None
        x = args[0]  # [N, T, heads * d_head], already gated
        N, T, _ = x.shape
        mu = state.means[layer].to(device=x.device, dtype=x.dtype)  # [P, heads, d_head]
        fill = mu[-1].expand(T, n_heads, d_head).clone()
        fill[0] = mu[0]
        a = state.sets[:, layer].repeat_interleave(N // len(state.sets), 0).to(device=x.device, dtype=x.dtype)
        real = state.real.to(device=x.device, dtype=x.dtype)
        add = a[:, None, :, None] * fill[None] * real[:, :, None, None]  # [N, T, heads, d_head]
        return (x + add.reshape(N, T, n_heads * d_head), *args[1:])
    return hook


@contextmanager
def ablating(lm, kind: str, means: torch.Tensor | None = None) -> Iterator[Ablation]:
    """Context manager: the gates of every layer, ready for :func:`sequence_losses`.

    Args:
        lm: a one-stack model (:func:`check_model`).
        kind: ``"zero"`` or ``"mean"``.
        means: [layers, P, heads, d_head] from :func:`head_means` (``mean`` only).

    Raises:
        InputError: an unknown kind, or ``mean`` without means.
    """
    if kind not in KINDS:
        raise InputError(f"unknown ablation {kind!r}; choose from {', '.join(KINDS)}")
    if kind == "mean" and means is None:
        raise InputError("mean ablation needs the heads' means (head_means)")
    g = lm.geometry
    with gated(lm, None) as gates:
        state = Ablation(gates, means if kind == "mean" else None)
        handles = [o.register_forward_pre_hook(_fill_hook(state, site.layer, g.n_heads, g.d_head))
                   for site, o in site_outputs(lm.model, lm.spec)]
        try:
            yield state
        finally:
            for h in handles:
                h.remove()


@torch.no_grad()
def sequence_losses(lm, objective, state: Ablation, batch: Batch, sets: torch.Tensor) -> np.ndarray:
    """Per-sequence sums of the objective's per-unit losses, one row per ablation set, in one pass.

    Args:
        lm: the model.
        objective: a set-up :class:`~probe.pruning.objectives.Objective`.
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
