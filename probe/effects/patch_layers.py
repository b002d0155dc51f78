"""Activation patching per head that re-enters the run at the patched layer: the layers below it are not run
again.

A patched pass of :mod:`.patch_full` patches the heads of one layer L (one copy of the pairs per head
and position set); everything below L is the unpatched run, computed again by every pass. Here the
unpatched run is computed once, by the pass that gives the baseline LD anyway, recording what each
block (transformer layer) returned; a patched pass then runs the model's own forward with the blocks
below L answering their recorded outputs instead of computing them (the embeddings, masks and
position embeddings the model builds before its first block are recomputed: they cost next to nothing
and stay the model's own), so only blocks L..end, the final norm and the head compute. Every
computed step has the inputs and the batch shape of the whole pass it replaces, so the numbers are
the whole passes' bit for bit (checked on each run: the unpatched run re-entered at its last block
must give its logits exactly, else the run falls back to whole passes).

Cost: the unpatched run and the donor run (two whole passes of ``copies`` copies), one re-entered
pass at the last block (the check), then a pass per chunk of jobs from the lowest layer the chunk
patches: about sum over chunks of (n_layers - L) / n_layers whole passes plus the head's share (the
head and final norm run in every pass). SmolLM2-135M (30 layers, the 20 built-in pairs, one thread): the
default ``probe patch``'s activation patching went from 32.3 to 19.5 bare forward passes' time, 2.08 to
1.26 times the bare work from each patched layer on (15.5 passes; ``benchmarks/bench_patch.py``,
docs/patching.md).

What a block returned is kept as it was, per block, as one copy of the pairs where the ``copies``
copies are bitwise equal ([pairs, T, d_model] per block; repeated when it is answered), whole
otherwise ([copies x pairs, T, d_model] per block: n_layers times one pass's hidden states).

The circuit evaluator re-enters its passes the same way (:class:`probe.circuits.evaluate.Evaluator`:
:func:`entered` with the graph's blocks, each computed block's output kept by :func:`copied`), at the
lowest layer where a circuit's plan differs from the last pass's.

Where the pass is not re-entered (whole passes, :func:`reentry_refusal` says why): encoder-decoder
models (the decoder's blocks read the encoder's output: two stacks), models whose blocks are shared
between layers (ALBERT) or are not each called once a pass in layer order, block outputs that are
not tensors, tuples or lists of them (or None), and any model whose re-entered unpatched run does not
reproduce its own logits exactly (a block reading state an earlier block left elsewhere, such as
layers sharing their keys and values).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from ..architectures import site_block
from ..capture.intervene import intervening
from .pairs import EncodedPairs
from .patch_full import full_pass, job_patches, last_logit_diffs, model_inputs


def _minutes(seconds: float) -> str:
    """``12 s`` below 90 s, else ``3.4 min`` (as :func:`probe.circuits.forecast.minutes`)."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def blocks(lm) -> list:
    """The model's blocks in site order (one per site where the pass can be re-entered)."""
    return [site_block(lm.model, lm.spec, s) for s in lm.sites]


def reentry_refusal(lm) -> str | None:
    """Why the pass of ``lm`` cannot be re-entered at a block, decided from its structure (None: it can,
    subject to the per-run check of :func:`layer_head_logit_diffs`)."""
    if lm.kind == "encoder-decoder":
        return "an encoder-decoder model: its decoder's blocks read the encoder's output"
    if len({id(b) for b in blocks(lm)}) != len(lm.sites):
        return "its blocks are shared between layers"
    return None


_REPEATED = object()  # the tag of a tensor kept as one copy of the pairs


def _pack(value, k: int, n: int):
    """``value`` (a block's output) with every tensor of k x n rows whose k copies are bitwise equal kept
    as its first n rows (cloned); raises TypeError for anything but tensors, tuples, lists and None."""
    if torch.is_tensor(value):
        if k > 1 and value.dim() and value.shape[0] == k * n:
            first = value[:n]
            if torch.equal(value.reshape(k, n, *value.shape[1:]), first.expand(k, *first.shape)):
                return (_REPEATED, first.clone())
        return value
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(_pack(v, k, n) for v in value)
    raise TypeError(f"a block returned a {type(value).__name__}")


def copied(value):
    """A block's output as :class:`Recorded` keeps it for a pass of one copy of the pairs (``copies`` 1):
    its tensors copied and detached, so that a later block cannot change a recorded one. Raises TypeError
    for anything but tensors, tuples, lists and None."""
    if torch.is_tensor(value):
        return value.detach().clone()
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(copied(v) for v in value)
    raise TypeError(f"a block returned a {type(value).__name__}")


