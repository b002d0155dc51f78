"""Where a model whose spec probe discovered (no hand-written entry) keeps each block's norms and MLP,
and its final norm: found by one short pass that records the order in which the direct children of
every block, and of the base model, are first called.

In a block, the attention's norm is the last norm called before the attention module, the MLP the
first module with parameters called after it that is not a norm, and the MLP's norm the last norm
called between the two (none: the MLP reads the attention's norm, one norm for a parallel block as
GPT-J's). The final norm is the last norm called after the blocks by the module that holds their list
(the base model, or OPT's ``decoder``). A *norm* is a
module whose class or attribute name says so (``LayerNorm``, ``RMSNorm``, ``ln_f``, ``attn_norm``:
ModernBERT's first block names an ``nn.Identity`` ``attn_norm``, the embeddings being normed already).

What is found is a guess until the circuit graph's own pass checks it
(:func:`probe.circuits.checked.checked_graph`: the head inputs recomputed from the stream equal what
the attention received, the stream before the final norm is the sum of the writes), so a wrong guess
is refused in one line, never used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from ..architectures import base_model, site_block, site_modules
from ..architectures.modules import site_spec
from ..capture.hooks import Hooks, input_device

_NORM_NAME = re.compile(r"norm|(^|_)ln(_|\d|$)")


def is_norm(name: str, module: nn.Module) -> bool:
    """Whether a child named ``name`` is a norm by its class or attribute name (see the module docstring)."""
    return "norm" in type(module).__name__.lower() or bool(_NORM_NAME.search(name.lower()))


@dataclass
class Parts:
    """Per block (in the order of the model's sites): ``norm`` the attention's norm, ``mlp`` the MLP,
    ``mlp_norm`` the MLP's norm or None (it reads ``norm``'s output); ``final`` the final norm or None.
    A missing norm or MLP is None."""

    norm: list[nn.Module | None]
    mlp: list[nn.Module | None]
    mlp_norm: list[nn.Module | None]
    final: nn.Module | None


def _call_order(model: nn.Module, parents: list[nn.Module], inputs: dict) -> list[list[str]]:
    """For each parent, the names of its direct children in the order of their first call in one pass;
    a parent's own first call is recorded in its parent's list as ``"@<index>"`` (so that the base
    model's list says which of its children ran after the blocks)."""
    order: list[list[str]] = [[] for _ in parents]
    with Hooks() as hooks, torch.no_grad():
        for i, parent in enumerate(parents):
            for name, child in parent.named_children():
                def pre(module, args, i=i, name=name):
                    if name not in order[i]:
                        order[i].append(name)
                hooks.forward_pre(child, pre)
            if i < len(parents) - 1:
                def own(module, args, i=i):
                    if f"@{i}" not in order[-1]:
                        order[-1].append(f"@{i}")
                hooks.forward_pre(parent, own)
        model(**inputs)
    return order


def _block_parts(block: nn.Module, order: list[str], attention: str) -> tuple:
    if attention not in order:
        return None, None, None
    at = order.index(attention)
    children = dict(block.named_children())
    norms_before = [n for n in order[:at] if is_norm(n, children[n])]
    after = order[at + 1:]
    mlp = next((n for n in after if not is_norm(n, children[n]) and not isinstance(children[n], nn.Dropout)
                and any(True for _ in children[n].parameters())), None)
    if mlp is None:
        return (children[norms_before[-1]] if norms_before else None), None, None
    between = [n for n in after[:after.index(mlp)] if is_norm(n, children[n])]
    return (children[norms_before[-1]] if norms_before else None, children[mlp],
            children[between[-1]] if between else None)


def find_parts(lm) -> Parts:
    """The norms and MLPs of ``lm``'s blocks and its final norm, by one pass of six tokens (see the
    module docstring)."""
    model, spec = lm.model, lm.spec
    sites = [site for site, _ in site_modules(model, spec)]
    blocks = [site_block(model, spec, site) for site in sites]
    layers = site_spec(spec, sites[0]).layers  # the final norm is a sibling of the layer list (OPT's decoder.*)
    base = base_model(model)
    base = base.get_submodule(layers.rpartition(".")[0]) if "." in layers else base
    ids = torch.arange(1, 7, device=input_device(model))[None]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    *orders, top = _call_order(model, [*blocks, base], inputs)
    found = [_block_parts(b, o, site_spec(spec, s).attention.split(".")[0]) for b, o, s in zip(blocks, orders, sites)]
    children = dict(base.named_children())
    ran = [i for i, name in enumerate(top) if name.startswith("@")]
    after = top[ran[-1] + 1:] if ran else []
    norms = [n for n in after if n in children and is_norm(n, children[n])]
    final = children[norms[-1]] if norms else None
    return Parts([f[0] for f in found], [f[1] for f in found], [f[2] for f in found], final)
