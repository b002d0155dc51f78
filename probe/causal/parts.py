"""Where a model whose spec probe discovered (no hand-written entry) keeps each block's norms and MLP,
and its final norm: found by one short pass that records the order in which the direct children of
every block, and of the base model, are first called.

In a block, a norm whose input is the attention module's output is the attention's *post-norm*
(Gemma 2's, GLM-4's and OLMo2's norm after the sub-layer, before the residual add), one whose input is
the MLP's output the MLP's post-norm; of the others, the attention's norm is the last one called
before the attention module (none: the heads read the stream itself, OLMo2), the MLP the modules with
parameters called after the attention that are not norms (its input the first one's, its write the
last one's output: OPT's ``fc1`` and ``fc2``), and the MLP's norm the last norm called between the two
(none: the MLP reads the attention's norm, one norm for a parallel block as GPT-J's, or, with no
norm before the attention either, the stream itself). A block whose output is a norm's output
normalises the residual stream after adding to it: a *post-LN* block (BERT, OPT-350m), whose stream
is not a sum of writes. The final norm is the last norm called after the blocks by the module that holds their list
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
from ..errors import UnsupportedAnalysisError

_NORM_NAME = re.compile(r"norm|(^|_)ln(_|\d|$)")


def is_norm(name: str, module: nn.Module) -> bool:
    """Whether a child named ``name`` is a norm by its class or attribute name (see the module docstring)."""
    return "norm" in type(module).__name__.lower() or bool(_NORM_NAME.search(name.lower()))


@dataclass
class Parts:
    """Per block (in the order of the model's sites): ``norm`` the attention's norm, ``mlp`` the MLP
    (its first module), ``mlp_norm`` the MLP's norm or None (it reads ``norm``'s output, or the stream
    where ``norm`` is None too); ``mlp_out`` the module whose output is the MLP's write (``mlp`` but
    for an MLP of several modules), ``attn_post``/``mlp_post`` the post-norms or None, ``post_ln`` the
    blocks whose output is a norm's output; ``final`` the final norm or None, ``after_final`` the
    modules with parameters the base model calls after it (OPT's ``project_out``, between the final
    norm and the unembedding). A missing norm or MLP is None."""

    norm: list[nn.Module | None]
    mlp: list[nn.Module | None]
    mlp_norm: list[nn.Module | None]
    final: nn.Module | None
    mlp_out: list[nn.Module | None]
    attn_post: list[nn.Module | None]
    mlp_post: list[nn.Module | None]
    post_ln: list[bool]
    after_final: list[nn.Module]


def _first(x):
    """The first tensor of a module's input or output (a tuple's first element)."""
    while isinstance(x, (tuple, list)) and x:
        x = x[0]
    return x if isinstance(x, torch.Tensor) else None


def _call_order(model: nn.Module, parents: list[nn.Module], inputs: dict) -> tuple[list[list[str]], list[dict]]:
    """For each parent, the names of its direct children in the order of their first call in one pass;
    a parent's own first call is recorded in its parent's list as ``"@<index>"`` (so that the base
    model's list says which of its children ran after the blocks). And for each block (every parent
    but the last), name -> (input, output) of each child's first call (``"@"``: the block's own)."""
    order: list[list[str]] = [[] for _ in parents]
    io: list[dict] = [{} for _ in parents[:-1]]
    with Hooks() as hooks, torch.no_grad():
        for i, parent in enumerate(parents):
            for name, child in parent.named_children():
                def pre(module, args, kwargs, i=i, name=name):
                    if name not in order[i]:
                        order[i].append(name)
                        if i < len(io):
                            io[i][name] = [_first(args) if args else _first(kwargs.get("hidden_states")), None]
                hooks.forward_pre(child, pre, with_kwargs=True)
                if i < len(io):
                    def post(module, args, out, i=i, name=name):
                        if io[i][name][1] is None:
                            io[i][name][1] = _first(out)
                    hooks.forward(child, post)
            if i < len(parents) - 1:
                def own(module, args, i=i):
                    if f"@{i}" not in order[-1]:
                        order[-1].append(f"@{i}")
                hooks.forward_pre(parent, own)

                def own_out(module, args, out, i=i):
                    io[i].setdefault("@", _first(out))
                hooks.forward(parent, own_out)
        model(**inputs)
    return order, io


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))


def _block_parts(block: nn.Module, order: list[str], io: dict, attention: str) -> tuple:
    """(norm, mlp, mlp_norm, mlp_out, attn_post, mlp_post, post_ln) of one block (:class:`Parts`)."""
    if attention not in order:
        return None, None, None, None, None, None, False
    at = order.index(attention)
    children = dict(block.named_children())
    normed = {n for n in order if is_norm(n, children[n])}
    post_ln = any(_same(io["@"], io[n][1]) for n in normed) if "@" in io else False
    attn_post = next((n for n in order[at + 1:] if n in normed and _same(io[n][0], io[attention][1])), None)
    after = [n for n in order[at + 1:] if n != attn_post]
    mlps = [n for n in after if n not in normed and not isinstance(children[n], nn.Dropout)
            and any(True for _ in children[n].parameters())]
    mlp_post = next((n for n in after if n in normed and mlps and _same(io[n][0], io[mlps[-1]][1])), None)
    norms_before = [n for n in order[:at] if n in normed]
    norm = children[norms_before[-1]] if norms_before else None
    get = lambda n: None if n is None else children[n]  # noqa: E731
    if not mlps:
        return norm, None, None, None, get(attn_post), None, post_ln
    between = [n for n in after[:after.index(mlps[0])] if n in normed]
    return (norm, children[mlps[0]], get(between[-1] if between else None), children[mlps[-1]], get(attn_post),
            get(mlp_post), post_ln)


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
    (*orders, top), io = _call_order(model, [*blocks, base], inputs)
    found = [_block_parts(b, o, d, site_spec(spec, s).attention.split(".")[0])
             for b, o, d, s in zip(blocks, orders, io, sites)]
    children = dict(base.named_children())
    ran = [i for i, name in enumerate(top) if name.startswith("@")]
    after = top[ran[-1] + 1:] if ran else []
    norms = [n for n in after if n in children and is_norm(n, children[n])]
    final = children[norms[-1]] if norms else None
    later = after[after.index(norms[-1]) + 1:] if norms else []
    projections = [children[n] for n in later if n in children and not is_norm(n, children[n])
                   and any(True for _ in children[n].parameters())]
    column = lambda j: [f[j] for f in found]  # noqa: E731
    return Parts(column(0), column(1), column(2), final, column(3), column(4), column(5), column(6), projections)


def post_ln(lm) -> bool:
    """Whether ``lm`` is post-LN: each block normalises the residual stream after adding to it (BERT,
    OPT with ``do_layer_norm_before=False``). A hand-written spec: an encoder (every hand-written
    encoder family is post-LN); a discovered one: a block whose output is a norm's output, or one with
    no norm before its attention nor after its output (its norms sit after the residual add, inside
    its sub-modules: XLM-R); a preview without weights (:func:`probe.loading.models.preview_model`):
    a config whose ``do_layer_norm_before`` is False (OPT-350m), the rest decided once loaded."""
    if not lm.spec.discovered:
        return lm.kind == "encoder"
    if lm.kind not in ("decoder", "encoder"):
        return False
    if lm.model is None:  # a preview before the weights load: what the config says (OPT's flag)
        return getattr(getattr(lm, "config", None), "do_layer_norm_before", True) is False
    parts = find_parts(lm)
    return any(parts.post_ln) or any(n is None and p is None for n, p in zip(parts.norm, parts.attn_post))


def check_pre_ln(lm, what: str) -> None:
    """Refuse ``what`` (an analysis that reads the residual stream as a sum of writes: direct logit
    attribution, composition, circuits, path patching) on a post-LN model (:func:`post_ln`), in one
    line, before any pass is measured.

    Raises:
        UnsupportedAnalysisError: ``lm`` is post-LN, or an image or speech model (its processor reads
            images or audio, not the text these analyses are measured on).
    """
    if hasattr(lm.tokenizer, "discovery_inputs"):  # an image or speech processor (probe.capture.discover)
        raise UnsupportedAnalysisError(f"{what}: measured on text models only; {lm.name} is an image or speech model")
    if post_ln(lm):
        raise UnsupportedAnalysisError(
            f"{what} needs a pre-LN model, and {lm.name} is post-LN: each block normalises the residual stream "
            "after adding to it, so the stream is not the sum of what the embeddings, heads and MLPs write")
