"""``verify``: check that the from-scratch attention reproduces the original model (the comparison).

The model is run twice on a battery of inputs, once as loaded (eager attention) and once with every
layer's attention module swapped for :class:`probe.capture.reference.ReferenceAttention`, and the two runs
are compared layer by layer: attention probabilities (every head, real query rows and real keys
only), each layer's hidden states (real positions only) and the final outputs (logits if the model
has an LM head, else ``last_hidden_state``). Nothing is preprocessed on either side (no folding of norms, no centring).

Battery (each case a failure hand-written attention is known for):

* ``sentence`` - one sentence;
* ``right-padded`` - a batch of three sentences of unequal length, padded on the right;
* ``left-padded`` - (decoders) the same batch padded on the left, position ids from the mask;
* ``padding-invariance`` - one prompt alone and padded by 1, 3 and 8 tokens (on the left for
  decoders, position ids from the mask; on the right for encoders): besides original vs swapped,
  the real tokens' attention and hidden states of each padded row are compared with the prompt
  run alone (position ids from the mask), against a bound set by the float batching noise measured on the same prompt
  twice in a batch and, for decoders, right-padded to the same lengths (causality leaves its
  real tokens unchanged, so what differs there is rounding that depends on the length);
* ``kv-cache`` - (decoders) a 6-token prefix, then 3 single-token steps with the key/value cache;
* ``max-length`` - one sequence of min(model limit, 1024) tokens;
* ``sentence-pair`` - (encoders) two segments with token type ids.

Tolerance: a comparison passes when every ``|swapped - original| <= atol + rtol * |original|``.
Default float32: atol 1e-5, rtol 1e-5 (:data:`FP32_ATOL`, :data:`FP32_RTOL`): the reference does
the eager path's operations in its order, but a CPU's matrix kernels may add a product of another
shape (a one-token key/value-cache step) in another order, and a hidden state of magnitude 50 then
moves by a few float32 ulps (4e-5 measured on a tiny Qwen2 on an AMD EPYC CPU, 0 on an Intel one).
For bfloat16 use atol 1e-2
(:data:`BF16_ATOL`; one bf16 ulp at 1.0 is 7.8e-3, so a probability that rounds the other way
differs by that much), adding rtol 1e-2 if hidden states of large magnitude are compared after a
change of operation order; float16: atol 1e-3. Measured: the reference performs the same
floating-point operations in the same order as the eager path, so the differences on the
embedded models (minilm, smollm2) are exactly 0, in float32 and in bfloat16.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .. import validate
from ..architectures import stack_layers
from ..capture.hooks import input_device, measuring
from ..capture.maps import add_attention_hooks
from ..capture.reference import mutant_applies
from ..capture.reference.mutants import check_mutant
from ..capture.reference.swap import swap_attention
from ..core import LoadedModel
from ..errors import ProbeError
from .battery import Case, battery, select_cases

__all__ = ["VerifyResult", "LayerResult", "CaseResult", "verify", "BF16_ATOL", "FP32_ATOL", "FP32_RTOL",
           "NOISE_FACTOR"]

#: Default absolute tolerance for float32 (probabilities and hidden states).
FP32_ATOL = 1e-5
#: Default relative tolerance (float32 rounding of large hidden states; see the module docstring).
FP32_RTOL = 1e-5
#: Suggested absolute tolerance for bfloat16 runs (see the module docstring).
BF16_ATOL = 1e-2
#: Padding invariance passes when the padded rows differ from the prompt alone by at most
#: max(atol, this many times the batching noise; see :class:`CaseResult`).
NOISE_FACTOR = 4.0

@dataclass
class _Max:
    """Running max of |a - b| and of |b| (for the relative difference)."""

    diff: float = 0.0
    ref: float = 0.0
    ok: bool = True

    def add(self, a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
        """Fold in one comparison (a: swapped, b: original, same shape); True if within tolerance."""
        if a.numel() == 0:
            return True
        if a.dtype != torch.float64:  # float32 subtraction of close values is exact (Sterbenz)
            a, b = a.float(), b.float()
        d = (a - b).abs()
        diff = float(d.max())
        if not math.isfinite(diff) or not bool(torch.isfinite(a).all()):
            self.diff, self.ok = math.inf, False
            return False
        self.diff, self.ref = max(self.diff, diff), max(self.ref, float(b.abs().max()))
        within = diff <= atol if rtol == 0 else bool((d <= atol + rtol * b.abs()).all())
        self.ok &= within
        return within

    @property
    def rel(self) -> float:
        """max |a - b| / max |b| (0 when both are 0)."""
        if self.diff == 0:
            return 0.0
        return self.diff / self.ref if self.ref > 0 else math.inf


@dataclass
class LayerResult:
    """Differences of one layer, maxed over every case.

    Attributes:
        layer: layer index (within its stack).
        attn_max_abs: max |swapped - original| of attention probabilities (real rows and keys; the
            self- and cross-attention of a decoder layer of an encoder-decoder model together).
        attn_max_rel: attn_max_abs / max |original probability|.
        hidden_max_abs: max |difference| of the layer's output hidden states (real positions).
        hidden_max_rel: hidden_max_abs / max |original hidden state|.
        passed: every compared value within tolerance.
        stack: ``"encoder"`` or ``"decoder"``.
    """

    layer: int
    attn_max_abs: float
    attn_max_rel: float
    hidden_max_abs: float
    hidden_max_rel: float
    passed: bool
    stack: str = ""


@dataclass
class CaseResult:
    """One input of the battery.

    Attributes:
        name: case name (``sentence``, ``right-padded`` ...).
        description: what the input is.
        shape: [batch, tokens] of the (first) forward pass.
        attn_max_abs / hidden_max_abs / output_max_abs: max absolute differences, swapped vs original.
        output_max_rel: output_max_abs / max |original output|.
        max_abs_diff: the largest of the three.
        passed: every compared value within tolerance.
        seconds: wall time of both runs (seconds).
        padding_max_abs: (``padding-invariance``) max |padded row - prompt alone| over real tokens'
            attention probabilities and hidden states, both models; None for other cases.
        batching_noise: (``padding-invariance``) the float noise of batching itself: max |row -
            prompt alone| over the prompt twice in a batch and, for decoders, the prompt
            right-padded (same shapes as the padded runs; causality leaves the real tokens'
            values unchanged, so any difference is length-dependent rounding).
    """

    name: str
    description: str
    shape: list[int]
    attn_max_abs: float
    hidden_max_abs: float
    output_max_abs: float
    output_max_rel: float
    max_abs_diff: float
    passed: bool
    seconds: float
    padding_max_abs: float | None = None
    batching_noise: float | None = None


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`.

    Attributes:
        model: model name. output_name: ``logits`` or ``last_hidden_state``.
        passed: every case and layer within tolerance. max_abs_diff: largest absolute difference seen.
        per_layer: one :class:`LayerResult` per layer. cases: one :class:`CaseResult` per input.
        output_max_abs / output_max_rel: final outputs, maxed over cases.
        atol, rtol: tolerance used. mutant: the broken variant verified, or None.
        notes: what verification changed or could not do (attention implementation switched, ...).
    """

    model: str
    passed: bool
    max_abs_diff: float
    per_layer: list[LayerResult]
    cases: list[CaseResult]
    output_name: str
    output_max_abs: float
    output_max_rel: float
    atol: float
    rtol: float
    mutant: str | None = None
    dtype: str = "float32"
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """A JSON-serialisable dict: ``{"model", "passed", "max_abs_diff", "per_layer", "cases", ...}``."""
        return {"model": self.model, "passed": self.passed, "max_abs_diff": _finite(self.max_abs_diff),
                "per_layer": [{k: _finite(v) for k, v in asdict(r).items()} for r in self.per_layer],
                "cases": [{k: _finite(v) for k, v in asdict(c).items()} for c in self.cases],
                "output": {"name": self.output_name, "max_abs": _finite(self.output_max_abs),
                           "max_rel": _finite(self.output_max_rel)},
                "atol": self.atol, "rtol": self.rtol, "mutant": self.mutant, "dtype": self.dtype,
                "notes": list(self.notes)}


