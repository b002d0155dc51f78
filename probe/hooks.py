"""Temporary PyTorch hooks: registered on entry, always removed on exit (also on exceptions).

Hooks are global state on a module; leaving one behind silently changes every later forward pass
(TransformerLens' lesson). Everything in probe that hooks a model goes through :class:`Hooks`.
"""

from __future__ import annotations

from typing import Callable

from torch import nn


class Hooks:
    """A context manager owning a set of hooks.

    Example::

        with Hooks() as hooks:
            hooks.forward(model.encoder.layer[0].attention.self, fn)
            model(**batch)
        # every hook is gone here, whatever happened inside
    """

    def __init__(self) -> None:
        self._handles = []

    def forward(self, module: nn.Module, fn: Callable, *, with_kwargs: bool = False) -> None:
        """Register ``fn(module, args, output)`` (or ``fn(module, args, kwargs, output)``) after forward."""
        self._handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs))

    def forward_pre(self, module: nn.Module, fn: Callable, *, with_kwargs: bool = False) -> None:
        """Register ``fn(module, args)`` (or ``fn(module, args, kwargs)``) before forward."""
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

    def remove(self) -> None:
        """Remove every hook registered so far (idempotent)."""
        while self._handles:
            self._handles.pop().remove()

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
