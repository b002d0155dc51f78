"""The one place where heads are read and written: editors at the named points of probe's attention
function (:data:`probe.capture.interface.POINTS`), per attention site, and the setters built on them.

An *editor* is ``fn(tensor, call) -> tensor`` (:data:`probe.capture.interface.Editor`), run inside
:func:`probe.capture.interface.probe_attention` at one point of one site's every call:

====================  ==================================  =============================================
point                 tensor                              head axis
====================  ==================================  =============================================
``"query"``           [batch, heads, query, d_qk]         1 (after rotation)
``"key"``             [batch, kv_heads, key, d_qk]        1 (key/value heads as the model has them)
``"value"``           [batch, kv_heads, key, d_v]         1
``"pattern"``         [batch, heads, query, key]          1 (probabilities; the output is recomputed)
``"output"``          [batch, query, heads, d_v]          2 (each head's output before W_O: z)
====================  ==================================  =============================================

The residual stream outside the heads (a block's input, an MLP's output, the final norm's input) is
read and written by :meth:`Intervention.before` and :meth:`Intervention.after`, on the same
:class:`~probe.capture.hooks.Hooks`: causal methods register no hook of their own.

A reader is an editor that returns its input (:class:`Cache`); a setter returns a new tensor:
:func:`replace` (patching from another run's cache), :func:`zero`, :func:`mean`, :func:`scale`. A
new causal method is a setter, not a new hook. Setters are out-of-place and differentiable:
gradients flow through the edited tensors (and into a tensor ``alpha`` of :func:`scale`).

:func:`intervening` prepares a model: inside it every attention site whose module calls
transformers' attention interface runs probe's function (a hand-spec model is switched to it for
the context; a discovered one runs it already). A model whose attention modules do not call the
interface (DeBERTa, BLOOM, GPT-Neo, MPNet; Falcon until transformers 5.24) runs with probe's reference module
swapped in, which computes the family's q, k, v and position terms and calls the same function
(:mod:`probe.capture.swapped`), where that module reproduces the model bit for bit on a fixed check
batch; every point then exists for it too. Where it does not (or cannot be swapped in), the model
keeps its own attention; there, and only there, the ``"output"`` point is applied by a forward
pre-hook on the output projection, whose input is the heads' outputs side by side ([batch, seq,
heads * d_v]): the same editors, the same numbers; the other points are refused in one line
(:class:`~probe.errors.ProbeError`).

Under :func:`probe.capture.interface.row_blocks` the ``"pattern"`` and ``"output"`` editors run once per block
of query rows (``call.rows = (i0, i1)``; the tensors hold rows i0..i1-1); :func:`replace` slices a
full-length source to the block, and a :class:`Cache` reader concatenates the blocks of one call.

Example::

    with intervening(lm) as iv:
        iv.edit("output", lambda site: zero(heads=[3]) if site.layer == 1 else None)
        logits = forward(lm, batch).logits   # head 3 of layer 1 contributes nothing
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..architectures import output_projection_bypass, site_outputs
from ..architectures.discovered import refuse_capture_only
from ..errors import ProbeError, UnsupportedAnalysisError
from ..sites import Site
from .failures import forward_failures
from .hooks import Hooks, calls_function, measuring
from .interface import NAME, POINTS, Call, Editor, edit, edited, in_turn, install, served_sites
from .swapped import swap_if_agrees

#: The step an exception inside the model's own forward pass is reported in (:mod:`probe.capture.failures`).
STEP = "the intervention's forward passes (heads read or edited)"

#: The head axis of each point's tensor.
HEAD_AXIS = {"query": 1, "key": 1, "value": 1, "pattern": 1, "output": 2}
#: The query-row axis of the points that :func:`probe.capture.interface.row_blocks` splits.
ROW_AXIS = {"pattern": 2, "output": 1}

#: ``heads``: head indices at a point's head axis (the module's own numbering: key/value heads at
#: ``"key"``/``"value"``, slots on a physically pruned model), or None: every head.
Heads = Sequence[int] | None


def _index(heads: Sequence[int], device) -> torch.Tensor:
    return torch.as_tensor(list(heads), dtype=torch.long, device=device)


def _on_heads(tensor: torch.Tensor, point: str, heads: Heads,
              fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``tensor`` with its ``heads`` slice replaced by ``fn(slice)`` (out of place, differentiable)."""
    if heads is None:
        return fn(tensor).to(tensor.dtype).expand_as(tensor)
    axis, index = HEAD_AXIS[point], _index(heads, tensor.device)
    part = tensor.index_select(axis, index)
    return tensor.index_copy(axis, index, fn(part).to(tensor.dtype).expand_as(part).contiguous())


