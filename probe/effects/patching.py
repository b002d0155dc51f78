"""Activation patching per head: how much of the clean behaviour one head's output restores.

Two runs of a model on prompts of equal token count: the clean prompt (the model should say the
answer) and the corrupted one (a minimal change that moves it toward a wrong answer). The metric is
the logit difference LD = logit(answer) - logit(wrong) at the last real position (masked-LM
encoders: the clean prompt's first mask; encoder-decoder models: the decoder's last position, after
the pair's target prefix; :mod:`.pairs`), averaged over the pairs: LD_c (clean run), LD_x
(corrupted run), LD_p (a patched run).

The intervention point is head h's output z_h [batch, pos, d_head] before the output projection
(the ``"output"`` point of :mod:`probe.capture.intervene`, where the gates of :mod:`probe.causal.gates` act
too), per query head (with grouped key/value heads every query head has its own output).
Denoising (default; Meng et al. 2022's restoration, TransformerLens
``get_act_patch_attn_head_out_all_pos``): the corrupted run with the clean z_h, effect
P = (LD_p - LD_x) / (LD_c - LD_x): 0 = restores nothing, 1 = all of it. Noising: the clean run
with the corrupted z_h, effect 1 - P. All real positions, or the last only.
When |LD_c - LD_x| < 0.1 the pair set barely separates the answers: the effect is the raw
difference LD_p - LD_(unpatched run) in logits instead (the result says so).

Several patched copies of the batch share one forward pass; every pass, the unpatched baselines
included, has the same shape, so a patch that changes nothing gives exactly 0. Every model kind
runs the passes of :mod:`.patch_full`: decoders, masked-LM encoders and encoder-decoder models (every
encoder self, decoder self and cross head); where the model allows it (:mod:`.patch_layers`: one-stack
models), a patched pass re-enters the unpatched run at the lowest layer it patches instead of
computing the layers below again, the same numbers bit for bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..architectures import get_spec, needs_weights, site_block, weights
from ..capture.hooks import input_device
from ..capture.intervene import intervening
from ..causal.objectives import head_kind
from ..errors import InputError, UnsupportedAnalysisError
from .pairs import EncodedPairs, Pair, builtin_pairs, encode_pairs, parse_pairs, read_pairs
from .patch_full import full_pass, last_logit_diffs, model_inputs, patched_logits
from .patch_layers import layer_head_logit_diffs

__all__ = ["EncodedPairs", "Pair", "builtin_pairs", "encode_pairs", "parse_pairs", "read_pairs", "MIN_GAP",
           "DIRECTIONS", "check_patchable", "logit_diffs", "run_z", "patched_pass",
           "last_logit_diffs", "head_logit_diffs", "normalise", "patch_heads", "patch_residual",
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


@torch.no_grad()
def run_z(lm, ids: torch.Tensor, mask: torch.Tensor, copies: int = 1):
    """One pass on ``ids`` repeated ``copies`` times: (logits, every site's z [pairs, T, heads * d_head]
    from the first copy)."""
    logits, zs = patched_logits(lm, _inputs(lm, ids.repeat(copies, 1), mask.repeat(copies, 1)), keep_z=True)
    return logits, [z[: len(ids)] for z in zs]


def _inputs(lm, ids, mask) -> dict:
    device = input_device(lm.model)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "use_cache": False}


@torch.no_grad()
def patched_pass(lm, ids, mask, patches: dict, donor: list, alpha: float | None = None) -> torch.Tensor:
    """Logits of one pass with head outputs replaced (a one-stack model).

    Args:
        ids: [B, T] the run's tokens (copies side by side).
        mask: [B, T] 1 for real tokens.
        patches: site index -> [B, T, heads] bool, where z_h takes the donor's value.
        donor: per site [B, T, heads * d_head] the values patched in.
        alpha: None replaces the output (exactly the donor's value); a number interpolates
            z + alpha (donor - z) (alpha = 1 equals the replacement up to rounding).
    """
    return patched_logits(lm, _inputs(lm, ids, mask), patches, donor, alpha)[0]


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


#: LD of patched runs, one per job, for every model kind: passes re-entering the unpatched run at the patched
#: layer where the model allows it, else whole passes, the same numbers
#: (:func:`probe.effects.patch_layers.layer_head_logit_diffs`).
head_logit_diffs = layer_head_logit_diffs


def normalise(raw: np.ndarray, gap: float, direction: str) -> tuple[np.ndarray, bool]:
    """Effects from raw differences LD_p - LD_(unpatched run): denoising raw / gap, noising
    -raw / gap (= 1 - P); ``(raw, False)`` when |gap| < :data:`MIN_GAP`."""
    if abs(gap) < MIN_GAP:
        return raw.copy(), False
    return (raw if direction == "denoise" else -raw) / gap, True


def patch_heads(lm, pairs: list[Pair] | None = None, *, direction: str = "denoise",
                heads_per_pass: int | None = None, progress=None, estimate=None) -> pd.DataFrame:
    """Activation patching of every head's z_h, all real positions and the last one.

    Args:
        lm: a complete :class:`~probe.loading.models.LoadedModel` with logits over the vocabulary: a decoder
            or encoder-decoder model with its LM head, or an encoder with its masked-LM head.
        pairs: the prompt pairs (default :func:`builtin_pairs`; masked-LM pairs hold a mask token,
            encoder-decoder pairs are sources with an optional target prefix).
        direction: ``denoise`` (corrupted run, clean z_h; default) or ``noise`` (clean run, corrupted z_h).
        heads_per_pass: patched copies of the batch per forward pass (memory: copies x pairs x T tokens);
            default 2 x heads (one layer's heads, all positions and last, in one pass).
        progress: a callable ``(done, total)`` or None.
        estimate: a callable given one line, the time the patched passes will take as measured by the first
            passes (:class:`probe.effects.patch_layers.PatchForecast`), or None.

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
    ld_p, ld_base, means = head_logit_diffs(lm, enc, jobs, run=run, donor=donor, heads_per_pass=heads_per_pass,
                                            progress=progress, estimate=estimate)
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
            number is refused, never wrapped), or |gap| < MIN_GAP (pairs whose runs barely differ).
    """
    check_patchable(lm)
    blocks = _blocks_in_order(lm)
    if not (isinstance(layer, int) and not isinstance(layer, bool) and 0 <= layer < len(blocks)):
        raise InputError(f"no block {layer!r}: {lm.name} has blocks 0-{len(blocks) - 1}")
    enc = encode_pairs(lm, pairs)
    block = blocks[layer]
    saved = {}

    def save(args, kwargs):
        saved["call"] = ([a.clone() if torch.is_tensor(a) else a for a in args],
                         {k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})

    def load(args, kwargs):  # every tensor the block reads, from the clean run (masks are equal)
        a, kw = saved["call"]
        return (tuple(x if torch.is_tensor(x) else y for x, y in zip(a, args)),
                {k: kw[k] if torch.is_tensor(kw.get(k)) else v for k, v in kwargs.items()})

    lds = {}
    for name, ids, hook in (("clean", enc.clean, save), ("patched", enc.corrupted, load),
                            ("corrupted", enc.corrupted, None)):
        with intervening(lm) as iv:
            if hook:
                iv.before(block, hook)
            lds[name] = float(last_logit_diffs(full_pass(lm, enc, model_inputs(lm, enc, ids), 1)[0], enc, 1).mean())
    gap = lds["clean"] - lds["corrupted"]
    if abs(gap) < MIN_GAP:
        raise InputError(f"|LD_clean - LD_corrupted| = {abs(gap):.3g} < {MIN_GAP}: no normalised effect")
    return (lds["patched"] - lds["corrupted"]) / gap
