"""Capturing attention probabilities with forward hooks, site by site.

Each site's attention module (see :mod:`probe.architectures`) returns ``(attn_output, probs)``;
a forward hook hands ``probs`` ([batch, heads, query, key]) to a callback as soon as that layer has
run, so a caller can reduce it (e.g. to statistics) and let it go before the next layer: no n x n
maps are kept for the whole corpus.

The model is prepared by :func:`probe.capture.hooks.measuring`: a model loaded with ``sdpa`` or flash
attention (which return no probabilities) runs eager and says so; a model in
train mode runs in eval mode; both are restored afterwards.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from ..architectures import site_modules
from ..core import LoadedModel
from ..errors import CaptureError
from ..sites import Site
from ..text.inputs import Batch, Text, as_texts, collate, tokenize
from .failures import forward_failures
from .hooks import Hooks, calls_function, input_device, measuring
from .interface import scored, site_listeners
from .op import Scores
from .swapped import swap_if_agrees
from .values import ValueTracker

#: The step an exception inside the model's own forward pass is reported in (:mod:`probe.capture.failures`).
STEP = "capture (the forward passes that record attention)"
#: A capture callback: ``callback(site, probs)`` with probs [batch, heads, query, key].
SiteCallback = Callable[[Site, torch.Tensor], None]


def add_attention_hooks(hooks: Hooks, lm: LoadedModel, callback: SiteCallback) -> None:
    """Register, into ``hooks``, one forward hook per site calling ``callback(site, probs)``.

    Hooks sit on the attention modules in place now (the swapped-in reference ones inside
    :func:`probe.capture.reference.swap.swap_attention`).

    Raises (at forward):
        CaptureError: a site returned no attention probabilities.
    """
    model = lm.model
    if lm.spec.discovered:
        add_listeners(hooks, lm, callback)
        return
    probs_of = lm.spec.probs  # where the module's output tuple holds the probabilities

    def make_hook(site: Site):
        def hook(module, args, output):
            if getattr(module, "query_block", None) is not None:
                return  # a swapped-in reference module computing blocks hands them on (probe.capture.blocks)
            probs = probs_of(output)
            if probs is None:
                raise CaptureError(
                    f"site {site.name} returned no attention probabilities "
                    f"(attention implementation {model.config._attn_implementation!r}); load with eager attention")
            if lm.spec.capture_only:
                check_probabilities(lm.spec.family, site, probs)
            callback(site, probs.detach())
        return hook

    for site, module in site_modules(model, lm.spec):
        name = lm.spec.probs_argument
        if name is not None and name in inspect.signature(module.forward).parameters:  # not the reference's
            hooks.forward_pre(module, _ask_for_probs(module, name), with_kwargs=True)
        hooks.forward(module, make_hook(site))


def check_probabilities(family: str, site: Site, probs: torch.Tensor) -> None:
    """Check the maps a capture-only model's own code returned (:attr:`probe.architectures.ArchSpec.capture_only`):
    no negative weight, every row summing to 1 or to 0 (a fully masked row), as attention probabilities do.

    Raises:
        CaptureError: maps that are not attention probabilities (an approximation at this length, Nystromformer's
            landmarks), in one line.
    """
    with torch.no_grad():
        sums = probs.float().sum(-1)
        off = ((sums - 1).abs() > 1e-3) & (sums.abs() > 1e-6)
        if bool(off.any()) or bool((probs < 0).any()):
            raise CaptureError(f"site {site.name}: the maps {family} returns at {probs.shape[-1]} tokens are not "
                               "attention probabilities (a negative weight or a row not summing to 1; its own code "
                               "approximates them at this length): probe cannot measure them")


def add_listeners(hooks: Hooks, lm: LoadedModel, callback: SiteCallback) -> None:
    """:func:`add_attention_hooks` for a discovered spec: the probabilities come from probe's attention
    function (:mod:`probe.capture.interface`), not from the module's output."""
    def on(site: Site, call) -> None:
        if call.rows is None:  # whole maps only (row blocks go to probe.capture.blocks' listeners)
            callback(site, call.probs.detach())
    site_listeners(hooks, lm.model, lm.spec, on)