def _block(values: torch.Tensor, point: str, call: Call) -> torch.Tensor:
    """A full-length source cut to the block of query rows ``call.rows`` (itself outside blocks)."""
    if call.rows is None or point not in ROW_AXIS:
        return values
    axis, (i0, i1) = ROW_AXIS[point], call.rows
    if values.dim() <= axis or values.shape[axis] == 1:
        return values
    return values.narrow(axis, i0, i1 - i0)


def replace(values: torch.Tensor | Callable[[Call], torch.Tensor], point: str = "output",
            heads: Heads = None) -> Editor:
    """Setter: the ``heads`` of ``point`` become ``values`` (activation patching when ``values`` is
    another run's tensor at the same site, :class:`Cache`).

    Args:
        values: a tensor broadcastable to the point's tensor restricted to ``heads`` (e.g. [batch,
            query, len(heads), d_v] at ``"output"``; the full query length, cut to each block under
            row blocks), or ``values(call) -> tensor`` read at each call.
        point: one of :data:`probe.capture.interface.POINTS`.
        heads: head indices at the point (None: every head).

    Returns:
        The editor.
    """
    def editor(tensor: torch.Tensor, call: Call) -> torch.Tensor:
        source = values(call) if callable(values) else values
        source = _block(source.to(tensor.device), point, call)
        return _on_heads(tensor, point, heads, lambda part: source)
    return editor


def zero(point: str = "output", heads: Heads = None) -> Editor:
    """Setter: the ``heads`` of ``point`` become 0 (zero ablation; at ``"output"`` the same as zeroing
    the heads' rows of W_O: Michel et al. 2019's gate 0)."""
    return lambda tensor, call: _on_heads(tensor, point, heads, torch.zeros_like)


def scale(alpha: float | torch.Tensor, point: str = "output", heads: Heads = None) -> Editor:
    """Setter: the ``heads`` of ``point`` multiplied by ``alpha``.

    Args:
        alpha: a number, or a tensor broadcastable to the selected heads along the head axis: [n] (one
            factor per selected head) or [batch, n]; differentiable (head gates, Michel et al. 2019).
        point: one of :data:`probe.capture.interface.POINTS`.
        heads: head indices at the point (None: every head; then n = the point's head count).

    Returns:
        The editor.
    """
    def editor(tensor: torch.Tensor, call: Call) -> torch.Tensor:
        a, axis = torch.as_tensor(alpha, device=tensor.device), HEAD_AXIS[point]
        if a.dim():  # [n] or [batch, n]: n on the head axis, batch on the first
            batch = list(a.shape[:-1]) + [1] * (axis - a.dim() + 1)
            a = a.reshape(batch + [a.shape[-1]] + [1] * (tensor.dim() - axis - 1))
        return _on_heads(tensor, point, heads, lambda part: part * a.to(part.dtype))
    return editor


def mean(means: torch.Tensor, point: str = "output", heads: Heads = None) -> Editor:
    """Setter: the ``heads`` of ``point`` become their mean vectors (mean ablation), the same at every
    batch row and position.

    Args:
        means: [n, d] one vector per selected head (n = len(heads), or the point's head count), d
            the point's last dimension; not for ``"pattern"`` (use :func:`replace`).
        point: ``"query"``, ``"key"``, ``"value"`` or ``"output"``.
        heads: head indices at the point (None: every head).

    Returns:
        The editor.

    Raises:
        ValueError: ``point`` is ``"pattern"``.
    """
    if point == "pattern":
        raise ValueError("mean() sets one vector per head; a pattern is replaced with replace()")
    shaped = means[None, None] if point == "output" else means[None, :, None]
    return replace(shaped, point, heads)


