"""Activation patching per head: how much of the clean behaviour one head's output restores.

Two runs of a model on prompts of equal token count: the clean prompt (the model should say the
answer) and the corrupted one (a minimal change that moves it toward a wrong answer). The metric is
the logit difference LD = logit(answer) - logit(wrong) at the last real position (masked-LM
encoders: the clean prompt's first mask; encoder-decoder models: the decoder's last position, after
the pair's target prefix; :mod:`.pairs`), averaged over the pairs: LD_c (clean run), LD_x
(corrupted run), LD_p (a patched run).

The intervention point is head h's slice z_h [batch, pos, d_head] of the output projection's input
(the site of :mod:`probe.causal.gates`, a forward pre-hook), per query head (with grouped
key/value heads every query head has its own slice). Denoising (default; Meng et al. 2022's
restoration, TransformerLens ``get_act_patch_attn_head_out_all_pos``): the corrupted run with the
clean z_h, effect P = (LD_p - LD_x) / (LD_c - LD_x): 0 = restores nothing, 1 = all of it.
Noising: the clean run with the corrupted z_h, effect 1 - P. All real positions, or the last only.
When |LD_c - LD_x| < 0.1 the pair set barely separates the answers: the effect is the raw
difference LD_p - LD_(unpatched run) in logits instead (the result says so).

Several patched copies of the batch share one forward pass; every pass, the unpatched baselines
included, has the same shape, so a patch that changes nothing gives exactly 0. Decoders continue
the recorded run from the patched layer; masked-LM encoders and encoder-decoder models (every
encoder self, decoder self and cross head) run whole passes (:mod:`.patch_full`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..architectures import get_spec, needs_weights, site_block, site_outputs, weights
from ..causal.objectives import head_kind
from ..errors import InputError, UnsupportedAnalysisError
from ..hooks import input_device, measuring
from .pairs import EncodedPairs, Pair, builtin_pairs, encode_pairs, parse_pairs, read_pairs
from .patch_full import full_head_logit_diffs, full_pass, job_patches, last_logit_diffs, model_inputs, patch_hook

__all__ = ["EncodedPairs", "Pair", "builtin_pairs", "encode_pairs", "parse_pairs", "read_pairs", "MIN_GAP",
           "DIRECTIONS", "check_patchable", "logit_diffs", "run_z", "patched_pass", "StackInputs", "capture_inputs",
           "continue_pass", "last_logit_diffs", "head_logit_diffs", "normalise", "patch_heads", "patch_residual",
           "final_norm"]

#: Below this |LD_c - LD_x| (logits) effects are not normalised (raw differences instead).
MIN_GAP = 0.1
DIRECTIONS = ("denoise", "noise")


def check_patchable(lm) -> None:
    """Raises UnsupportedAnalysisError unless ``lm`` is a complete model with logits over the vocabulary:
    a decoder or encoder-decoder model with its language-model head, or an encoder with its masked-LM head;
    UnsupportedArchitectureError for a discovered spec without the output projection patching acts at."""
    lm.require_all_heads("patching")
    needs_weights(lm.spec, "patching and direct logit attribution (at the output projection's input)", ("o",))
    if lm.kind == "encoder" and head_kind(lm) != "masked-lm":
        raise UnsupportedAnalysisError(
            f"{lm.name} is a {type(lm.model).__name__} without a masked-LM head: patching an encoder compares the "
            "logits of answer and wrong at a [MASK], which only a checkpoint with its masked-LM head (such as "
            "BertForMaskedLM) has")
    if lm.model.get_output_embeddings() is None:
        raise UnsupportedAnalysisError(f"{lm.name} was loaded without its language-model head: no logits to compare")


def check_patchable_config(config, name: str) -> None:
    """:func:`check_patchable`'s refusal of an encoder without its masked-LM head, decided from the
    config alone (``architectures``: the head ``load_model(head="auto")`` would build), before the
    weights load.

    Raises:
        UnsupportedAnalysisError: an encoder whose checkpoint names no masked-LM head.
    """
    archs = list(getattr(config, "architectures", None) or [])
    if get_spec(config).kind == "encoder" and not any("ForMaskedLM" in a for a in archs):
        raise UnsupportedAnalysisError(
            f"{name} is a {archs[0] if archs else config.model_type + ' model'} without a masked-LM head: patching "
            "an encoder compares the logits of answer and wrong at a [MASK], which only a checkpoint with its "
            "masked-LM head (such as BertForMaskedLM) has")


def logit_diffs(logits: torch.Tensor, enc: EncodedPairs, copies: int = 1) -> torch.Tensor:
    """[copies, pairs] logit(answer) - logit(wrong) at each pair's last real position (float64).

    Args:
        logits: [copies * pairs, T, vocab], the pairs repeated ``copies`` times.
    """
    n = len(enc)
    rows = torch.arange(copies * n)
    last, a, b = (t.repeat(copies).to(logits.device) for t in (enc.last, enc.answer, enc.wrong))
    at = logits[rows, last].double()
    return (at[rows, a] - at[rows, b]).reshape(copies, n).cpu()


def _layers(lm) -> list:
    return [o for _, o in site_outputs(lm.model, lm.spec)]


@torch.no_grad()
def run_z(lm, ids: torch.Tensor, mask: torch.Tensor, copies: int = 1):
    """One pass on ``ids`` repeated ``copies`` times: (logits, every layer's z [pairs, T, heads * d_head]
    from the first copy)."""
    zs = {}

    def hook(layer):
        def fn(module, args):
            zs[layer] = args[0][: len(ids)].clone()
        return fn

    with measuring(lm.model, eager=False) as m:
        for layer, o in enumerate(_layers(lm)):
            m.hooks.forward_pre(o, hook(layer))
        out = _forward(lm, ids.repeat(copies, 1), mask.repeat(copies, 1))
    return out, [zs[k] for k in sorted(zs)]


def _forward(lm, ids, mask):
    device = input_device(lm.model)
    return lm.model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits


@torch.no_grad()
def patched_pass(lm, ids, mask, patches: dict, donor: list, alpha: float | None = None) -> torch.Tensor:
    """Logits of one pass with head slices replaced.

    Args:
        ids: [B, T] the run's tokens (copies side by side).
        mask: [B, T] 1 for real tokens.
        patches: layer -> [B, T, heads] bool, where z_h takes the donor's value.
        donor: per layer [B, T, heads * d_head] the values patched in.
        alpha: None replaces the slice (exactly the donor's value); a number interpolates
            z + alpha (donor - z) (alpha = 1 equals the replacement up to rounding).
    """
    with measuring(lm.model, eager=False) as m:
        for layer, o in enumerate(_layers(lm)):
            m.hooks.forward_pre(o, patch_hook(lm, layer, patches, donor, alpha))
        return _forward(lm, ids, mask)


@dataclass
class StackInputs:
    """What each block of one pass received, to continue a pass from any block (the blocks before a
    patched layer compute nothing new, so they are not run again).

    Attributes:
        hidden: per block, its input hidden states [pairs, T, d_model].
        calls: per block, ``(args, kwargs)`` of its call without the hidden states (masks and position
            embeddings for ``copies`` copies).
        copies: copies of the pairs in the pass.
    """

    hidden: list
    calls: list
    copies: int


def _blocks(lm) -> list:
    return [site_block(lm.model, lm.spec, s) for s in lm.sites]


def _repeat(value, n: int, copies: int, heads: int):
    """``value`` (a block argument: tensor, tuple, list, dict or other) with every tensor whose first
    dimension is the batch of ``n`` rows (or batch x heads, BLOOM's ALiBi bias) repeated ``copies``
    times along it (batch-major, as the copies are)."""
    if isinstance(value, torch.Tensor):
        batched = value.dim() and value.shape[0] in (n, n * heads)
        return value.repeat(copies, *([1] * (value.dim() - 1))) if batched else value
    if isinstance(value, (tuple, list)):
        return type(value)(_repeat(v, n, copies, heads) for v in value)
    if isinstance(value, dict):
        return {k: _repeat(v, n, copies, heads) for k, v in value.items()}
    return value


@torch.no_grad()
def capture_inputs(lm, ids: torch.Tensor, mask: torch.Tensor, copies: int) -> StackInputs:
    """One pass of ``ids``, keeping every block's inputs, its other arguments (masks, position
    embeddings) repeated for ``copies`` copies of the batch."""
    n, saved = len(ids), {}

    def hook(i):
        def fn(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            rest = (args[1:], kwargs) if args else ((), {k: v for k, v in kwargs.items() if k != "hidden_states"})
            saved[i] = (x.clone(), _repeat(rest, n, copies, lm.geometry.n_heads))
        return fn

    with measuring(lm.model, eager=False) as m:
        for i, block in enumerate(_blocks(lm)):
            m.hooks.forward_pre(block, hook(i), with_kwargs=True)
        _forward(lm, ids, mask)
    keys = sorted(saved)
    return StackInputs([saved[k][0] for k in keys], [saved[k][1] for k in keys], copies)


def final_norm(lm) -> torch.nn.Module:
    """The final norm of a decoder (the module between the last block and the unembedding), named by
    the spec (:func:`probe.architectures.weights.final_norm`).

    Raises:
        UnsupportedAnalysisError: the spec names no final norm.
    """
    norm = weights.final_norm(lm.model, lm.spec)
    if norm is None:
        raise UnsupportedAnalysisError(f"{lm.name}: probe does not know where its final norm is")
    return norm


def _final(lm):
    """(final norm, LM head, softcap or None) of a decoder."""
    return final_norm(lm), lm.model.get_output_embeddings(), lm.spec.final_softcap(lm.model.config)


@torch.no_grad()
def continue_pass(lm, enc: EncodedPairs, inputs: StackInputs, start: int, patches: dict | None = None,
                  donor: list | None = None) -> torch.Tensor:
    """[copies * pairs, vocab] logits at each pair's last real position of a pass continued from block
    ``start`` (its recorded input), with head slices patched as in :func:`patched_pass`."""
    k = inputs.copies
    patches = patches or {}
    norm, head, cap = _final(lm)
    with measuring(lm.model, eager=False) as m:
        for layer, o in enumerate(_layers(lm)):
            m.hooks.forward_pre(o, patch_hook(lm, layer, patches, donor))
        blocks = _blocks(lm)
        x = inputs.hidden[start].repeat(k, 1, 1)
        for i in range(start, len(blocks)):
            args, kwargs = inputs.calls[i]
            out = blocks[i](x, *args, **kwargs) if args or "hidden_states" not in kwargs else blocks[i](
                hidden_states=x, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        x = x[torch.arange(len(x)), enc.last.repeat(k).to(x.device)]
        logits = head(norm(x))
    return cap * torch.tanh(logits / cap) if cap else logits


def head_logit_diffs(lm, enc: EncodedPairs, jobs: list, *, run: str = "corrupted", donor: str = "clean",
                     heads_per_pass: int = 16, progress=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """LD of patched runs, one per job, with the unpatched run of the same pass shape.

    Each pass continues the recorded run from the lowest layer it patches; the unpatched run goes
    through the same blocks and final projection, so a patch that changes nothing gives exactly 0.

    Args:
        jobs: (layer, head, where) with ``where`` ``all`` or ``last``.
        run: ``clean`` or ``corrupted``: the run patched.
        donor: ``clean`` or ``corrupted``: the run z_h comes from.
        heads_per_pass: patched copies per forward pass (each pass patches one layer's jobs).
        progress: a callable ``(done, total)`` or None.

    Returns:
        ``(ld_patched [jobs], ld_base [jobs], means)``: mean LD over pairs of each patched run and of
        the unpatched run in the same copy; ``means``: ``clean`` and ``corrupted`` LD means.
    """
    k = max(1, min(heads_per_pass, len(jobs)))
    ids = {"clean": enc.clean, "corrupted": enc.corrupted}
    inputs = {name: capture_inputs(lm, ids[name], enc.mask, k) for name in ("clean", "corrupted")}
    last = lm.geometry.n_layers - 1
    base = last_logit_diffs(continue_pass(lm, enc, inputs[run], last), enc, k).mean(1).numpy()  # [k]
    means = {name: float(last_logit_diffs(continue_pass(lm, enc, inputs[name], last), enc, k)[0].mean())
             for name in ("clean", "corrupted")}
    donor_z = [t.repeat(k, 1, 1) for t in run_z(lm, ids[donor], enc.mask)[1]]
    patched, bases = np.zeros(len(jobs)), np.zeros(len(jobs))
    by_layer: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        by_layer.setdefault(job[0], []).append(i)
    chunks = [group[s:s + k] for group in by_layer.values() for s in range(0, len(group), k)]
    done = 0
    for chunk in chunks:  # one layer per pass: it continues from that layer
        logits = continue_pass(lm, enc, inputs[run], jobs[chunk[0]][0],
                               job_patches(lm, enc, [jobs[i] for i in chunk], k), donor_z)
        patched[chunk] = last_logit_diffs(logits, enc, k).mean(1).numpy()[: len(chunk)]
        bases[chunk] = base[: len(chunk)]
        done += len(chunk)
        if progress:
            progress(done, len(jobs))
    return patched, bases, means


def normalise(raw: np.ndarray, gap: float, direction: str) -> tuple[np.ndarray, bool]:
    """Effects from raw differences LD_p - LD_(unpatched run): denoising raw / gap, noising
    -raw / gap (= 1 - P); ``(raw, False)`` when |gap| < :data:`MIN_GAP`."""
    if abs(gap) < MIN_GAP:
        return raw.copy(), False
    return (raw if direction == "denoise" else -raw) / gap, True


def patch_heads(lm, pairs: list[Pair] | None = None, *, direction: str = "denoise",
                heads_per_pass: int | None = None, progress=None) -> pd.DataFrame:
    """Activation patching of every head's z_h, all real positions and the last one.

    Args:
        lm: a complete :class:`~probe.models.LoadedModel` with logits over the vocabulary: a decoder
            or encoder-decoder model with its LM head, or an encoder with its masked-LM head.
        pairs: the prompt pairs (default :func:`builtin_pairs`; masked-LM pairs hold a mask token,
            encoder-decoder pairs are sources with an optional target prefix).
        direction: ``denoise`` (corrupted run, clean z_h; default) or ``noise`` (clean run, corrupted z_h).
        heads_per_pass: patched copies of the batch per forward pass (memory: copies x pairs x T tokens);
            default 2 x heads (one layer's heads, all positions and last, in one pass).
        progress: a callable ``(done, total)`` or None.

    Returns:
        One row per head of every site (``lm.sites`` order): ``stack``, ``kind``, ``layer``, ``head``,
        ``effect`` (all positions), ``effect_last`` (one position: the metric's; an encoder-decoder
        model's encoder heads, the source's last token), ``raw``, ``raw_last`` (LD_p - LD of the
        unpatched run, logits). ``attrs``: ``ld_clean``, ``ld_corrupted``, ``normalized``,
        ``direction``, ``pairs``, ``notes``.

    Raises:
        UnsupportedAnalysisError: not a complete model with logits (:func:`check_patchable`).
        InputError: pairs of unequal token counts, answers that are not one token, masks at different
            positions, a bad direction.
    """
    check_patchable(lm)
    if direction not in DIRECTIONS:
        raise InputError(f"direction {direction!r}: one of {', '.join(DIRECTIONS)}")
    enc = encode_pairs(lm, builtin_pairs() if pairs is None else pairs)
    S, H = len(lm.sites), lm.geometry.n_heads
    jobs = [(i, head, where) for i in range(S) for where in ("all", "last") for head in range(H)]
    heads_per_pass = heads_per_pass or 2 * H
    run, donor = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    measure = head_logit_diffs if lm.kind == "decoder" else full_head_logit_diffs
    ld_p, ld_base, means = measure(lm, enc, jobs, run=run, donor=donor, heads_per_pass=heads_per_pass,
                                   progress=progress)
    raw = (ld_p - ld_base).reshape(S, 2, H).transpose(1, 0, 2)  # [where, sites, heads]
    gap = means["clean"] - means["corrupted"]
    effect, normalized = normalise(raw, gap, direction)
    notes = [] if normalized else [
        f"|LD_clean - LD_corrupted| = {abs(gap):.3g} < {MIN_GAP}: the pairs barely separate the answers, so the "
        "effects are raw logit differences (LD_patched - LD_unpatched), not normalised"]
    frame = pd.DataFrame({"stack": np.repeat([s.stack for s in lm.sites], H),
                          "kind": np.repeat([s.kind for s in lm.sites], H),
                          "layer": np.repeat([s.layer for s in lm.sites], H), "head": np.tile(np.arange(H), S),
                          "effect": effect[0].ravel(), "effect_last": effect[1].ravel(), "raw": raw[0].ravel(),
                          "raw_last": raw[1].ravel()})
    frame.attrs.update(ld_clean=means["clean"], ld_corrupted=means["corrupted"], normalized=normalized,
                       direction=direction, pairs=len(enc), notes=notes)
    return frame


def _blocks_in_order(lm) -> list:
    """The model's blocks in forward order, each once (an encoder-decoder model: encoder, then decoder)."""
    return list(dict.fromkeys(site_block(lm.model, lm.spec, s) for s in lm.sites))


@torch.no_grad()
def patch_residual(lm, pairs: list[Pair], layer: int) -> float:
    """Denoising effect P of patching the whole input of block ``layer`` (blocks in forward order: an
    encoder-decoder model's encoder blocks, then its decoder blocks), all positions: the corrupted run
    continues from the clean run's inputs to that block, its residual stream and (a decoder block of an
    encoder-decoder model) the encoder output its cross-attention reads. A check: the last block gives
    1 exactly, since the rest of the pass is then the clean pass.

    Raises:
        UnsupportedAnalysisError, InputError: as :func:`patch_heads`, or no block ``layer`` (a negative
            number is refused, never wrapped); ValueError: |gap| < MIN_GAP.
    """
    check_patchable(lm)
    blocks = _blocks_in_order(lm)
    if not (isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < len(blocks)):
        raise InputError(f"no block {layer!r}: {lm.name} has blocks 0-{len(blocks) - 1}")
    enc = encode_pairs(lm, pairs)
    block = blocks[layer]
    saved = {}

    def save(module, args, kwargs):
        saved["call"] = ([a.clone() if torch.is_tensor(a) else a for a in args],
                         {k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})

    def load(module, args, kwargs):  # every tensor the block reads, from the clean run (masks are equal)
        a, kw = saved["call"]
        return (tuple(x if torch.is_tensor(x) else y for x, y in zip(a, args)),
                {k: kw[k] if torch.is_tensor(kw.get(k)) else v for k, v in kwargs.items()})

    lds = {}
    for name, ids, hook in (("clean", enc.clean, save), ("patched", enc.corrupted, load),
                            ("corrupted", enc.corrupted, None)):
        with measuring(lm.model, eager=False) as m:
            if hook:
                m.hooks.forward_pre(block, hook, with_kwargs=True)
            lds[name] = float(last_logit_diffs(full_pass(lm, enc, model_inputs(lm, enc, ids), 1)[0], enc, 1).mean())
    gap = lds["clean"] - lds["corrupted"]
    if abs(gap) < MIN_GAP:
        raise ValueError(f"|LD_clean - LD_corrupted| = {abs(gap):.3g} < {MIN_GAP}: no normalised effect")
    return (lds["patched"] - lds["corrupted"]) / gap
