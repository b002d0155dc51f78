"""Block capture: long sequences measured a block of query rows at a time, in flat memory.

Hugging Face's eager attention materializes every layer's [batch, heads, T, T] scores and
probabilities; at T = 8,192 tokens that is gigabytes per layer before any statistic is computed.
Under block capture, probe's from-scratch attention (:class:`probe.capture.reference.ReferenceAttention`,
checked by ``probe verify`` to reproduce the model) is swapped into every site and computes each
layer's attention for query rows i0..i1-1 against every key (scores, masks, position bias, softmax,
probs @ V per block). Each block [batch, heads, i1 - i0, key] is handed to a callback and let go,
so no [heads, T, T] tensor exists; the model's outputs are those of the model (the reference's are
equal to them within the tolerance ``probe verify`` checks).

When (:func:`query_block_for`): a batch whose longest sequence exceeds :data:`AUTO_LENGTH` tokens,
or whose whole maps would hold more than :data:`AUTO_PROBABILITIES` probabilities per site, is
captured in blocks; ``query_block`` forces a block size (or 0: whole maps always). Block rows per
block: :data:`BLOCK_PROBABILITIES` probabilities per block (batch x heads x rows x keys).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..architectures import site_modules
from ..architectures.discovered import refuse_capture_only
from ..core import LoadedModel
from ..errors import InputError
from ..sites import Site
from ..text.inputs import Batch
from .hooks import Hooks
from .interface import row_blocks, site_listeners
from .reference.swap import swap_attention
from .swapped import is_swapped

#: A batch whose longest sequence (either side of an encoder-decoder model) exceeds this many
#: tokens is captured in query blocks unless the caller chose otherwise.
AUTO_LENGTH = 1024
#: ... as is a batch whose whole map of one site would hold more probabilities than this
#: (batch x heads x T x T; 2^28 = 1 GiB of float32).
AUTO_PROBABILITIES = 2 ** 28
#: Probabilities per block (batch x heads x rows x keys; 2^23 = 32 MiB of float32): the automatic
#: block size is this over batch x heads x keys, at least 1 row.
BLOCK_PROBABILITIES = 2 ** 23

#: ``on_block(site, probs, rows, n_query)``: probs [batch, heads, i1 - i0, key], rows (i0, i1).
BlockCallback = Callable[[Site, torch.Tensor, tuple[int, int], int], None]


def check_query_block(query_block: int | None) -> int | None:
    """The caller's ``query_block`` checked: None (automatic), 0 (whole maps always) or rows >= 1.

    Raises:
        InputError: a negative number or not an integer.
    """
    if query_block is None:
        return None
    if isinstance(query_block, bool) or not isinstance(query_block, int) or query_block < 0:
        raise InputError(f"query block must be a whole number of query rows >= 1 (or 0: whole maps); "
                         f"got {query_block!r}")
    return query_block


def longest(batch: Batch) -> int:
    """Tokens of the longest sequence of a padded batch (the longer side of an encoder-decoder pair)."""
    n = batch.input_ids.shape[1]
    return max(n, batch.target.input_ids.shape[1]) if batch.target is not None else n


def query_block_for(lm: LoadedModel, batch: Batch, query_block: int | None = None) -> int | None:
    """Query rows per block for ``batch``, or None: whole maps.

    Args:
        lm: the loaded model (its heads per site).
        batch: a right-padded batch.
        query_block: None: automatic (blocks above :data:`AUTO_LENGTH` tokens or
            :data:`AUTO_PROBABILITIES` probabilities per site; then :data:`BLOCK_PROBABILITIES`
            per block); 0: whole maps; n >= 1: blocks of n rows for every batch.
    """
    T, B, H = longest(batch), len(batch), lm.geometry.n_heads
    if lm.spec.capture_only and query_block:  # its maps come whole from its own code
        refuse_capture_only(lm.spec, "block capture (query_block)")
    if query_block == 0 or lm.spec.capture_only:
        return None
    if query_block is not None:
        return query_block
    if T <= AUTO_LENGTH and B * H * T * T <= AUTO_PROBABILITIES:
        return None
    return max(1, BLOCK_PROBABILITIES // (B * H * T))


@contextmanager
def block_capture(lm: LoadedModel, rows: int, on_block: BlockCallback, hooks=None) -> Iterator[list]:
    """Context manager: every site of ``lm`` runs probe's reference attention in blocks of ``rows``
    query rows, handing ``on_block(site, probs, (i0, i1), n_query)`` each block in row order.

    Forward hooks on the original attention modules do not fire inside (their modules are not
    called); hooks on the projections do (the reference calls the model's own projection modules).
    A decoder's attention implementation reads ``"sdpa"`` inside, so that Hugging Face does not
    build its eager [batch, 1, T, T] float mask (256 MiB at 8,192 tokens), which the reference
    ignores; it is restored on exit.

    Args:
        lm: the loaded model.
        rows: query rows per block (>= 1).
        on_block: the callback.
        hooks: a :class:`probe.capture.hooks.Hooks` to register into, or None (a private one).

    Yields:
        The notes of the swap (:attr:`probe.capture.reference.swap.Swapped.notes`).

    Raises:
        UnsupportedArchitectureError: a model type the reference does not cover.
        RopeError: a RoPE type the reference does not compute.
    """
    if lm.spec.discovered:
        with _function_blocks(lm, rows, on_block) as notes:
            yield notes
        return
    config = lm.model.config
    saved = config._attn_implementation
    try:
        if lm.kind == "decoder":  # the reference builds its own masks: let Hugging Face skip its [T, T] one
            config._attn_implementation = "sdpa"
        with _reference(lm, hooks) as (modules, notes):
            for site, module in zip(lm.sites, modules):
                module.query_block = rows
                module.on_block = _bound(on_block, site)
            yield notes
    finally:
        config._attn_implementation = saved


@contextmanager
def _reference(lm: LoadedModel, hooks) -> Iterator[tuple[list, list]]:
    """The reference modules at ``lm``'s sites, in site order, with the swap's notes: those capture
    swapped in already (a family outside the attention interface, :mod:`probe.capture.swapped`; their
    block settings cleared on exit), else swapped in for the context."""
    if is_swapped(lm):
        modules = [module for _, module in site_modules(lm.model, lm.spec)]
        try:
            yield modules, []
        finally:
            for module in modules:
                module.query_block = module.on_block = None
        return
    with swap_attention(lm, hooks=hooks) as swapped:
        yield swapped.modules, swapped.notes


@contextmanager
def _function_blocks(lm: LoadedModel, rows: int, on_block: BlockCallback) -> Iterator[list]:
    """:func:`block_capture` for a discovered spec: probe's attention function computes the blocks
    (:func:`probe.capture.interface.row_blocks`); the model must be measuring under it."""
    def on(site: Site, call) -> None:
        if call.rows is not None:
            on_block(site, call.probs.detach(), call.rows, call.query.shape[2])
    with Hooks() as own, row_blocks(rows):  # the listeners end with the context, whatever ``hooks`` holds
        site_listeners(own, lm.model, lm.spec, on)
        yield []


def lean_outputs(lm: LoadedModel) -> dict:
    """Keyword arguments of the model's forward that keep its outputs small under block capture:
    ``logits_to_keep=1`` where the model takes it (a causal LM's logits for the last position only;
    every position's would be [batch, T, vocab]: 1.6 GB of float32 for SmolLM2 at 8,192 tokens, more
    than all of block capture's own memory). Attention and hidden states are unchanged."""
    try:
        parameters = inspect.signature(lm.model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}


def _bound(on_block: BlockCallback, site: Site):
    def call(probs: torch.Tensor, rows: tuple[int, int], n_query: int) -> None:
        on_block(site, probs.detach(), rows, n_query)
    return call