class Cache(dict):
    """A dict filled by readers: ``cache.reader(name)`` is an editor that stores its tensor under
    ``name`` and returns it unchanged (blocks of one call concatenated along the query rows; a later
    call replaces an earlier one). Tensors are stored as they are (in the autograd graph when the pass
    records one: detach them, or run under ``torch.no_grad()``, to keep none)."""

    def reader(self, name, point: str = "output") -> Editor:
        """The editor storing ``point``'s tensor under ``name``."""
        def editor(tensor: torch.Tensor, call: Call) -> torch.Tensor:
            if call.rows is not None and call.rows[0] > 0 and point in ROW_AXIS:
                self[name] = torch.cat([self[name], tensor], dim=ROW_AXIS[point])
            else:
                self[name] = tensor
            return tensor
        return editor


def patch(cache: Cache, name, point: str = "output", heads: Heads = None) -> Editor:
    """Setter: the ``heads`` of ``point`` become ``cache[name]``'s (activation patching from a cached
    run, read at each call: fill or change the cache between passes)."""
    return replace(lambda call: cache[name].index_select(HEAD_AXIS[point], _index(heads, cache[name].device))
                   if heads is not None else cache[name], point, heads)


@dataclass
class Intervention:
    """What :func:`intervening` yields.

    Attributes:
        lm: the :class:`~probe.loading.models.LoadedModel`.
        hooks: the :class:`~probe.capture.hooks.Hooks` owning every editor (removed on exit).
        notes: what :func:`probe.capture.hooks.measuring` changed (restored on exit).
        native: every point exists (probe's attention function runs: called by transformers'
            interface, or by probe's reference module swapped in); False: only ``"output"``, by the
            output projection's pre-hook.
    """

    lm: object
    hooks: Hooks
    notes: list[str]
    native: bool
    _sites: dict = field(default_factory=dict)

    def edit(self, point: str, make: Callable[[Site], Editor | None]) -> None:
        """Register ``make(site)`` at ``point`` of every site (None: that site untouched). A module
        serving several sites (ALBERT's shared layer) gives each call the editor of its site, in
        forward order.

        Raises:
            ProbeError: a point other than ``"output"`` on a model outside the attention interface that
                probe's reference module does not reproduce (the output projection's fallback).
            ValueError: an unknown point.
        """
        if point not in POINTS:
            raise ValueError(f"no edit point {point!r}; points: {', '.join(POINTS)}")
        if point != "output" and not self.native:
            raise ProbeError(f"{type(self.lm.model).__name__} does not call transformers' attention interface and "
                             f"probe's reference attention does not reproduce it as it runs: its heads' {point} "
                             "cannot be edited (only their output)")
        for module, sites in self._sites.items():
            editors = [make(site) for site in sites]
            if any(e is not None for e in editors):
                self.hooks.own(edit(module, point, _by_call(editors)))

    def edit_site(self, site: Site, point: str, editor: Editor) -> None:
        """Register ``editor`` at ``point`` of one site."""
        self.edit(point, lambda s: editor if s == site else None)

    def before(self, module: nn.Module, fn: Callable[[tuple, dict], tuple | None]) -> None:
        """The residual stream outside the heads (a block's input, the final norm's input): call
        ``fn(args, kwargs)`` before each forward of ``module``; it returns None (a reader) or the
        new ``(args, kwargs)`` (a setter: residual patching)."""
        self.hooks.forward_pre(module, lambda mod, args, kwargs: fn(args, kwargs), with_kwargs=True)

    def after(self, module: nn.Module, fn: Callable[[object], object | None]) -> None:
        """Call ``fn(output)`` after each forward of ``module`` (an MLP's output); it returns None
        (a reader) or the output the model goes on with."""
        self.hooks.forward(module, lambda mod, args, output: fn(output))


