"""Physical head removal: rows of the query/key/value projections and columns of the output
projection go, and each attention module's head counts and widths follow, so the model runs at its
new size (no module keeps the old head count).

Every layout of :data:`probe.architectures.QKV_LAYOUTS` is handled from the spec alone: separate
``nn.Linear`` q/k/v (rows), GPT-2's fused ``Conv1D`` (columns of q | k | v), GPT-NeoX's per-head
fused projection (blocks of 3 x d_head rows per head) and Phi-3's stacked projection
(q | k | v rows). Attributes listed in the spec (``head_count_attrs``, ``width_attrs``,
``kv_group_attr``, ``kv_head_count_attrs``) are set to the new values; a module that reads its
head count from the config (``config_head_attrs``, Phi-3) gets a :class:`probe.loading.pruned.ConfigView` with its own.
The layout of a layer (which original head sits in which slot, grouped key/value heads, zero
placeholders) is planned by :func:`probe.loading.pruned.plan_layer`.

Removal is exact up to float summation order: a removed head's slice is dropped where the gated
model multiplies it by 0, so the pruned model's outputs equal the gated model's (float32, atol 1e-5;
``tests/test_pruning_removal.py`` checks every family).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..architectures import ALIBI, ArchSpec, site_block, site_spec, sites
from ..causal.heads import normalize_heads
from ..errors import InputError, UnsupportedAnalysisError
from ..loading.pruned import PrunedHeads, apply_layout, plan_layer
from ..sites import head_name


def _slot_costs(model: nn.Module, spec: ArchSpec, layer: int, d: int, d_model: int) -> tuple[int, int]:
    """Parameters of one query slot (its query rows and output-projection columns) and of one
    key/value slot (its key and value rows) of a layer, biases included."""
    site = sites(model.config)[layer]
    paths = site_spec(spec, site)
    proj = site_block(model, spec, site).get_submodule(paths.q or paths.qkv)
    bias = int(getattr(proj, "bias", None) is not None)
    return d * (d_model + bias) + d * d_model, 2 * d * (d_model + bias)


def parameter_count(model: nn.Module) -> int:
    """Parameters of a model (tied tensors counted once)."""
    return int(sum(p.numel() for p in model.parameters()))


@dataclass
class Removal:
    """What :func:`remove_heads` did.

    Attributes:
        removed: ``{layer: (head, ...)}`` removed by this call (original numbering).
        params_before, params_after: parameter counts.
        kv_kept_params: parameters of key/value heads kept because some query head of their group
            is still present (groups left partly pruned).
        layout_params: parameters of zero placeholder query slots and duplicated key/value slots
            that equal groups (and layers with every head pruned) need.
        notes: the same, in words.
    """

    removed: dict[int, tuple[int, ...]]
    params_before: int
    params_after: int
    kv_kept_params: int = 0
    layout_params: int = 0
    notes: list[str] = field(default_factory=list)


def removal_unsupported(lm) -> str | None:
    """Why heads cannot be physically removed from ``lm``, or None where they can."""
    if lm.kind == "encoder-decoder":
        return f"{lm.name} is an encoder-decoder model (head removal covers one-stack models)"
    if lm.spec.discovered or lm.spec.capture_only:
        return (f"{lm.model_type} has no hand-written spec: removing heads rewrites its modules' head counts and "
                "projection layouts, which only a hand spec names")
    if not lm.spec.layout.cuttable:
        return (f"{lm.name} fuses its projections per key/value group ({lm.spec.layout.name} layout, Falcon) and "
                "reads its head counts from the config; head removal does not cover that layout")
    why = lm.spec.removal_refusal(lm.model.config)
    if why is not None:
        return f"{lm.name} {why}"
    if lm.spec.position_bias is ALIBI:
        return (f"{lm.name} adds ALiBi biases whose slopes the model computes from its head count: removing "
                "heads would change the slopes of the heads that stay")
    return None


def remove_heads(lm, heads) -> Removal:
    """Physically remove heads from ``lm`` (in place), in the original numbering.

    Works on a model that was pruned before (``lm.pruned``): numbers stay the original ones
    (pruning again never shifts to another head), and the result is recorded in ``lm.pruned``.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel` (any supported family).
        heads: ``{layer: [head, ...]}`` or ``(layer, head)`` pairs, original numbering.

    Returns:
        A :class:`Removal` (parameter counts and notes on grouped key/value heads and placeholders).

    Raises:
        InputError: a layer/head out of range, or a head that was already removed (never silently
            shifted to another head).
        UnsupportedAnalysisError: a model heads cannot be removed from (:func:`removal_unsupported`).
    """
    why = removal_unsupported(lm)
    if why is not None:
        raise UnsupportedAnalysisError(f"cannot remove heads: {why}")
    g = lm.geometry
    todo = normalize_heads(heads, g.n_layers, g.n_heads)
    current = lm.pruned if lm.pruned is not None else PrunedHeads.unpruned(g.n_layers, g.n_heads, g.n_kv_heads)
    gone = [head_name(layer, h) for layer, hs in todo.items() for h in hs if h not in current.present(layer)]
    if gone:
        raise InputError(f"{'head' if len(gone) == 1 else 'heads'} {', '.join(gone)} (original numbering) "
                         f"{'was' if len(gone) == 1 else 'were'} already removed from this model")
    before = parameter_count(lm.model)
    layouts = list(current.layouts)
    kv_kept = layout_extra = 0
    per_kv = g.n_heads // g.n_kv_heads
    for layer, hs in todo.items():
        kept = [h for h in current.present(layer) if h not in hs]
        q_cost, kv_cost = _slot_costs(lm.model, lm.spec, layer, g.d_head, g.d_model)
        new = plan_layer(kept, g.n_heads, g.n_kv_heads, q_cost, kv_cost)
        apply_layout(lm.model, lm.spec, layer, layouts[layer], new, g.d_head)
        layouts[layer] = new
        groups = {h // per_kv for h in kept}
        if per_kv > 1:
            kv_kept += sum(any(j * per_kv + i not in kept for i in range(per_kv)) for j in groups) * kv_cost
        layout_extra += (len(new.q) - len(kept)) * q_cost + (len(new.kv) - len(groups)) * kv_cost
    lm.pruned = PrunedHeads(g.n_heads, g.n_kv_heads, layouts)
    after = parameter_count(lm.model)
    notes = []
    if kv_kept:
        notes.append(f"grouped key/value heads: groups left partly pruned keep their key/value head "
                     f"({kv_kept:,} parameters)")
    if layout_extra:
        notes.append(f"{layout_extra:,} parameters of zero placeholder query heads or duplicated key/value heads: "
                     "Hugging Face attention needs equal query groups per key/value head and at least one head "
                     "per layer")
    return Removal(todo, before, after, kv_kept, layout_extra, notes)
