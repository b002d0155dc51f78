"""Activation patching by whole forward passes, the one engine for every model kind: decoders,
masked-LM encoders and encoder-decoder models. The head outputs are read and written at the
``"output"`` point of :mod:`probe.capture.intervene` (each head's output before the output projection).

The metric reads the logits where :class:`~probe.effects.pairs.EncodedPairs` says (``last``): a
masked-LM encoder's first mask, an encoder-decoder model's last decoder position (the decoder reads
the same start token and target prefix in both runs; the sources differ). Every head of every site is
patched: an encoder-decoder model's encoder self heads at the source positions, its decoder self and
cross heads at the decoder positions. ``last`` patches one position: the metric's (one-stack models,
decoder-side sites), the source's last real token (encoder sites of an encoder-decoder model).

Each pass holds ``copies`` copies of the pairs, one job (site, head, positions) per copy; the donor's
head outputs come from a pass of the same shape, and the unpatched baseline too, so a patch with the
run's own value gives exactly 0.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from ..capture.hooks import Hooks, input_device
from ..capture.intervene import Cache, intervening
from .pairs import EncodedPairs


def model_inputs(lm, enc: EncodedPairs, ids: torch.Tensor, copies: int = 1) -> dict:
    """Keyword arguments of the model's forward for ``ids`` (the clean or corrupted prompts, [pairs, T])
    repeated ``copies`` times, with the decoder's input for an encoder-decoder model."""
    device = input_device(lm.model)
    kw = {"input_ids": ids.repeat(copies, 1).to(device), "attention_mask": enc.mask.repeat(copies, 1).to(device)}
    if enc.target is not None:
        kw["decoder_input_ids"] = enc.target.repeat(copies, 1).to(device)
        kw["decoder_attention_mask"] = enc.target_mask.repeat(copies, 1).to(device)
    if lm.kind != "encoder":
        kw["use_cache"] = False
    return kw


def patch_editor(lm, i: int, patches: dict, donor: list, alpha: float | None = None):
    """Site ``i``'s ``"output"`` editor (:mod:`probe.capture.intervene`) that puts the donor's head outputs in
    where ``patches[i]`` ([B, T, heads] bool) says; ``alpha`` None replaces them (exactly the donor's
    value), a number interpolates z + alpha (donor - z). A site without patches is left alone.

    Args:
        donor: per site [B, T, heads * d_head] the values patched in.
    """
    def editor(z, call):  # [B, T, heads, d_head]
        if i not in patches:
            return z
        src = donor[i].to(z.device, z.dtype).reshape(z.shape)
        new = src if alpha is None else z + alpha * (src - z)
        return torch.where(patches[i].to(z.device)[..., None], new, z)

    return editor


def patched_logits(lm, inputs: dict, patches: dict | None = None, donor: list | None = None,
                   alpha: float | None = None, keep_z: bool = False):
    """One pass on the model's keyword arguments ``inputs``: (its logits, every site's z [B, T_site,
    heads * d_head] after the patches when ``keep_z``, else []), head outputs patched as in
    :func:`patch_editor`."""
    patches, zs = patches or {}, Cache()
    index = {site: i for i, site in enumerate(lm.sites)}
    with intervening(lm) as iv:
        iv.edit("output", lambda site: patch_editor(lm, index[site], patches, donor, alpha))
        if keep_z:
            iv.edit("output", lambda site: zs.reader(site))
        logits = lm.model(**inputs).logits
    return logits, [zs[site].flatten(2).clone() for site in lm.sites] if keep_z else []


#: Compute the logits at the metric positions only (:func:`metric_logits`); False: at every position, as a
#: plain forward pass (the tests compare the two).
METRIC_ROWS_ONLY = True


@contextmanager
def metric_logits(lm, rows_at: torch.Tensor):
    """Inside the block the model's output embedding (its LM head's last linear map, ``vocab x d_model``) is
    given only the hidden state at each row's metric position (``rows_at`` [B]), so that a pass computes
    [B, 1, vocab] logits instead of [B, T, vocab]: the metric reads one position, and on SmolLM2-135M
    (vocabulary 49,152) the head over every position was a third of a patched pass that starts half way
    up (measured on the live page: 0.29 s of each pass besides 0.02 s a block).

    Yields a dict whose ``picked`` is True once the head was given the picked rows; where the model
    never calls its output embedding as a module on [B, T, d] hidden states (a head written as a
    function), nothing changes and ``picked`` stays False (the caller indexes the full logits)."""
    state = {"picked": False}
    head = lm.model.get_output_embeddings() if hasattr(lm.model, "get_output_embeddings") else None
    if not METRIC_ROWS_ONLY or not isinstance(head, torch.nn.Module):
        yield state
        return

    def pick(module, args):
        x = args[0] if args else None
        if state["picked"] or not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[0] != len(rows_at):
            return None
        state["picked"] = True
        rows = torch.arange(x.shape[0], device=x.device)
        return (x[rows, rows_at.to(x.device)].unsqueeze(1), *args[1:])

    with Hooks() as hooks:
        hooks.forward_pre(head, pick)
        yield state


