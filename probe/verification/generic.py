"""``verify`` for a model with a discovered spec (no hand-written one): probe's attention function
against the model's own.

Two comparisons on the battery's inputs (:mod:`.battery`; the padding-invariance case is left out):

* **each call**: the model runs under probe's function (:mod:`probe.capture.interface`), which records the
  query, key, value, mask and keyword arguments of every attention call; the model's own eager
  function (``eager_attention_forward`` of the module's modeling file) then runs on the same
  inputs (the mask as its additive 0 / finfo.min form). Probabilities (real query rows and keys) and
  attention outputs (real rows) are compared per layer.
* **the whole model**: the final outputs (logits, else ``last_hidden_state``; real positions) under
  probe's function against the model run with ``eager`` and with ``sdpa`` attention.

Where the arithmetic is the eager function's (float32 models), the differences are exactly 0;
``sdpa`` fuses the operations differently, so its comparison passes within the tolerances or within
:data:`SDPA_RTOL` of the largest output (max |difference| / max |output|). An eager function that
writes a sink logit another way (the softmax over the keys alone, the output scaled by the sink's
share: :func:`key_shares`) is compared as shares of the keys, and its outputs pass as sdpa's do. A hand spec's
from-scratch checks (RoPE, ALiBi, T5 buckets, mutants) need a hand spec: they are not run here.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import torch

from ..capture.hooks import Hooks, input_device, measuring
from ..capture.interface import NAME, Call, site_listeners
from ..core import LoadedModel
from .battery import Case, battery, select_cases
from .compare import CaseResult, LayerResult, VerifyResult, _Max, _output_tensor

#: The comparison with ``sdpa`` passes when max |difference| / max |output| is at most this (a fused
#: kernel rounds differently; the outputs are logits or hidden states).
SDPA_RTOL = 1e-5


def eager_function(module) -> Callable | None:
    """The eager attention function of a module's modeling file (``eager_attention_forward``), or None."""
    return getattr(inspect.getmodule(type(module)), "eager_attention_forward", None)


def _run(lm: LoadedModel, case: Case, implementation: str, on_call=None) -> list[tuple[str, torch.Tensor]]:
    """Run every pass of a case under ``implementation``; returns each pass's output (name, tensor on
    the CPU) and hands each attention call to ``on_call(pass_index, site, call)`` (probe's function only)."""
    model, outputs, state = lm.model, [], {"pass": 0}
    cache = None
    if case.use_cache:
        from transformers import DynamicCache, EncoderDecoderCache  # deferred: transformers takes ~1.5 s to import

        cache = (EncoderDecoderCache(DynamicCache(), DynamicCache()) if lm.kind == "encoder-decoder"
                 else DynamicCache(config=model.config))
    model.set_attn_implementation(implementation)
    with Hooks() as hooks:
        if on_call is not None:
            site_listeners(hooks, model, lm.spec, lambda site, call: on_call(state["pass"], site, call))
        device = input_device(model)
        for index, p in enumerate(case.passes):
            state["pass"] = index
            kwargs = {k: v.to(device) for k, v in p.inputs.items()}
            if lm.kind != "encoder":
                kwargs["use_cache"] = case.use_cache
                if cache is not None:
                    kwargs["cache"] = cache
            if cache is not None and lm.kind == "encoder-decoder":
                kwargs = _encoder_first(model, kwargs)
            name, out = _output_tensor(model(**kwargs))
            outputs.append((name, out.cpu()))
    return outputs


def _encoder_first(model, kwargs: dict) -> dict:
    """An encoder-decoder pass with the key/value cache as generation runs it: the encoder on its own,
    its output handed to the model (Switch Transformers passes ``use_cache`` on to its encoder, which
    refuses it)."""
    encoder = model.get_encoder()
    source = {k: kwargs.pop(k) for k in ("input_ids", "attention_mask") if k in kwargs}
    return {**kwargs, "attention_mask": source.get("attention_mask"), "encoder_outputs": encoder(**source)}


