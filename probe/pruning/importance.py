"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", sec. 3.3 and 4.1).

With a gate xi_h on every head (:mod:`probe.causal.gates`, all 1 = the model as it is),

    I_h = sum over batches of |dL/dxi_h|,   L = the batch's mean loss,

then normalized per layer: I_h / sqrt(sum of I_g^2 over the heads g still present in that layer)
(Michel et al., sec. 4.1, after Molchanov et al. 2017). |dL/dxi_h| is the first-order (Taylor)
estimate of the loss change when head h is removed.

The ``fidelity`` objective is at its minimum when every gate is 1 (the model equals the
reference), so its first derivative there is exactly 0 and carries no information. For it probe
uses the first term that does not vanish, the Gauss-Newton (Fisher) form: with e the unit-length
sentence embedding and 1 - cos(e', e) = |e' - e|^2 / 2 for unit vectors, removing head h changes
the loss by about |de/dxi_h|^2 / 2 (Molchanov et al. 2019, "Importance Estimation for Neural
Network Pruning", sec. 3, use the same squared-gradient form). |de/dxi_h|^2 is estimated without
forming the Jacobian: for z ~ N(0, I), E[(z . de/dxi_h)^2] = |de/dxi_h|^2 (Hutchinson 1990), with
one gate per sequence so that each sequence's gradient is separate, ``probes`` draws per batch
from a fixed seed. The per-batch value is the mean over its sequences, summed over batches as above.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ..capture.hooks import Hooks, measuring
from ..capture.maps import add_attention_hooks
from ..causal.gates import Gates
from ..errors import ProbeError


@contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """Parameters do not require grad inside (only the gates do); restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def check_differentiable(lm) -> None:
    """Raise ProbeError when the model's parameters are not floating point (a quantized model
    cannot carry gradients to the gates)."""
    bad = sorted({str(p.dtype) for p in lm.model.parameters() if not p.is_floating_point()})
    if bad:
        raise ProbeError(f"{lm.name} has {', '.join(bad)} parameters: head importance needs a model that carries "
                         "gradients (load it in float32)")


def _grad(loss: torch.Tensor, gates: torch.Tensor, retain: bool = False) -> torch.Tensor:
    try:
        (grad,) = torch.autograd.grad(loss, gates, retain_graph=retain)
    except RuntimeError as exc:
        raise ProbeError(f"the head gates get no gradient from this model's objective ({str(exc).splitlines()[0]})") \
            from None
    if not torch.isfinite(grad).all():
        raise ProbeError("the gradient of the objective with respect to the head gates is not finite")
    return grad


def head_importance(lm, batches: Sequence, objective, state: Gates, mask: torch.Tensor, *, probes: int = 2,
                    seed: int = 0, accumulators: Sequence = (), progress=None) -> torch.Tensor:
    """Raw head importance, summed over ``batches``, with the heads of ``mask`` as they are.

    Must run inside :func:`probe.causal.gates.gated` (``state``); the gates are set here.

    Args:
        lm: a loaded model.
        batches: scoring batches (prepared by ``objective.setup``).
        objective: a :class:`~probe.causal.objectives.Objective`.
        state: the :class:`~probe.causal.gates.Gates` of the enclosing ``gated`` context.
        mask: [layers, heads] current gates (0 = pruned).
        probes: random projections per batch for objectives at their optimum (``fidelity``).
        seed: seed of those projections.
        accumulators: also fed every site's attention probabilities [batch, heads, query, key] of
            the same forward passes (original numbering; NaN for removed heads); the model runs
            eager attention while they are given.
        progress: a tqdm-like bar advanced once per batch, or None.

    Returns:
        [layers, heads] float64 raw importance (see the module docstring), 0 for pruned heads.

    Raises:
        ProbeError: the model's parameters are not floating point, or the gates get no (finite)
            gradient from the objective.
    """
    check_differentiable(lm)
    mask = mask.float()
    total = torch.zeros(mask.shape, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    current = {"batch": None}

    def on_site(site, probs):
        if lm.pruned is not None:
            probs = lm.pruned.expand(site.layer, probs)
        for acc in accumulators:
            acc.update(site, probs, current["batch"])

    with frozen(lm.model), Hooks() as hooks, measuring(lm.model, eager=bool(accumulators)):
        if accumulators:
            add_attention_hooks(hooks, lm, on_site)
        for batch in batches:
            current["batch"] = batch
            for acc in accumulators:
                acc.begin_batch(batch)
            if objective.at_optimum:
                g = mask.expand(len(batch), *mask.shape).clone().requires_grad_(True)  # [batch, layers, heads]
                state.values = g
                emb = objective.vector(lm, batch)  # [batch, d_model]
                sq = torch.zeros(g.shape, dtype=torch.float64)
                for k in range(probes):
                    z = torch.randn(emb.shape, generator=gen).to(emb)
                    sq += _grad((z * emb).sum(), g, retain=k < probes - 1).double() ** 2
                total += (sq / probes / 2).mean(0)
            else:
                g = mask.clone().requires_grad_(True)
                state.values = g
                total += _grad(objective.losses(lm, batch).mean(), g).double().abs()
            for acc in accumulators:
                acc.end_batch(batch)
            if progress is not None:
                progress.update(1)
    state.values = mask
    return total * mask.double()


def normalize_per_layer(importance: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """I_h / sqrt(sum of I_g^2 over the present heads g of its layer) (Michel et al. 2019, sec. 4.1).

    Args:
        importance: [layers, heads] raw importance.
        mask: [layers, heads], 0 for pruned heads (left out of the norm, and 0 in the result).

    Returns:
        [layers, heads] float64; a layer whose present heads all score 0 stays 0.
    """
    imp = importance.double() * mask.double()
    norm = imp.pow(2).sum(-1, keepdim=True).sqrt()
    return torch.where(norm > 0, imp / norm.clamp(min=1e-300), torch.zeros_like(imp))