def _finite(x):
    """JSON has no infinity: inf -> the string "inf"."""
    return "inf" if isinstance(x, float) and math.isinf(x) else x


# ---------------------------------------------------------------------------------------------
# Running and comparing
# ---------------------------------------------------------------------------------------------

def _output_tensor(output) -> tuple[str, torch.Tensor]:
    logits = getattr(output, "logits", None)
    if logits is not None:
        return "logits", logits
    return "last_hidden_state", output.last_hidden_state


def _run_case(lm: LoadedModel, case: Case, hooks, on_attn, on_hidden, on_output) -> None:
    """Run every pass of a case; callbacks get (pass index, site, probs) / (pass index, (stack,
    layer), hidden states) / (pass index, output name, tensor)."""
    model = lm.model
    cache = None
    if case.use_cache:
        from transformers import DynamicCache, EncoderDecoderCache  # deferred: transformers takes ~1.5 s to import

        if lm.kind == "encoder-decoder":  # layers added as they come (a decoder may be deeper than the encoder)
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        else:
            cache = DynamicCache(config=model.config)
    state = {"pass": 0}

    def hidden_hook(key):
        def hook(module, args, output):
            on_hidden(state["pass"], key, (output[0] if isinstance(output, tuple) else output).cpu())
        return hook

    add_attention_hooks(hooks, lm, lambda site, probs: on_attn(state["pass"], site, probs.cpu()))
    device = input_device(model)
    for stack, layers in stack_layers(model, lm.spec).items():
        for i, layer in enumerate(layers):
            hooks.forward(layer, hidden_hook((stack, i)))
    try:
        for index, p in enumerate(case.passes):
            state["pass"] = index
            kwargs = {k: v.to(device) for k, v in p.inputs.items()}
            if lm.kind != "encoder":  # a causal stack: its key/value cache on or off as the case says
                kwargs["use_cache"] = case.use_cache
                if cache is not None:
                    kwargs["cache"] = cache
            name, output = _output_tensor(model(**kwargs))
            on_output(index, name, output.cpu())
    finally:
        hooks.remove()