def _eager_call(call: Call) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The module's own eager function on the inputs of ``call``: (output, probs), or None."""
    fn = eager_function(call.module)
    if fn is None:
        return None
    mask = None
    if call.keep is not None:  # the additive form, with a float mask's own finite values (Doge's)
        mask = torch.zeros(call.keep.shape, dtype=call.query.dtype, device=call.query.device)
        if call.mask_bias is not None:
            mask = mask + call.mask_bias.to(mask.dtype)
        mask = mask.masked_fill(~call.keep, torch.finfo(call.query.dtype).min)
    kwargs = {k: v for k, v in call.kwargs.items() if k != "scaling"}
    out, probs = fn(call.module, call.query, call.key, call.value, mask, scaling=call.kwargs.get("scaling"),
                    dropout=0.0, **kwargs)
    return out, probs


#: What the per-call comparison does where a sink's eager function returns another normalization.
SINK_NOTE = ("the eager function returns its probabilities over the keys alone and scales its output by the "
             "sink's share: probabilities compared as shares of the keys (each row divided by its sum), the "
             "sink's share through the outputs")


def key_shares(call: Call, ours: torch.Tensor, theirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The two calls' probabilities [batch, heads, query, key] in one normalization.

    A call with a sink logit per head (``s_aux`` / ``sinks``) has probabilities that sum to 1 minus
    the sink's share over the keys (probe's, and gpt-oss's eager function's). Some eager functions
    (Granite-SWA's) return instead the softmax over the keys alone and multiply their output by
    sigmoid(logsumexp(scores) - sink), the same attention written another way (Xiao et al. 2023's
    sink as an extra softmax logit). Where the row sums differ, each side is divided by its row sums,
    so the probabilities are compared as shares of the keys, and the sink's share is checked where it
    acts, in the outputs. Elsewhere both are returned unchanged.

    Returns:
        ``(ours, theirs, renormalized)``.
    """
    if call.kwargs.get("s_aux", call.kwargs.get("sinks")) is None:
        return ours, theirs, False
    mine, their = ours.sum(-1, keepdim=True), theirs.sum(-1, keepdim=True)
    if torch.allclose(mine, their, rtol=0.0, atol=1e-6):
        return ours, theirs, False
    tiny = torch.finfo(ours.dtype).tiny  # a fully masked (padding) row sums to 0 on both sides
    return ours / mine.clamp_min(tiny), theirs / their.clamp_min(tiny), True


def _compare_call(p, site, call: Call, eager, tol, attn: _Max, hidden: _Max, layer: tuple[_Max, _Max],
                  notes: list[str]) -> bool:
    """Probabilities and outputs of one call against the eager function's (real rows and keys)."""
    out, probs = eager
    ours, probs, renormalized = key_shares(call, call.probs, probs)
    if renormalized and SINK_NOTE not in notes:
        notes.append(SINK_NOTE)
    rows, keys = p.rows(site.stack).to(call.probs.device), p.keys(site).to(call.probs.device)
    rows, keys = rows[:, -call.probs.shape[2]:], keys[:, -call.probs.shape[3]:]
    sel = (rows[:, None, :, None] & keys[:, None, None, :]).expand_as(call.probs)
    a, b = ours[sel], probs[sel]
    o_sel = rows[:, :, None, None].expand_as(call.output)
    ok = attn.add(a, b, *tol) & layer[0].add(a, b, *tol)
    return ok & hidden.add(call.output[o_sel], out[o_sel], *tol) & layer[1].add(call.output[o_sel], out[o_sel], *tol)


@torch.no_grad()
def _verify_case(lm: LoadedModel, case: Case, tol: tuple[float, float], layers: dict,
                 notes: list[str]) -> tuple[list[CaseResult], str]:
    start = time.perf_counter()
    attn, hidden, ok = _Max(), _Max(), [True]

    def on_call(i, site, call):
        eager = _eager_call(call)
        if eager is None:
            note = f"{type(call.module).__name__} has no eager function to compare each call with"
            if note not in notes:
                notes.append(note)
            return
        ok[0] &= _compare_call(case.passes[i], site, call, eager, tol, attn, hidden, layers[(site.stack, site.layer)],
                               notes)

    ours = _run(lm, case, NAME, on_call)
    results = []
    for impl in ("eager", "sdpa"):
        refused = f"{type(lm.model).__name__} refuses {impl} attention: its outputs are compared with eager only"
        if refused in notes:
            continue
        try:
            theirs = _run(lm, case, impl)
        except (ValueError, ImportError):
            notes.append(refused)
            continue
        out, mine = _Max(), impl == "eager"
        passed = all([out.add(o[p.query_keep], t[p.query_keep], *tol)
                      for (_, o), (_, t), p in zip(ours, theirs, case.passes)])
        # sdpa fuses the operations, and an eager function that writes a sink another way (SINK_NOTE) orders
        # them differently: their outputs also pass within SDPA_RTOL of the largest output
        relative = not mine or SINK_NOTE in notes
        passed = (passed or (relative and out.rel <= max(tol[1], SDPA_RTOL))) and (ok[0] or not mine)
        shape = list(case.passes[0].inputs["input_ids"].shape)
        name = case.name if mine else f"{case.name} (sdpa)"
        what = case.description + ("; each call vs the eager function, outputs vs eager" if mine
                                   else "; outputs vs sdpa attention")
        results.append(CaseResult(name, what, shape, attn.diff if mine else 0.0, hidden.diff if mine else 0.0,
                                  out.diff, out.rel, max(attn.diff, hidden.diff, out.diff) if mine else out.diff,
                                  bool(passed), time.perf_counter() - start))
    return results, ours[0][0] if ours else "output"


def verify_generic(lm: LoadedModel, atol: float, rtol: float, cases: list[str] | str | None = None,
                   progress=None) -> VerifyResult:
    """:func:`probe.verify` for a discovered spec (see the module docstring).

    Returns:
        :class:`~probe.verification.compare.VerifyResult`: per layer, ``attn_*`` the probabilities
        [batch, heads, query, key] of each call against the eager function's and ``hidden_*`` the
        call's attention output [batch, query, heads, d_head] against the eager function's; one case
        per battery input (outputs against eager) and one more per input against ``sdpa``.

    Raises:
        ProbeError: an unknown case name.
    """
    selected = select_cases([c for c in battery(lm) if not c.invariance], cases)
    keys = list(dict.fromkeys((s.stack, s.layer) for s in lm.sites))
    layers = {k: (_Max(), _Max()) for k in keys}
    notes = list(lm.notes) + ["no hand-written spec: probe's attention function checked against the model's own "
                              "eager function call by call, and the whole model against eager and sdpa attention"]
    results, output_name = [], "output"
    with measuring(lm.model, eager=False) as state:
        for index, case in enumerate(selected):
            if progress is not None:
                progress(index, len(selected), case.name, None)
            got, output_name = _verify_case(lm, case, (atol, rtol), layers, notes)
            results += got
            if progress is not None and got:
                progress(index, len(selected), case.name, got[0])
    notes.extend(n for n in state.notes if n not in notes)
    per_layer = [LayerResult(layer, a.diff, a.rel, h.diff, h.rel, a.ok and h.ok, stack)
                 for (stack, layer), (a, h) in layers.items()]
    out = max(results, key=lambda c: c.output_max_abs, default=None)
    passed = bool(results) and all(c.passed for c in results) and all(r.passed for r in per_layer)
    dtype = str(next(lm.model.parameters()).dtype).replace("torch.", "")
    return VerifyResult(lm.name, passed, max([c.max_abs_diff for c in results], default=0.0), per_layer, results,
                        output_name, out.output_max_abs if out else 0.0, out.output_max_rel if out else 0.0,
                        atol, rtol, None, dtype, notes)