@torch.no_grad()
def full_pass(lm, enc: EncodedPairs, inputs: dict, copies: int, patches: dict | None = None,
              donor: list | None = None, keep_z: bool = False):
    """One pass: ([copies * pairs, vocab] logits at each pair's metric position, every site's z
    [copies * pairs, T_site, heads * d_head] when ``keep_z``), head outputs patched as in
    :func:`patch_editor`. The LM head runs at the metric positions only (:func:`metric_logits`)."""
    at_rows = enc.last.repeat(copies)
    with metric_logits(lm, at_rows) as head:
        logits, zs = patched_logits(lm, inputs, patches, donor, keep_z=keep_z)
    if head["picked"] and logits.dim() == 3 and logits.shape[1] == 1:
        return logits[:, 0], zs
    rows = torch.arange(copies * len(enc), device=logits.device)
    return logits[rows, at_rows.to(logits.device)], zs


def last_logit_diffs(logits_last: torch.Tensor, enc: EncodedPairs, copies: int) -> torch.Tensor:
    """[copies, pairs] logit(answer) - logit(wrong) from [copies * pairs, vocab] metric-position logits (float64)."""
    rows = torch.arange(copies * len(enc))
    at = logits_last.double().cpu()
    return (at[rows, enc.answer.repeat(copies)] - at[rows, enc.wrong.repeat(copies)]).reshape(copies, len(enc))


def positions(lm, enc: EncodedPairs, i: int, where: str) -> torch.Tensor:
    """[pairs, T_site] bool: the positions of site ``i`` a patch covers (``all`` real ones, or ``last``)."""
    decoder_side = enc.target is not None and lm.sites[i].stack == "decoder"
    mask = enc.target_mask if decoder_side else enc.mask
    if where == "all":
        return mask.bool()
    last = enc.last if decoder_side or enc.target is None else enc.source_last
    return torch.nn.functional.one_hot(last, mask.shape[1]).bool()


def job_patches(lm, enc: EncodedPairs, jobs: list, k: int) -> dict:
    """site -> [k * pairs, T_site, heads] masks for ``jobs`` (site, head, where), job j in copy j."""
    n, H, out = len(enc), lm.geometry.n_heads, {}
    for j, (i, head, where) in enumerate(jobs):
        pos = positions(lm, enc, i, where)
        sel = out.setdefault(i, torch.zeros(k * n, pos.shape[1], H, dtype=torch.bool))
        sel[j * n:(j + 1) * n, :, head] = pos
    return out


def full_head_logit_diffs(lm, enc: EncodedPairs, jobs: list, *, run: str = "corrupted", donor: str = "clean",
                          heads_per_pass: int = 16, progress=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """LD of patched runs, one per job (site index, head, ``all`` or ``last``), by whole passes.

    Args:
        run: ``clean`` or ``corrupted``: the run patched.
        donor: ``clean`` or ``corrupted``: the run z_h comes from.
        heads_per_pass: patched copies per forward pass.
        progress: a callable ``(done, total)`` or None.

    Returns:
        ``(ld_patched [jobs], ld_base [jobs], means)`` as :func:`~probe.effects.patching.head_logit_diffs`.
    """
    k = max(1, min(heads_per_pass, len(jobs)))
    ids = {"clean": enc.clean, "corrupted": enc.corrupted}
    inputs = {name: model_inputs(lm, enc, ids[name], k) for name in ids}
    base = last_logit_diffs(full_pass(lm, enc, inputs[run], k)[0], enc, k).mean(1).numpy()  # [k]
    lds = {name: last_logit_diffs(full_pass(lm, enc, inputs[name], k)[0], enc, k) for name in ids}
    means = {name: float(v[0].mean()) for name, v in lds.items()}
    donor_z = full_pass(lm, enc, inputs[donor], k, keep_z=True)[1]  # the same pass shape: exact own values
    patched, bases = np.zeros(len(jobs)), np.zeros(len(jobs))
    for s in range(0, len(jobs), k):
        chunk = list(range(s, min(s + k, len(jobs))))
        logits = full_pass(lm, enc, inputs[run], k, job_patches(lm, enc, [jobs[j] for j in chunk], k), donor_z)[0]
        patched[chunk] = last_logit_diffs(logits, enc, k).mean(1).numpy()[: len(chunk)]
        bases[chunk] = base[: len(chunk)]
        if progress:
            progress(chunk[-1] + 1, len(jobs))
    return patched, bases, means