def _record(case: Case, hooks, lm, on_attn=None, on_hidden=None, keep: bool = True) -> tuple[dict, dict, dict]:
    """Run a case; keep every probability, hidden state and output (``keep``), after handing each
    to ``on_attn(i, layer, probs)`` / ``on_hidden(i, layer, h)`` where given."""
    probs_by, hidden, out = {}, {}, {}

    def got_attn(i, site, probs):
        if on_attn is not None:
            on_attn(i, site, probs)
        if keep:
            probs_by[(i, site)] = probs

    def got_hidden(i, layer, h):
        if on_hidden is not None:
            on_hidden(i, layer, h)
        if keep:
            hidden[(i, layer)] = h

    _run_case(lm, case, hooks, got_attn, got_hidden, lambda i, name, o: out.__setitem__(i, (name, o)))
    return probs_by, hidden, out


def _invariance(case: Case, probs: dict, hidden: dict) -> tuple[float, float]:
    """(max |padded row - alone|, max |noise row - alone|) over the real tokens' attention
    probabilities and hidden states of every layer (single-stack models)."""
    n = int(case.passes[0].query_keep[0].sum())
    sites = sorted({site for (_, site) in probs}, key=lambda s: s.layer)
    layers = sorted({key for (_, key) in hidden})
    worst = {"noise": 0.0, "padded": 0.0}
    for i, role in enumerate(case.roles):
        if role == "alone":
            continue
        for row in range(case.passes[i].query_keep.shape[0]):
            idx = case.passes[i].query_keep[row].nonzero().flatten()  # positions of the real tokens
            assert len(idx) == n
            for site in sites:
                p, p0 = probs[(i, site)][row][:, idx][:, :, idx], probs[(0, site)][0]
                worst[role] = max(worst[role], float((p.float() - p0.float()).abs().max()))
            for key in layers:
                h, h0 = hidden[(i, key)][row][idx], hidden[(0, key)][0]
                worst[role] = max(worst[role], float((h.float() - h0.float()).abs().max()))
    return worst["padded"], worst["noise"]


@torch.no_grad()
def _verify_case(lm: LoadedModel, case: Case, mutant, atol, rtol, layer_attn, layer_hidden,
                 hooks, notes: list[str]) -> tuple[CaseResult, str, _Max]:
    start = time.perf_counter()
    ref_attn, ref_hidden, ref_out = _record(case, hooks, lm)
    attn, hidden, out = _Max(), _Max(), _Max()
    ok = [True]

    def compare_attn(i, site, probs):  # on the fly, dropping the original's tensor (memory: one copy)
        p = case.passes[i]
        ref = ref_attn[(i, site)] if case.invariance else ref_attn.pop((i, site))
        if probs.shape != ref.shape:
            raise ProbeError(f"{case.name}: site {site} probabilities have shape {tuple(probs.shape)}, "
                             f"the original's {tuple(ref.shape)}")
        rows, keys = p.rows(site.stack), p.keys(site)
        if bool(rows.all()) and bool(keys.all()):
            a, b = probs, ref  # no padding: compare everything without copying
        else:
            sel = (rows[:, None, :, None] & keys[:, None, None, :]).expand_as(probs)
            a, b = probs[sel], ref[sel]
        key = (site.stack, site.layer)
        ok[0] &= attn.add(a, b, atol, rtol) & layer_attn[key].add(a, b, atol, rtol)

    def compare_hidden(i, key, h):
        keep = case.passes[i].rows(key[0])
        ref = ref_hidden[(i, key)] if case.invariance else ref_hidden.pop((i, key))
        a, b = h[keep], ref[keep]
        ok[0] &= hidden.add(a, b, atol, rtol) & layer_hidden[key].add(a, b, atol, rtol)

    with swap_attention(lm, mutant) as swapped:
        notes.extend(n for n in swapped.notes if n not in notes)
        new_attn, new_hidden, new_out = _record(case, hooks, lm, compare_attn, compare_hidden, keep=case.invariance)
    name = next(iter(new_out.values()))[0] if new_out else "output"
    for i, (_, o) in new_out.items():
        keep = case.passes[i].query_keep
        ok[0] &= out.add(o[keep], ref_out[i][1][keep], atol, rtol)
    padding = noise = None
    if case.invariance:
        padded_ref, noise_ref = _invariance(case, ref_attn, ref_hidden)
        padded_new, noise_new = _invariance(case, new_attn, new_hidden)
        padding, noise = max(padded_ref, padded_new), max(noise_ref, noise_new)
        ok[0] &= padding <= max(atol, NOISE_FACTOR * noise)
    shape = list(case.passes[0].inputs["input_ids"].shape)
    result = CaseResult(case.name, case.description, shape, attn.diff, hidden.diff, out.diff, out.rel,
                        max(attn.diff, hidden.diff, out.diff), bool(ok[0]), time.perf_counter() - start,
                        padding, noise)
    return result, name, out


