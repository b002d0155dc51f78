"""The query, key and value projections of a capture-only model's attention (its own code, outside
transformers' ``AttentionInterface``: RoFormer, XGLM, BigBird ...), found by name, and the score scale
its code uses.

A capture-only spec (:func:`probe.architectures.discovered.build_maps_spec`) knows only where the maps
come from. The attention step view (:mod:`probe.measures.steps`) also needs each head's q, k and v: it
hooks the projection modules this module names and splits their outputs into heads with the
projection layouts probe already has (:mod:`probe.architectures.layout`). The projections are the
children of the module that returned the maps, or of one of its ancestors inside the layer (I-BERT's
maps come from its ``IntSoftmax``, whose parent holds ``query``, ``key``, ``value``), with one of the names
of :data:`SEPARATE` (three modules) or :data:`FUSED` (one module and its layout). A module counts when it
has a 2-D ``weight`` (``nn.Linear``, GPT-2's ``Conv1D``, I-BERT's ``QuantLinear``, whose output is a
tuple: its first item). Bias vectors some modules add after the projection (DeBERTa v1's ``q_bias``,
``v_bias``) are added too (:data:`ADDED_BIASES`).

Nothing here is checked against what the model's code does with q and k: the step view compares its
scores with the probabilities the model returned and shows what they do not explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import UnsupportedArchitectureError
from ..sites import Site
from .disentangled import disentangled_scaling
from .layout import ProjectionLayout, projection_layout
from .modules import site_block, site_spec
from .spec import ArchSpec

#: Names of separate query, key and value projections, tried in order.
SEPARATE = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"), ("q", "k", "v"))

#: Names of fused projections and their layouts (:data:`probe.architectures.layout.QKV_LAYOUTS`): OpenAI GPT's
#: ``c_attn`` (a ``Conv1D``, q | k | v), MPT's ``Wqkv`` (q | k | v), GPT-NeoX-Japanese's ``query_key_value`` and
#: DeBERTa v1's ``in_proj`` ([heads, 3, d_head]).
FUSED = {"c_attn": "conv1d", "Wqkv": "stacked", "query_key_value": "per_head", "in_proj": "per_head"}

#: Names of one projection shared by queries and keys (Reformer's LSH attention): refused by name.
SHARED = ("query_key",)

#: Parameters of the attention module added to the query or value after the projection (DeBERTa v1).
ADDED_BIASES = {"q": "q_bias", "v": "v_bias"}


def _width(module: nn.Module) -> int | None:
    """A projection's output width, or None where ``module`` is no projection (no 2-D ``weight``)."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return None
    return int(w.shape[1] if type(module).__name__ == "Conv1D" else w.shape[0])