def _ask_for_probs(module, name: str):
    """A forward pre-hook setting the module's ``name`` argument to True, wherever the caller put it
    (DeBERTa's attention returns its probabilities only when asked; its layers ask only when the
    config's ``output_attentions`` is set)."""
    params = list(inspect.signature(module.forward).parameters)  # a bound method: no self
    index = params.index(name)

    def pre_hook(mod, args, kwargs):
        if index < len(args):  # passed by position
            return args[:index] + (True,) + args[index + 1:], kwargs
        return args, {**kwargs, name: True}
    return pre_hook


def check_fired(lm: LoadedModel, seen) -> None:
    """Check that a forward pass handed probabilities from every site of ``lm`` (``seen``: the
    sites it did); a model variant that never calls a site's attention module would otherwise
    give fewer sites and no sign of it.

    Raises:
        CaptureError: some sites never ran their attention module, named.
    """
    missing = [s.name for s in lm.sites if s not in seen]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CaptureError(f"{len(missing)} of {len(lm.sites)} attention sites of {lm.name} gave no probabilities "
                           f"in a forward pass ({', '.join(missing[:3])}{more}): the model's forward pass does not "
                           "call their attention modules, so probe cannot measure them")


class ScoreTracker:
    """The :class:`~probe.capture.op.Scores` of each site's last call (or row block) of probe's attention
    function, kept until :meth:`take` (:func:`attention_hooks` with ``scores``).

    Args:
        lm: the loaded model; a pruned one's scores are put in the original numbering (NaN for
            removed heads), as its probabilities are.
    """

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self._kept: dict[Site, tuple[torch.Tensor, Scores | None]] = {}

    def hook(self, hooks: Hooks) -> None:
        """Listen to every site's calls of probe's function, keeping each call's scores (into ``hooks``)."""
        def keep(site: Site, call) -> None:
            self._kept[site] = (call.probs, call.scores)
        site_listeners(hooks, self.lm.model, self.lm.spec, keep)

    def take(self, site: Site, probs: torch.Tensor) -> Scores | None:
        """The scores of ``probs``, the site's probabilities just handed over (as its module returned
        them: before a pruned model's heads are put in the original numbering), or None: a module
        that computes attention itself, sink logits, an edited pattern, or probabilities that are not
        those the function computed (a forward hook that replaced them). They are let go."""
        kept, scores = self._kept.pop(site, (None, None))
        if scores is None or kept.shape != probs.shape or kept.data_ptr() != probs.data_ptr():
            return None
        if self.lm.pruned is None:
            return scores
        expand = self.lm.pruned.expand
        return Scores(expand(site.layer, scores.values), expand(site.layer, scores.top[..., None])[..., 0])


@contextmanager
def attention_hooks(lm: LoadedModel, callback: SiteCallback, values: ValueTracker | None = None,
                    scores: ScoreTracker | None = None) -> Iterator[list[str]]:
    """Context manager: call ``callback(site, probs)`` for every site on every forward pass.

    With ``values`` (a :class:`~probe.capture.values.ValueTracker`), each site's value projection is hooked
    too, so that ``values.take(site, probs)`` inside the callback gives that site's value norms; with
    ``scores`` (a :class:`ScoreTracker`), ``scores.take(site)`` gives the scores the probabilities were
    computed from, where probe's attention function computed them.

    Inside the context every attention call goes through probe's attention function
    (:mod:`probe.capture.interface`), in eval mode (:func:`probe.capture.hooks.measuring`): a model whose
    modules call transformers' attention interface runs it in place of eager attention; a hand family
    whose modules compute attention inline (DeBERTa, BLOOM, GPT-Neo, MPNet; Falcon until 5.24) gets probe's
    reference module swapped in, which calls it, where that module reproduces the model bit for bit
    (:func:`probe.capture.swapped.swap_if_agrees`), else runs eager attention and hands over the
    probabilities its modules return. On exit (also on exceptions) every hook is removed, the modules
    are put back and the attention implementation and train/eval mode are restored.

    Yields:
        Notes on what was changed to make capture correct (attention implementation, train mode).

    Raises:
        CaptureError: a site returned no attention probabilities.
        ModelForwardError: the model's own forward pass raised an exception (:mod:`probe.capture.failures`).
    """
    with measuring(lm.model) as m, ExitStack() as stack, forward_failures(STEP, lm.model):
        if not calls_function(lm):
            # a family whose modules compute attention inline: probe's reference module, which calls probe's
            # attention function, stands in where it reproduces the model bit for bit (else the module's own maps)
            swap_if_agrees(lm, stack)
        if values is not None:
            values.hook(m.hooks)
        if scores is not None:
            scores.hook(m.hooks)
            stack.enter_context(scored())
        add_attention_hooks(m.hooks, lm, callback)
        yield m.notes


