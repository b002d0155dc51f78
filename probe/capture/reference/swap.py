"""``swap_attention``: put :class:`ReferenceAttention` into every attention site, reversibly."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from ...architectures import base_model, get_spec, site_spec, sites
from ...architectures.discovered import refuse_capture_only
from ...errors import UnsupportedArchitectureError
from ..hooks import Hooks
from ..op import MaskError, as_keep_mask
from .module import ForwardContext, ReferenceAttention
from .mutants import mutant_class


@dataclass
class Swapped:
    """What :func:`swap_attention` put in place.

    Attributes:
        modules: the :class:`ReferenceAttention` of every site, in forward order (``lm.sites``).
        originals: the original attention modules, in the same order (restored on exit).
        context: the shared :class:`ForwardContext`.
        notes: anything worth knowing about the swap (e.g. a model in train mode).
    """

    modules: list[ReferenceAttention]
    originals: list[nn.Module]
    context: ForwardContext
    notes: list[str] = field(default_factory=list)


def _binder(module: nn.Module):
    signature = inspect.signature(module.forward)

    def bind(args, kwargs) -> dict:
        arguments = signature.bind_partial(*args, **kwargs).arguments
        for name, param in signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        return arguments
    return bind


def _has(module: nn.Module, path: str | None) -> bool:
    """Whether ``module`` has a submodule at ``path``."""
    try:
        return path is not None and module.get_submodule(path) is not None
    except AttributeError:
        return False


def _checked_mask(arguments: dict) -> object:
    """The 2D keep-mask of a stack's forward call (or None), its length checked against the keys."""
    mask = arguments.get("attention_mask")
    if mask is None:
        return None
    new = next((arguments[n] for n in ("input_ids", "inputs_embeds") if arguments.get(n) is not None), None)
    cache = next((arguments[n] for n in ("cache", "past_key_values") if arguments.get(n) is not None), None)
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    if mask.dim() != 2:
        raise MaskError(f"the reference attention takes a 2D [batch, key] padding mask; got shape "
                        f"{tuple(mask.shape)} (it builds the causal mask itself)")
    if new is not None and mask.shape[1] != past + new.shape[1]:
        raise MaskError(f"attention_mask has {mask.shape[1]} columns but the keys are {past + new.shape[1]} "
                        f"({past} cached + {new.shape[1]} new tokens); pass a mask covering the cached and "
                        "new tokens")
    return as_keep_mask(mask)


def _stack_hooks(context: ForwardContext, spec, stack: str, module: nn.Module):
    """(pre, post) forward hooks of one stack's module: the pre-hook records the pass's padding
    keep-masks (for a decoder also the source's) and ``position_ids`` into ``context``; the
    post-hook clears them."""
    bind = _binder(module)

    def pre_hook(mod, args, kwargs):
        arguments = bind(args, kwargs)
        mask = _checked_mask(arguments)
        if spec.kind == "encoder-decoder":
            context.masks[stack] = mask
            if stack == "decoder":
                source = arguments.get("encoder_attention_mask")
                context.masks["source"] = None if source is None else as_keep_mask(source)
        else:
            context.attention_mask = mask
        context.position_ids = arguments.get("position_ids")
        context.active = True

    def post_hook(mod, args, kwargs, output):
        context.active = False
        context.attention_mask = context.position_ids = None
        context.masks.clear()
    return pre_hook, post_hook


@contextmanager
def swap_attention(model_or_lm, mutant: str | None = None, *, hooks: Hooks | None = None) -> Iterator[Swapped]:
    """Context manager: every attention site's module replaced by a :class:`ReferenceAttention`.

    Inside the context, forward passes of the model (also ``generate``) run the from-scratch
    attention; the weights are untouched (the reference modules hold the original modules). A
    forward pre-hook on each stack (the base model, or the encoder and decoder of an
    encoder-decoder model) records the 2D padding keep-masks ([batch, past + T]; for the decoder
    also the source's) and ``position_ids`` of each pass into a shared :class:`ForwardContext`.
    On exit, also on exceptions, the originals are back and the hooks gone.

    Args:
        model_or_lm: a :class:`~probe.loading.models.LoadedModel` or a Hugging Face model of a supported type.
        mutant: None, or a name from :data:`probe.capture.reference.mutants.MUTANTS` (a deliberately broken variant).
        hooks: a :class:`~probe.capture.hooks.Hooks` to register into (e.g. the one of
            :func:`probe.capture.hooks.measuring`); default a private one, removed on exit.

    Yields:
        :class:`Swapped`.

    Raises:
        ProbeError: unknown mutant. UnsupportedArchitectureError: unsupported model type.
        RopeError: a RoPE type the reference does not compute.
        MaskError (at forward): a 4D attention mask passed by the caller (the reference module must
            build causality itself), or a 2D mask whose length is not past + T.
    """
    model = getattr(model_or_lm, "model", model_or_lm)
    spec = get_spec(model.config)
    refuse_capture_only(spec, "probe's from-scratch attention module (verification by swapping, block capture, "
                              "mutants)")
    if spec.discovered:
        raise UnsupportedArchitectureError(
            f"{spec.family} has no hand-written spec: probe's from-scratch attention module (verification by "
            "swapping, mutants) needs one; capture, statistics and attention steps run through probe's attention "
            "function instead")
    cls = mutant_class(mutant)
    context = ForwardContext()
    base = base_model(model)
    originals, modules, parents = [], [], []
    for site in sites(model.config):
        paths = site_spec(spec, site)
        layer = base.get_submodule(paths.layers)[site.layer]
        original = layer.get_submodule(paths.attention)
        table = None
        if paths.bias_table is not None:
            table = base.get_submodule(paths.bias_table)
        rel = None
        if _has(base, paths.rel_embeddings):  # DeBERTa: the stack's relative table and its LayerNorm
            # (absent without relative_attention: then there are no position terms)
            norm = base.get_submodule(paths.rel_norm) if _has(base, paths.rel_norm) else None
            rel = (base.get_submodule(paths.rel_embeddings), norm)
        originals.append(original)
        modules.append(cls(original, spec, model.config, site.layer, context, site=site, bias_table=table,
                           rel_embeddings=rel))
        parent_path, _, name = paths.attention.rpartition(".")
        parents.append((layer.get_submodule(parent_path) if parent_path else layer, name))
    notes = sorted({n.split(": ", 1)[1] for m in modules for n in m.notes})
    if model.training:
        notes.append("the model is in train mode; the reference attention applies no dropout")
    own = hooks is None
    hooks = Hooks() if own else hooks
    try:
        for path, stack in {s.stack_module: s.stack for s in spec.site_specs}.items():
            stack_module = base.get_submodule(path) if path else base
            pre, post = _stack_hooks(context, spec, stack, stack_module)
            hooks.forward_pre(stack_module, pre, with_kwargs=True)
            hooks.forward(stack_module, post, with_kwargs=True, always_call=True)
        for (parent, name), module in zip(parents, modules):
            hooks.replace(parent, name, module)
        yield Swapped(modules, originals, context, notes)
    finally:
        if own:
            hooks.remove()
        context.active = False
        context.attention_mask = context.position_ids = None
        context.masks.clear()