@dataclass(frozen=True)
class OwnProjections:
    """The projections of one capture-only site.

    Attributes:
        modules: role (``"q"``, ``"k"``, ``"v"``, or ``"qkv"`` fused) -> the module to hook.
        names: role -> the module's path inside the layer (for notes).
        layout: how the outputs hold their heads (:class:`~probe.architectures.layout.ProjectionLayout`).
        n_heads, n_kv_heads, d_head: the heads the outputs split into (query heads as the maps'), a query or
            key head's width.
        added: role -> a bias [heads * d_head] the module adds after the projection.
    """

    modules: dict[str, nn.Module]
    names: dict[str, str]
    layout: ProjectionLayout
    n_heads: int
    n_kv_heads: int
    d_head: int
    added: dict[str, torch.Tensor] = field(default_factory=dict)

    def heads(self, outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [batch, heads, Tq, d_head], k and v [batch, kv_heads, Tk, d_head] from the hooked modules' outputs
        (role -> [batch, T, width]), with :attr:`added` biases."""
        if "qkv" in outputs:
            fused = outputs["qkv"]
            q, k, v = self.layout.project(lambda role: (lambda x: fused), fused, self.n_heads, self.n_kv_heads,
                                          self.d_head)
        else:
            q, k, v = (self.layout.values(outputs[r], n, self.d_head)
                       for r, n in (("q", self.n_heads), ("k", self.n_kv_heads), ("v", self.n_kv_heads)))
        got = {"q": q, "k": k, "v": v}
        for role, bias in self.added.items():
            x = got[role]
            got[role] = x + bias.to(x.dtype).reshape(1, -1, 1, self.d_head)
        return got["q"], got["k"], got["v"]


def _refuse(spec: ArchSpec, why: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"attention steps do not run on {spec.family}: its attention is its own code, outside transformers' "
        f"AttentionInterface, and {why}")


def own_projections(model: nn.Module, spec: ArchSpec, site: Site) -> OwnProjections:
    """The query, key and value projections of a capture-only site (module docstring).

    Raises:
        UnsupportedArchitectureError: no module of the names probe knows (naming the modules looked in), or
            widths that do not split into the maps' heads (naming them).
    """
    layer = site_block(model, spec, site)
    parts = [p for p in site_spec(spec, site).attention.split(".") if p]
    places = [".".join(parts[:n]) for n in range(len(parts), 0, -1)] or [""]
    H = spec.dims[1]
    for place in places:
        holder = layer.get_submodule(place)
        children = dict(holder.named_children())
        prefix = f"{place}." if place else ""
        for names in SEPARATE:
            mods = [children.get(n) for n in names]
            if all(m is not None and _width(m) for m in mods):
                wq, wk, wv = (_width(m) for m in mods)
                if wq % H or wk % (wq // H) or wv != wk or H % (wk // (wq // H)):
                    raise _refuse(spec, f"the widths of its projections {', '.join(prefix + n for n in names)} "
                                        f"({wq}, {wk}, {wv}) do not split into its {H} heads")
                dh = wq // H
                roles = dict(zip("qkv", mods))
                return OwnProjections(roles, {r: prefix + n for r, n in zip("qkv", names)},
                                      projection_layout("separate"), H, wk // dh, dh, _added(holder, wq))
        for name, layout in FUSED.items():
            m = children.get(name)
            w = None if m is None else _width(m)
            if w:
                if w % (3 * H):
                    raise _refuse(spec, f"the width {w} of its fused projection {prefix + name} does not split "
                                        f"into q, k and v of its {H} heads")
                return OwnProjections({"qkv": m}, {"qkv": prefix + name},
                                      projection_layout(layout, conv1d=layout == "conv1d"), H, H, w // (3 * H),
                                      _added(holder, w // 3))
        shared = [n for n in SHARED if _width(children.get(n, nn.Identity())) is not None]
        if shared:
            raise _refuse(spec, f"its {type(holder).__name__} projects queries and keys with one shared module "
                                f"({prefix + shared[0]}), hashes them into buckets and normalises the keys: probe has "
                                "no key projection whose output the model compares")
    where = ", ".join(type(layer.get_submodule(p)).__name__ for p in places)
    known = ", ".join("/".join(n) for n in SEPARATE) + ", " + ", ".join(FUSED)
    raise _refuse(spec, f"probe found no query, key and value projections in {where} (it knows {known})")


def _added(holder: nn.Module, width: int) -> dict[str, torch.Tensor]:
    out = {}
    for role, name in ADDED_BIASES.items():
        b = getattr(holder, name, None)
        if isinstance(b, torch.Tensor) and b.dim() == 1 and b.numel() == width:
            out[role] = b.detach()
    return out


def own_scale(config, family: str, d_head: int) -> float:
    """The multiplier of q . k in a capture-only type's own code: 1/sqrt(d_head) (Vaswani et al. 2017,
    sec. 3.2.1), except where its config says otherwise: DeBERTa v1's 1/sqrt(d_head * (1 + position terms))
    (:func:`probe.architectures.disentangled.disentangled_scaling`), MPT's ``attn_config.softmax_scale``."""
    if family == "deberta":
        return disentangled_scaling(config, d_head, 0)
    if family == "mpt":
        given = getattr(getattr(config, "attn_config", None), "softmax_scale", None)
        if given is not None:
            return float(given)
    return d_head ** -0.5
