"""The one owner of a model's measuring state: temporary hooks, module swaps, attention
implementation, every module's train/eval flag and every parameter's ``requires_grad``, all
restored on exit (also on exceptions); and the check of every id a forward call looks up
(:mod:`probe.capture.lookups`).

Hooks are global state on a module; leaving one behind silently changes every later forward pass
(TransformerLens' lesson; nnsight's hooks remove themselves for the same reason). Everything in
probe that hooks a model or replaces one of its modules goes through :class:`Hooks`, and
everything that runs a model to measure it goes through :func:`measuring`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..architectures import get_spec
from ..architectures.discovered import IMPLEMENTATION
from ..errors import UnsupportedArchitectureError
from .interface import install
from .lookups import lookup_hook

log = logging.getLogger(__name__)


class Hooks:
    """A context manager owning a set of hooks and module replacements.

    Example::

        with Hooks() as hooks:
            hooks.forward(model.encoder.layer[0].attention.self, fn)
            model(**batch)
        # every hook is gone and every replaced module is back here, whatever happened inside
    """

    def __init__(self) -> None:
        self._handles = []
        self._replaced: list[tuple[nn.Module, str, nn.Module]] = []

    def forward(self, module: nn.Module, fn: Callable, *, with_kwargs: bool = False,
                always_call: bool = False) -> None:
        """Register ``fn(module, args, output)`` (or ``fn(module, args, kwargs, output)``) after forward."""
        self._handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs, always_call=always_call))

    def forward_pre(self, module: nn.Module, fn: Callable, *, with_kwargs: bool = False):
        """Register ``fn(module, args)`` (or ``fn(module, args, kwargs)``) before forward. Returns the
        handle (removed with the hooks; removing it earlier is allowed)."""
        handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
        self._handles.append(handle)
        return handle

    def own(self, handle) -> None:
        """Take charge of any handle with a ``remove()`` method (a :func:`probe.capture.interface.listen`
        listener): removed with the hooks."""
        self._handles.append(handle)

    def replace(self, parent: nn.Module, name: str, module: nn.Module) -> None:
        """Put ``module`` at ``parent.<name>``; the original goes back on :meth:`remove`."""
        self._replaced.append((parent, name, getattr(parent, name)))
        setattr(parent, name, module)

    def remove(self) -> None:
        """Remove every hook and restore every replaced module (idempotent; newest first)."""
        while self._handles:
            self._handles.pop().remove()
        while self._replaced:
            parent, name, original = self._replaced.pop()
            setattr(parent, name, original)

    def __len__(self) -> int:
        return len(self._handles) + len(self._replaced)

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def native(model: nn.Module) -> bool:
    """Whether the model's attention modules call transformers' attention interface (so probe's
    attention function runs them and every intervention point exists): transformers' own test of its
    modelling code."""
    check = getattr(model, "_can_set_attn_implementation", None)
    return bool(check()) if check is not None else False


def calls_function(lm) -> bool:
    """Whether ``lm``'s (a :class:`~probe.loading.models.LoadedModel`) attention modules call probe's
    attention function themselves: they call transformers' interface (:func:`native`), or its spec was
    discovered through that function. Otherwise (DeBERTa, BLOOM, GPT-Neo, MPNet; Falcon until transformers
    5.24) probe's reference module must be swapped in for the function to run
    (:func:`probe.capture.swapped.swap_if_agrees`)."""
    return native(lm.model) or lm.spec.discovered


def measuring_implementation(model: nn.Module) -> str:
    """The attention implementation probe measures a model under: ``"probe"``, probe's own function in
    transformers' ``AttentionInterface`` (:mod:`probe.capture.interface`), for every model whose
    attention modules call the interface (discovered specs, and the hand families whose transformers
    modules call it: BERT, GPT-2, LLaMA, ...); else ``"eager"`` (the module computes and returns its
    probabilities itself: DeBERTa, BLOOM, GPT-Neo, MPNet; Falcon until transformers 5.24)."""
    try:
        spec = get_spec(model.config)
    except UnsupportedArchitectureError:
        return "eager"
    if spec.implementation == "eager" and native(model):
        return IMPLEMENTATION
    return spec.implementation


def ensure_implementation(model: nn.Module, name: str) -> str | None:
    """Switch a model to the attention implementation ``name`` (not restored: use :func:`measuring`).

    Returns:
        A note saying what was switched, or None if the model already ran it (or ran eager attention
        and now runs probe's function: the same arithmetic, checked by ``probe verify``).
    """
    if name == "eager":
        return ensure_eager(model)
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl == name:
        return None
    if name == IMPLEMENTATION:
        install()
    model.set_attn_implementation(name)
    if name == IMPLEMENTATION and impl in (None, "eager"):
        return None  # the eager arithmetic, written by probe (verified equal): nothing the user must know
    note = (f"switched attention implementation from {impl!r} to {name!r} (probe's attention function, the eager "
            "arithmetic) so that attention probabilities exist")
    log.warning(note)
    return note


def ensure_eager(model: nn.Module) -> str | None:
    """Switch a model to eager attention if it uses another implementation (not restored: use
    :func:`measuring` for a temporary switch).

    ``sdpa`` and flash attention return ``None`` for the attention probabilities
    (transformers 5.x), so probe never silently gets empty weights. A model running probe's own
    function (:mod:`probe.capture.interface`: an enclosing :func:`probe.capture.intervene.intervening`, whose editors
    act only there) keeps it: it returns the probabilities as eager attention does.

    Returns:
        A note saying what was switched, or None if the model already ran eager attention (or
        probe's function).
    """
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl in (None, "eager", IMPLEMENTATION):
        return None
    model.set_attn_implementation("eager")
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        # a model outside transformers' attention interface cannot switch itself (Falcon); its layers
        # read the config at each call, so the config's setting is the switch
        model.config._attn_implementation = "eager"
    note = f"switched attention implementation from {impl!r} to 'eager' so that attention probabilities exist"
    log.warning(note)
    return note


@dataclass
class Measuring:
    """What :func:`measuring` yields.

    Attributes:
        hooks: a :class:`Hooks` owned by the context (removed on exit).
        notes: what was changed for measuring (and is restored on exit), and what the lookup check
            changed (:mod:`probe.capture.lookups`: segment ids dropped for a model with one segment type).
    """

    hooks: Hooks
    notes: list[str] = field(default_factory=list)


def _configs(model: nn.Module) -> list:
    """Every distinct config object of the model: each module's ``config`` and their sub-configs."""
    seen, out = set(), []
    stack = [getattr(m, "config", None) for m in model.modules()]
    while stack:
        config = stack.pop()
        if config is None or id(config) in seen or not hasattr(config, "to_dict"):
            continue
        seen.add(id(config))
        out.append(config)
        stack += [getattr(config, key, None) for key in getattr(config, "sub_configs", {}) or {}]
    return out


#: Config attributes a measuring pass may change: the attention implementation, the output and cache
#: switches (transformers 5 keeps some under a leading underscore, behind a property).
CONFIG_FLAGS = ("_attn_implementation_internal", "_output_attentions", "output_attentions", "output_hidden_states",
                "use_cache", "return_dict")


@dataclass
class ModelState:
    """Everything :func:`measuring` may change on a model, as it was: every module's own
    ``training`` flag, every parameter's ``requires_grad``, and :data:`CONFIG_FLAGS` of every config
    (the model's and its sub-models')."""

    training: list[tuple[nn.Module, bool]]
    requires_grad: list[tuple[nn.Parameter, bool]]
    config: list[tuple[object, str, object]]

    @classmethod
    def of(cls, model: nn.Module) -> ModelState:
        """The state of ``model`` now."""
        missing = object()
        flags = [(c, k, c.__dict__.get(k, missing)) for c in _configs(model) for k in CONFIG_FLAGS]
        return cls([(m, m.training) for m in model.modules()],
                   [(p, p.requires_grad) for p in model.parameters()],
                   [(c, k, v) for c, k, v in flags if v is not missing])

    def restore(self) -> None:
        """Put every flag back (modules and parameters replaced since keep theirs)."""
        for module, flag in self.training:
            module.training = flag
        for param, flag in self.requires_grad:
            if param.requires_grad != flag:
                param.requires_grad_(flag)
        for config, key, value in self.config:
            if config.__dict__.get(key) is not value:
                config.__dict__[key] = value


@contextmanager
def measuring(model: nn.Module, *, eager: bool = True, eval_mode: bool = True,
              implementation: str | None = None) -> Iterator[Measuring]:
    """Context manager: the model prepared for measuring, restored afterwards.

    Inside: eager attention (if ``eager``; so attention probabilities exist; a model with a discovered
    spec runs probe's own attention function instead, :func:`measuring_implementation`), eval mode (if
    ``eval_mode``; no dropout on the probabilities), every id of every forward call checked against
    the table it indexes (:func:`probe.capture.lookups.check_lookups`, a forward pre-hook on ``model``), and
    a :class:`Hooks` for the caller's hooks. On exit, also on exceptions: hooks removed, replaced
    modules back, and :class:`ModelState` restored: each module's own train/eval flag (a model in
    train mode with some sub-modules in eval mode comes back exactly so), each parameter's
    ``requires_grad`` and the attention implementation of every (sub-)config.

    Args:
        model: a Hugging Face model.
        eager: switch to eager attention (head gates and the swapped-in attention work under any
            implementation and pass False).
        eval_mode: run in eval mode.
        implementation: with ``eager``, the implementation to measure under (default
            :func:`measuring_implementation`: the model's spec's).

    Yields:
        :class:`Measuring` with ``hooks`` and ``notes``.

    Raises (at forward):
        InputError: an id outside its table (:func:`probe.capture.lookups.check_lookups`).
    """
    saved = ModelState.of(model)
    state, own = Measuring(Hooks()), Hooks()
    try:
        if eager:
            note = ensure_implementation(model, implementation or measuring_implementation(model))
            if note:
                state.notes.append(note + " (restored afterwards)")
        if eval_mode and any(m.training for m in model.modules()):
            state.notes.append("model was in train mode; measured in eval mode (attention dropout off) and restored")
            model.eval()
        # the lookup check is the context's own hook (callers may empty theirs between passes)
        own.forward_pre(model, lookup_hook(state.notes), with_kwargs=True)
        yield state
    finally:
        state.hooks.remove()
        own.remove()
        saved.restore()


def input_device(model) -> torch.device:
    """Where a model's inputs go: its embeddings' device (a model spread by a device map moves
    them on itself from the CPU when its embeddings are offloaded)."""
    try:
        embeddings = model.get_input_embeddings()
    except NotImplementedError:  # no embedding table (raw-waveform speech encoders): the first parameter's place
        embeddings = model
    # an image model's patch embedding is a module holding a convolution: its first parameter
    weight = getattr(embeddings, "weight", None)
    weight = weight if isinstance(weight, torch.Tensor) else next(embeddings.parameters())
    return torch.device("cpu") if weight.device.type == "meta" else weight.device