def _unpack(value, k: int):
    """The block's output as recorded (a kept copy repeated k times along the batch)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] is _REPEATED:
        t = value[1]
        return t.repeat(k, *([1] * (t.dim() - 1)))
    if isinstance(value, (tuple, list)):
        return type(value)(_unpack(v, k) for v in value)
    return value


@dataclass
class Recorded:
    """What each block of one pass returned.

    Attributes:
        outputs: per block (site order), its output packed by :func:`_pack`.
        copies: copies of the pairs in the pass (k).
    """

    outputs: list
    copies: int


@contextmanager
def entered(lm, recorded: Recorded, start: int, order: list | None = None):
    """Context manager: inside, blocks ``0..start-1`` answer their recorded outputs without computing (their
    ``forward`` replaced on the instance; restored on exit, also on exceptions), so a pass computes blocks
    ``start..`` only. ``start`` 0 changes nothing. The model itself is changed for the context, as
    :func:`~probe.capture.intervene.intervening` changes it: one pass at a time (``probe live`` serializes its
    model's passes). ``order``: the blocks in the order of ``recorded.outputs``, or None: :func:`blocks`."""
    saved = []
    try:
        for j, block in enumerate((blocks(lm) if order is None else order)[:start]):
            saved.append((block, block.__dict__.get("forward")))
            block.forward = lambda *args, _j=j, **kwargs: _unpack(recorded.outputs[_j], recorded.copies)
        yield
    finally:
        for block, own in saved:
            if own is None:
                del block.forward
            else:
                block.forward = own


def recording_pass(lm, k: int, n: int, forward: Callable[[], torch.Tensor]):
    """``forward()`` (a whole pass of k copies of n pairs) recording each block's output: (what ``forward``
    returned, the :class:`Recorded` and None, or None and the reason where a block was not called once in
    order or returned something else)."""
    order, outputs = [], {}
    with intervening(lm) as iv:
        for j, block in enumerate(blocks(lm)):
            def keep(out, j=j):
                order.append(j)
                try:
                    outputs[j] = _pack(out, k, n)
                except TypeError as exc:
                    outputs[j] = exc
            iv.after(block, keep)
        at = forward()
    if order != list(range(len(lm.sites))):
        return at, None, "its blocks are not each called once a pass, in layer order"
    bad = [o for o in outputs.values() if isinstance(o, TypeError)]
    if bad:
        return at, None, str(bad[0])
    return at, Recorded([outputs[j] for j in range(len(lm.sites))], k), None


def checked(lm, recorded: Recorded, at: torch.Tensor, forward: Callable[[], torch.Tensor]):
    """The check of a re-entered run: ``forward()`` (the recorded unpatched pass) re-entered at the last block
    must return ``at``, what it returned whole, bit for bit. Returns ``(recorded, None)``, or ``(None, why)``
    where it differs or re-entering raised."""
    try:
        with entered(lm, recorded, len(lm.sites) - 1):
            again = forward()
    except Exception as exc:  # noqa: BLE001 (a block that cannot be skipped: whole passes)
        return None, f"re-entering the run failed: {type(exc).__name__}: {exc}"
    if not torch.equal(again, at):
        return None, "the unpatched run re-entered at its last block differs from it"
    return recorded, None


@contextmanager
def reentering(lm, recorded: Recorded | None, start: int):
    """:func:`entered` where there is a recorded run, else nothing (a whole pass)."""
    if recorded is None:
        yield
    else:
        with entered(lm, recorded, start):
            yield


@dataclass
class PatchForecast:
    """The time to come of activation patching, from its first passes: a whole pass (the unpatched run,
    ``blocks`` blocks) and a pass re-entered at the last block (one block) give a fixed cost (embedding,
    final norm, head, LD) and a cost a block; each patched pass then costs fixed + (blocks - L) x a block.
    Where the pass is not re-entered, each patched pass costs the whole pass.

    Attributes:
        clock: seconds, monotonic (tests give a fake one).
    """

    clock: Callable[[], float] = time.perf_counter
    started: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def line(self, whole: float, last: float | None, n_blocks: int, starts: list[int]) -> tuple[str, float]:
        """(the estimate line, the seconds it forecasts) for patched passes from blocks ``starts``, given the
        measured whole pass (``whole`` s) and the pass from the last block (``last`` s, None: no re-entry)."""
        if last is None or n_blocks < 2:
            fixed, per_block = 0.0, whole / max(1, n_blocks)
            starts = [0] * len(starts)
        else:
            per_block = max(0.0, (whole - last) / (n_blocks - 1))
            fixed = max(0.0, last - per_block)
        layer_passes = sum(n_blocks - s for s in starts) / max(1, n_blocks)
        left = sum(fixed + per_block * (n_blocks - s) for s in starts)
        elapsed = self.clock() - self.started
        how = (f"{per_block:.2f} s a block, {fixed:.2f} s a pass besides" if last is not None
               else f"{whole:.2f} s a whole pass")
        return (f"estimate from the first passes ({elapsed:.1f} s; {how}): about {_minutes(left)} for "
                f"{len(starts)} patched passes ({layer_passes:.1f} whole passes' blocks) on this machine as loaded "
                "now", left)


def layer_head_logit_diffs(lm, enc: EncodedPairs, jobs: list, *, run: str = "corrupted", donor: str = "clean",
                           heads_per_pass: int = 16, progress=None, estimate=None,
                           clock: Callable[[], float] = time.perf_counter,
                           reenter: bool = True, info: dict | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """LD of patched runs, one per job (site index, head, ``all`` or ``last``), each pass re-entering the
    unpatched run at the lowest layer its jobs patch; equal bit for bit to
    :func:`~probe.effects.patch_full.full_head_logit_diffs` (module docstring).

    Args:
        enc: the encoded pairs (n pairs, [n, T] tokens).
        jobs: (site index, head, ``all`` or ``last``), in site order (a pass patches consecutive jobs).
        run: ``clean`` or ``corrupted``: the run patched. donor: the run z_h comes from.
        heads_per_pass: patched copies k per forward pass (batch k x n).
        progress: a callable ``(done, total)`` or None.
        estimate: a callable given one line (:class:`PatchForecast`) after the first passes, or None.
        clock: the estimate's clock (seconds).
        reenter: False: whole passes (the same numbers; what the benchmark compares with).
        info: a dict filled with ``reentered`` (bool), ``why`` (None, or why whole passes ran) and ``starts``
            (the block each patched pass started at), or None.

    Returns:
        ``(ld_patched [jobs], ld_base [jobs], means)`` as :func:`~probe.effects.patching.head_logit_diffs`:
        float64 mean LD over the pairs (logits); ``means`` the clean and corrupted runs' mean LD.
    """
    forecast = PatchForecast(clock)
    k = max(1, min(heads_per_pass, len(jobs)))
    ids = {"clean": enc.clean, "corrupted": enc.corrupted}
    inputs = {name: model_inputs(lm, enc, ids[name], k) for name in ids}
    why = reentry_refusal(lm) if reenter else "whole passes asked for"
    t0 = clock()
    if why is None:
        at, recorded, why = recording_pass(lm, k, len(enc), lambda: full_pass(lm, enc, inputs[run], k)[0])
    else:
        at, recorded = full_pass(lm, enc, inputs[run], k)[0], None
    whole = clock() - t0
    lds = {run: last_logit_diffs(at, enc, k)}
    base = lds[run].mean(1).numpy()  # [k]
    donor_at, donor_z = full_pass(lm, enc, inputs[donor], k, keep_z=True)  # the same pass shape: exact own values
    lds[donor] = last_logit_diffs(donor_at, enc, k)
    for name in set(ids) - set(lds):  # run = donor: the other run's LD from a pass of its own
        lds[name] = last_logit_diffs(full_pass(lm, enc, inputs[name], k)[0], enc, k)
    means = {name: float(lds[name][0].mean()) for name in ids}
    last = None
    if recorded is not None:
        t0 = clock()
        recorded, why = checked(lm, recorded, at, lambda: full_pass(lm, enc, inputs[run], k)[0])
        last = clock() - t0 if recorded is not None else None
    chunks = [list(range(s, min(s + k, len(jobs)))) for s in range(0, len(jobs), k)]
    starts = [min(jobs[j][0] for j in chunk) if recorded is not None else 0 for chunk in chunks]
    if info is not None:
        info.update(reentered=recorded is not None, why=why, starts=starts)
    if estimate is not None:
        estimate(forecast.line(whole, last, len(lm.sites), starts)[0])
    patched, bases = np.zeros(len(jobs)), np.zeros(len(jobs))
    for chunk, start in zip(chunks, starts):
        patches = job_patches(lm, enc, [jobs[j] for j in chunk], k)
        with reentering(lm, recorded, start):
            logits = full_pass(lm, enc, inputs[run], k, patches, donor_z)[0]
        patched[chunk] = last_logit_diffs(logits, enc, k).mean(1).numpy()[: len(chunk)]
        bases[chunk] = base[: len(chunk)]
        if progress:
            progress(chunk[-1] + 1, len(jobs))
    return patched, bases, means