def _by_call(editors: list[Editor | None]) -> Editor:
    """One module's editor handing each call to the editor of its site (calls in forward order)."""
    if len(editors) == 1:
        return editors[0]
    pick = in_turn(editors)

    def editor(tensor: torch.Tensor, call: Call) -> torch.Tensor:
        own = pick(call)
        return tensor if own is None else own(tensor, call)
    return editor


def _output_hook(module: nn.Module, n_heads: int):
    """The fallback: a forward pre-hook on the output projection applying ``module``'s ``"output"``
    editors to its input [batch, seq, heads * d_v] seen as [batch, seq, heads, d_v]."""
    def hook(o, args):
        x = args[0]
        B, T, W = x.shape
        call = Call(module, None, None, None, None, {}, None, x.reshape(B, T, n_heads, W // n_heads))
        return (edited("output", call.output, call).reshape(B, T, W), *args[1:])
    return hook


_FALLBACK: weakref.WeakSet = weakref.WeakSet()  # output projections carrying the fallback hook now


class _Fallback:
    """The fallback's pre-hook on one output projection (one at a time per projection)."""

    def __init__(self, hooks: Hooks, o: nn.Module, hook) -> None:
        self.o, self.handle = o, hooks.forward_pre(o, hook)
        _FALLBACK.add(o)

    def remove(self) -> None:
        self.handle.remove()
        _FALLBACK.discard(self.o)


@contextmanager
def intervening(lm, *, eager: bool = False, eval_mode: bool = True) -> Iterator[Intervention]:
    """Context manager: ``lm`` ready for editors (:meth:`Intervention.edit`), everything restored on
    exit (also on exceptions).

    Inside: eval mode (if ``eval_mode``), probe's attention function (:data:`probe.capture.interface.NAME`)
    for a model whose modules call the interface (:func:`native`); else probe's reference module,
    which calls the same function, swapped in where it reproduces the model as it runs (eager
    attention if ``eager``, else as loaded; :func:`probe.capture.swapped.reference_agrees`); else the
    model's own attention with the ``"output"`` point applied at the output projection's input.
    Contexts nest: an inner one (or an inner
    :func:`probe.capture.hooks.measuring`) keeps probe's function, and the fallback's hook is put once.

    Args:
        lm: a :class:`~probe.loading.models.LoadedModel`.
        eager: a model outside the interface: switch it to eager attention (so that its modules
            return probabilities); the others run probe's function whatever ``eager`` says.
        eval_mode: run in eval mode (no attention dropout).

    Yields:
        :class:`Intervention`.

    Raises:
        UnsupportedAnalysisError: a model outside the interface whose output projection is unknown, or
            is never called under a known setting of its family (BLOOM's ``pretraining_tp > 1`` with
            ``slow_but_exact``), so that no head could be read or written.
        ModelForwardError: the model's own forward pass raised an exception (:mod:`probe.capture.failures`).
    """
    refuse_capture_only(lm.spec, "an intervention on heads (ablation, patching, pruning gates, attribution)")
    own = calls_function(lm)
    if own:
        install()
    elif (why := output_projection_bypass(lm.model.config)) is not None:
        o = lm.spec.site_specs[0].o
        raise UnsupportedAnalysisError(f"probe cannot read or write the heads of {lm.name}: the output projection "
                                       f"({o}) is never called: {why}")
    with measuring(lm.model, eager=own or eager, eval_mode=eval_mode, implementation=NAME if own else None) as m, \
            ExitStack() as stack, forward_failures(STEP, lm.model):
        own = own or swap_if_agrees(lm, stack)  # the reference module calls probe's function
        served = served_sites(lm.model, lm.spec)
        if not own:
            modules = {site: module for module, sites in served.items() for site in sites}
            for site, o in site_outputs(lm.model, lm.spec):
                if o not in _FALLBACK:  # a nested context's editors are applied by the outer one's hook
                    m.hooks.own(_Fallback(m.hooks, o, _output_hook(modules[site], _slots(lm, site))))
        yield Intervention(lm, m.hooks, m.notes, own, served)


def _slots(lm, site: Site) -> int:
    """Heads side by side at a site's output projection (slots on a physically pruned model)."""
    return lm.geometry.n_heads if lm.pruned is None else len(lm.pruned.layouts[site.layer].q)
