"""The one owner of a model's measuring state: temporary hooks, module swaps, attention
implementation and train/eval mode, all restored on exit (also on exceptions).

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

    def forward_pre(self, module: nn.Module, fn: Callable, *, with_kwargs: bool = False) -> None:
        """Register ``fn(module, args)`` (or ``fn(module, args, kwargs)``) before forward."""
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

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


def ensure_eager(model: nn.Module) -> str | None:
    """Switch a model to eager attention if it uses another implementation (not restored: use
    :func:`measuring` for a temporary switch).

    ``sdpa`` and flash attention return ``None`` for the attention probabilities
    (transformers 5.x), so probe never silently gets empty weights (shared/CASES.md F02).

    Returns:
        A note saying what was switched, or None if the model already ran eager attention.
    """
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl in (None, "eager"):
        return None
    model.set_attn_implementation("eager")
    note = f"switched attention implementation from {impl!r} to 'eager' so that attention probabilities exist"
    log.warning(note)
    return note


@dataclass
class Measuring:
    """What :func:`measuring` yields.

    Attributes:
        hooks: a :class:`Hooks` owned by the context (removed on exit).
        notes: what was changed for measuring (and is restored on exit).
    """

    hooks: Hooks
    notes: list[str] = field(default_factory=list)


@contextmanager
def measuring(model: nn.Module, *, eager: bool = True, eval_mode: bool = True) -> Iterator[Measuring]:
    """Context manager: the model prepared for measuring, restored afterwards.

    Inside: eager attention (if ``eager``; so attention probabilities exist, F02), eval mode (if
    ``eval_mode``; no dropout on the probabilities), and a :class:`Hooks` for the caller's hooks.
    On exit, also on exceptions: hooks removed, replaced modules back, the attention
    implementation and the train/eval mode as they were.

    Args:
        model: a Hugging Face model.
        eager: switch to eager attention (head gates and the swapped-in attention work under any
            implementation and pass False).
        eval_mode: run in eval mode.

    Yields:
        :class:`Measuring` with ``hooks`` and ``notes``.
    """
    impl = getattr(model.config, "_attn_implementation", "eager")
    state = Measuring(Hooks())
    switched = False
    if eager:
        note = ensure_eager(model)
        if note:
            switched = True
            state.notes.append(note + " (restored afterwards)")
    was_training = model.training
    if was_training and eval_mode:
        state.notes.append("model was in train mode; measured in eval mode (attention dropout off) and restored")
        model.eval()
    try:
        yield state
    finally:
        state.hooks.remove()
        model.train(was_training)
        if switched:
            model.set_attn_implementation(impl)


def input_device(model) -> torch.device:
    """Where a model's inputs go: its embeddings' device (a model spread by a device map moves
    them on itself from the CPU when its embeddings are offloaded)."""
    weight = model.get_input_embeddings().weight
    return torch.device("cpu") if weight.device.type == "meta" else weight.device
