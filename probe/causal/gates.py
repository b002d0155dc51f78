"""Head gates: one multiplier per (layer, head) on the head's output, before the output projection.

Michel et al. 2019 ("Are Sixteen Heads Really Better than One?", sec. 2.2) write multi-head
attention as sum_h xi_h Att_h(x) with a gate xi_h per head: xi_h = 0 removes head h, and
dL/dxi_h is its importance. probe puts the gate at the intervention point's ``"output"``
(:mod:`probe.capture.intervene`): each head's output before the output projection, [batch, seq, heads,
d_head], head h's slice multiplied by its gate, inside probe's attention function (a model outside
transformers' attention interface: at the output projection's input, the same numbers). Gates are
ordinary tensors, differentiable when they require grad.

An instrument that silently does nothing is the worst kind: a model whose forward pass never
reaches the gate (BLOOM with ``pretraining_tp > 1`` and ``slow_but_exact`` applies its output
projection as ``F.linear`` on slices of its weight, past the fallback's hook) would give every head
the importance 0. So :func:`gated` first checks, once per model, on one short sentence, that every
layer's gate runs and that gating heads changes the output (:func:`check_gates`).

Gates are in the original numbering ([layers, heads], or [batch, layers, heads] for one gate per
sequence). On a physically pruned model (``lm.pruned``) each slot of the projection takes the gate
of the original head it holds; zero placeholder slots take 0. The editors live in
:func:`probe.capture.intervene.intervening` (eval mode) and are always removed on exit.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..capture.intervene import Intervention, intervening
from ..capture.maps import encode, forward
from ..errors import ProbeError
from .heads import check_head_mask

#: Models whose gates were seen to act (checked once per model object).
_ACTING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: Model settings known to bypass the output projection's module, by model type: a function of
#: the config naming the setting (or None), and what to do instead.
@dataclass
class Gates:
    """The gates in force inside :func:`gated` (assign ``values`` to change them between passes).

    Attributes:
        values: [layers, heads] or [batch, layers, heads] multipliers (original numbering); None
            leaves every head as it is.
        notes: what :func:`probe.capture.hooks.measuring` changed (restored on exit).
        fired: layers whose gate ran (filled in by the editors).
        intervention: the :class:`~probe.capture.intervene.Intervention` the gates are editors of (other
            editors may join it).
    """

    values: torch.Tensor | None
    notes: list[str]
    fired: set[int] = field(default_factory=set)
    intervention: Intervention | None = None


def _slot_heads(lm, layer: int) -> list[int | None]:
    """Original head of each slot of ``layer``'s output-projection input (None: placeholder)."""
    if lm.pruned is None:
        return list(range(lm.geometry.n_heads))
    return list(lm.pruned.layouts[layer].q)


def _editor(state: Gates, layer: int, slots: list[int | None], shape: tuple[int, int]):
    """The ``"output"`` editor of ``layer``: z [batch, seq, slots, d_head] times each slot's gate."""
    index = torch.tensor([h if h is not None else 0 for h in slots])
    real = torch.tensor([h is not None for h in slots])

    def editor(z, call):
        state.fired.add(layer)
        if state.values is None:
            return z
        check_head_mask(state.values, *shape, what="gates")  # assigned between passes: checked where read
        g = state.values[..., layer, :].index_select(-1, index.to(z.device)).to(z.dtype)  # [slots] or [batch, slots]
        g = g * real.to(device=z.device, dtype=z.dtype)
        g = g[:, None, :, None] if g.dim() == 2 else g[None, None, :, None]
        return z * g

    return editor


@contextmanager
def gated(lm, values: torch.Tensor | None = None, *, eager: bool = False) -> Iterator[Gates]:
    """Context manager: head gates on every layer of ``lm``.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel`.
        values: [layers, heads] or [batch, layers, heads] gates (1 = head as is, 0 = head removed);
            None: no gating until ``Gates.values`` is set.
        eager: a model outside transformers' attention interface: also switch it to eager attention
            (for passes that capture attention probabilities); the others run probe's attention
            function, which hands its probabilities on.

    Yields:
        :class:`Gates`; every hook is removed on exit (also on exceptions).

    Raises:
        InputError: gates (here or assigned later to ``Gates.values``) that are not [..., layers,
            heads] of this model (:func:`probe.causal.heads.check_head_mask`).
        ProbeError: the gates do not act on this model (:func:`check_gates`).
    """
    shape = (lm.geometry.n_layers, lm.geometry.n_heads)
    if values is not None:
        check_head_mask(values, *shape, what="gates")
    with intervening(lm, eager=eager) as iv:
        state = Gates(values, iv.notes, intervention=iv)
        # one-stack models: one site per layer
        iv.edit("output", lambda site: _editor(state, site.layer, _slot_heads(lm, site.layer), shape))
        if lm.kind != "encoder-decoder" and not _ACTING.get(lm.model, False):
            check_gates(lm, state)
            _ACTING[lm.model] = True
        yield state


def check_gates(lm, state: Gates) -> None:
    """Check on one short sentence that the gates installed by :func:`gated` act: every layer's
    hook runs, and closing the first present head of every layer changes the output.
    ``state.values`` is as it was afterwards.

    Raises:
        ProbeError: a layer's output projection is never called (naming the model setting where
            it is a known one: :func:`probe.capture.intervene.intervening` refuses it first), or closing
            heads changes nothing.
    """
    batch = encode(lm, "The cat sat on the mat.")
    saved, state.fired = state.values, set()
    try:
        with torch.no_grad():
            state.values = ones(lm)
            ref = _output(forward(lm, batch))
            missing = [layer for layer in range(lm.geometry.n_layers) if layer not in state.fired]
            if missing:
                raise ProbeError(_bypass_message(lm, missing))
            closed = ones(lm)
            for layer in range(closed.shape[0]):
                present = torch.nonzero(closed[layer]).flatten()
                if len(present):
                    closed[layer, present[0]] = 0.0
            state.values = closed
            changed = not torch.equal(ref, _output(forward(lm, batch)))
    finally:
        state.values = saved
    if not changed:
        raise ProbeError(f"head gates do not act on {lm.name}: closing one head in every layer leaves its output "
                         "unchanged, so head pruning and importance would measure nothing")


def _output(out) -> torch.Tensor:
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _bypass_message(lm, missing: list[int]) -> str:
    layers = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
    why = ": its forward pass computes the projection without calling that module"
    o = lm.spec.site_specs[0].o  # gates act on one-stack models
    return f"head gates do not act on {lm.name}: the output projection ({o}) of layer(s) {layers} is never called{why}"


def ones(lm, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[layers, heads] gates of the model as it is: 1 for present heads, 0 for removed ones."""
    g = lm.geometry
    if lm.pruned is None:
        return torch.ones(g.n_layers, g.n_heads, dtype=dtype)
    return lm.pruned.mask().to(dtype)