def verify(lm: LoadedModel, atol: float = FP32_ATOL, mutant: str | None = None, *, rtol: float = FP32_RTOL,
           cases: list[str] | None = None,
           progress: Callable[[int, int, str, CaseResult | None], None] | None = None) -> VerifyResult:
    """Run the original and the from-scratch attention on a battery of inputs and compare them.

    Args:
        lm: a loaded model (see :func:`probe.load_model` / :func:`probe.from_pretrained_objects`).
            It is measured in eager attention and eval mode (noted) and restored afterwards.
        atol: absolute tolerance (probabilities are in [0, 1]; hidden states and logits in the
            model's units). Default 1e-5 for float32; use :data:`BF16_ATOL` (1e-2) for bfloat16.
        mutant: None, or a name from :data:`probe.capture.reference.MUTANTS` to verify a deliberately
            broken variant (expected to FAIL; a note says when it cannot change anything).
        rtol: relative tolerance: a value passes when ``|swapped - original| <= atol + rtol * |original|``
            (default :data:`FP32_RTOL`, 1e-5).
        cases: run only these case names (default: the whole battery).
        progress: called as ``progress(i, n, case_name, None)`` before case i of n and
            ``progress(i, n, case_name, result)`` after it.

    Returns:
        :class:`VerifyResult` with per-layer differences of attention probabilities [batch, heads,
        query, key] (real rows and keys only) and hidden states (real positions only), per-case
        results, the final outputs' difference and the pass/fail verdict.

    Raises:
        InputError: unknown mutant, negative or non-finite tolerance.
        ProbeError: unknown case name or no case; a tokenizer that does not fit the model.
    """
    check_mutant(mutant)
    atol, rtol = validate.tolerance("atol", atol), validate.tolerance("rtol", rtol)
    notes = list(lm.notes)
    if mutant is not None:
        applies, why = mutant_applies(mutant, lm)
        if not applies:
            notes.append(f"mutant {mutant!r} cannot change this model: {why}")
    selected = select_cases(battery(lm), cases)
    keys = list(dict.fromkeys((s.stack, s.layer) for s in lm.sites))  # (stack, layer) in forward order
    layer_attn = {k: _Max() for k in keys}
    layer_hidden = {k: _Max() for k in keys}
    results, swap_notes = [], []
    output_name, out_total = "output", _Max()
    with measuring(lm.model, implementation="eager") as state:  # the model's own attention, not probe's
        for index, case in enumerate(selected):
            if progress is not None:
                progress(index, len(selected), case.name, None)
            res, output_name, out = _verify_case(lm, case, mutant, atol, rtol, layer_attn, layer_hidden,
                                                 state.hooks, swap_notes)
            results.append(res)
            out_total.diff = max(out_total.diff, out.diff)
            out_total.ref = max(out_total.ref, out.ref)
            if progress is not None:
                progress(index, len(selected), case.name, res)
    notes.extend(n for n in state.notes + swap_notes if n not in notes)  # measuring's and the lookup check's
    per_layer = [LayerResult(layer, layer_attn[(stack, layer)].diff, layer_attn[(stack, layer)].rel,
                             layer_hidden[(stack, layer)].diff, layer_hidden[(stack, layer)].rel,
                             layer_attn[(stack, layer)].ok and layer_hidden[(stack, layer)].ok, stack)
                 for stack, layer in keys]
    passed = all(c.passed for c in results) and all(r.passed for r in per_layer)
    max_abs = max([c.max_abs_diff for c in results], default=0.0)
    dtype = str(next(lm.model.parameters()).dtype).replace("torch.", "")
    return VerifyResult(lm.name, passed, max_abs, per_layer, results, output_name, out_total.diff, out_total.rel,
                        atol, rtol, mutant, dtype, notes)