def forward(lm: LoadedModel, batch: Batch, **kwargs):
    """Run the model on a batch (a model with a decoder without building a key/value cache), its
    inputs moved to the model's input device."""
    device = input_device(lm.model)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.model_inputs().items()}
    if lm.kind != "encoder":
        inputs["use_cache"] = False
    inputs.update(kwargs)
    return lm.model(**inputs)


def encode(lm: LoadedModel, texts: Sequence[str | Text] | str, max_length: int | None = None, *,
           parse_special_tokens: bool = False) -> Batch:
    """Tokenize texts into one right-padded :class:`~probe.text.inputs.Batch`.

    Raises:
        InputError: no texts, a text that yields no tokens, or max_length below 2.
    """
    items = as_texts(texts)
    return collate(lm, tokenize(lm, items, max_length, parse_special_tokens=parse_special_tokens), items)


@dataclass
class Captured:
    """Attention probabilities of one batch, for notebooks and tests.

    Attributes:
        sites: the model's attention sites, in forward order.
        probs: one tensor per site, [batch, heads, query, key] (padded positions included; use
            ``batch.real`` to drop them). ``captured[i]``, ``captured["encoder.3.self"]`` and
            ``captured[site]`` look one up.
        batch: the tokenized batch.
        outputs: the model's own outputs of the same forward pass.
        notes: what capture changed (attention implementation, train mode).
        norms: with ``capture_attention(..., value_norms=True)``, one tensor per site, [batch, heads,
            key]: ||f_h(x_j)||, the norm of key j's value vector carried through head h's slice of the
            output projection (:mod:`probe.capture.values`; ||A[i, j] f_h(x_j)|| = A[i, j] ||f_h(x_j)||);
            else None.
    """

    sites: list[Site]
    probs: list[torch.Tensor]
    batch: Batch
    outputs: object
    notes: list[str]
    norms: list[torch.Tensor] | None = None

    def __getitem__(self, key: int | str | Site) -> torch.Tensor:
        if isinstance(key, int):
            return self.probs[key]
        for site, p in zip(self.sites, self.probs):
            if key == site or key == site.name:
                return p
        raise KeyError(f"no site {key!r}; sites: {', '.join(s.name for s in self.sites)}")

    def __len__(self) -> int:
        return len(self.probs)


@torch.no_grad()
def capture_attention(lm: LoadedModel, texts: Sequence[str | Text] | str, max_length: int | None = None, *,
                      parse_special_tokens: bool = False, value_norms: bool = False) -> Captured:
    """Run one batch of texts and return every site's attention probabilities.

    Keeps every map in memory: for corpora use :func:`probe.runs.analysis.analyze`, which reduces each
    site to statistics as it goes.

    Args:
        lm: a loaded model.
        texts: one text or a list of texts (one batch, right-padded).
        max_length: token limit per text, >= 2 (default: the model's limit).
        parse_special_tokens: let typed special-token strings ("[SEP]") become special tokens
            (default: typed text is text).
        value_norms: also keep each site's value norms ||f_h(x_j)|| [batch, heads, key]
            (:attr:`Captured.norms`; Kobayashi et al. 2020, sec. 3), from the same forward pass, with
            the heads in the same order as ``probs`` (a pruned model's: the heads its modules hold).

    Returns:
        :class:`Captured`: ``probs[i]`` is [batch, heads, T, T] for site i (rows of real query tokens
        sum to 1; padded keys get exactly 0), with the tokenized batch and the model's outputs.

    Raises:
        InputError: empty input or max_length below 2.
        CaptureError: attention probabilities missing, or a site's attention module never called.
    """
    batch = encode(lm, texts, max_length, parse_special_tokens=parse_special_tokens)
    maps: dict[Site, torch.Tensor] = {}
    norms: dict[Site, torch.Tensor] = {}
    tracker = ValueTracker(lm) if value_norms else None

    def keep(site: Site, probs: torch.Tensor) -> None:
        if tracker is not None:
            norms[site] = tracker.take(site, probs, original_numbering=False).norms
        maps[site] = probs

    with attention_hooks(lm, keep, tracker) as notes:
        outputs = forward(lm, batch)
    check_fired(lm, maps)
    sites = lm.sites
    return Captured(sites, [maps[s] for s in sites], batch, outputs, notes,
                    [norms[s] for s in sites] if value_norms else None)
