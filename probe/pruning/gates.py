"""Head gates: one multiplier per (layer, head) on the head's output, before the output projection.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?", sec. 2.2) write multi-head
attention as sum_h xi_h Att_h(x) with a gate xi_h per head: xi_h = 0 removes head h, and
dL/dxi_h is its importance. probe puts the gate in a forward pre-hook on the output projection
(the architecture spec's ``o``), whose input is the heads' outputs side by side,
[batch, seq, heads * d_head]: head h's slice is multiplied by its gate. This happens after the
attention itself, so it works under every attention implementation (eager, sdpa; shared/CASES.md
F13), and gates are ordinary tensors, differentiable when they require grad.

Gates are in the original numbering ([layers, heads], or [batch, layers, heads] for one gate per
sequence). On a physically pruned model (``lm.pruned``) each slot of the projection takes the gate
of the original head it holds; zero placeholder slots take 0. The hooks live in
:func:`probe.hooks.measuring` (eval mode, attention implementation untouched) and are always
removed on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..architectures import site_outputs
from ..hooks import measuring


@dataclass
class Gates:
    """The gates in force inside :func:`gated` (assign ``values`` to change them between passes).

    Attributes:
        values: [layers, heads] or [batch, layers, heads] multipliers (original numbering); None
            leaves every head as it is.
        notes: what :func:`probe.hooks.measuring` changed (restored on exit).
    """

    values: torch.Tensor | None
    notes: list[str]


def _slot_heads(lm, layer: int) -> list[int | None]:
    """Original head of each slot of ``layer``'s output-projection input (None: placeholder)."""
    if lm.pruned is None:
        return list(range(lm.geometry.n_heads))
    return list(lm.pruned.layouts[layer].q)


def _hook(state: Gates, layer: int, slots: list[int | None], d_head: int):
    index = torch.tensor([h if h is not None else 0 for h in slots])
    real = torch.tensor([h is not None for h in slots])

    def hook(module, args):
        if state.values is None:
            return None
        x = args[0]  # [batch, seq, slots * d_head]
        B, T, W = x.shape
        g = state.values[..., layer, :].index_select(-1, index.to(x.device)).to(x.dtype)  # [slots] or [batch, slots]
        g = g * real.to(device=x.device, dtype=x.dtype)
        g = g[:, None, :, None] if g.dim() == 2 else g[None, None, :, None]
        return (((x.reshape(B, T, len(slots), d_head) * g).reshape(B, T, W)), *args[1:])

    return hook


@contextmanager
def gated(lm, values: torch.Tensor | None = None, *, eager: bool = False) -> Iterator[Gates]:
    """Context manager: head gates on every layer of ``lm``.

    Args:
        lm: a :class:`~probe.models.LoadedModel`.
        values: [layers, heads] or [batch, layers, heads] gates (1 = head as is, 0 = head removed);
            None: no gating until ``Gates.values`` is set.
        eager: also switch to eager attention (for passes that capture attention probabilities);
            gates themselves work under any implementation.

    Yields:
        :class:`Gates`; every hook is removed on exit (also on exceptions).
    """
    d_head = lm.geometry.d_head
    with measuring(lm.model, eager=eager) as m:
        state = Gates(values, m.notes)
        for site, o in site_outputs(lm.model, lm.spec):  # one-stack models: one site per layer
            m.hooks.forward_pre(o, _hook(state, site.layer, _slot_heads(lm, site.layer), d_head))
        yield state


def ones(lm, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[layers, heads] gates of the model as it is: 1 for present heads, 0 for removed ones."""
    g = lm.geometry
    if lm.pruned is None:
        return torch.ones(g.n_layers, g.n_heads, dtype=dtype)
    return lm.pruned.mask().to(dtype)
