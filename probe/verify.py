"""``probe verify``: check that the from-scratch attention reproduces the original model.

The model is run twice on a battery of inputs, once as loaded (eager attention) and once with every
layer's attention module swapped for :class:`probe.reference.ReferenceAttention`, and the two runs
are compared layer by layer: attention probabilities (every head, real query rows and real keys
only), each layer's hidden states (real positions only) and the final outputs (logits if the model
has an LM head, else ``last_hidden_state``). Nothing is preprocessed on either side (F17).

Battery (shared/CASES.md):

* ``sentence`` - one sentence;
* ``right-padded`` - a batch of three sentences of unequal length, padded on the right;
* ``left-padded`` - (decoders) the same batch padded on the left;
* ``kv-cache`` - (decoders) a 6-token prefix, then 3 single-token steps with the key/value cache (F09);
* ``max-length`` - one sequence of min(model limit, 1024) tokens;
* ``sentence-pair`` - (encoders) two segments with token type ids.

Tolerance: a comparison passes when every ``|swapped - original| <= atol + rtol * |original|``.
Default float32: atol 1e-5, rtol 0 (:data:`FP32_ATOL`). For bfloat16 use atol 1e-2
(:data:`BF16_ATOL`; one bf16 ulp at 1.0 is 7.8e-3, so a probability that rounds the other way
differs by that much), adding rtol 1e-2 if hidden states of large magnitude are compared after a
change of operation order; float16: atol 1e-3. Measured: the reference performs the same
floating-point operations in the same order as the eager path, so the differences on the
embedded models (minilm, smollm2) are exactly 0, in float32 and in bfloat16.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field

import click
import torch

from .architectures import layer_modules
from .capture import attention_hooks, ensure_eager
from .errors import ProbeError
from .hooks import Hooks
from .models import DEFAULT_MODEL, LoadedModel
from .reference import MUTANTS, mutant_applies, swap_attention

__all__ = ["VerifyResult", "LayerResult", "CaseResult", "verify", "verify_command", "BF16_ATOL", "FP32_ATOL"]

#: Default absolute tolerance for float32 (probabilities and hidden states).
FP32_ATOL = 1e-5
#: Suggested absolute tolerance for bfloat16 runs (see the module docstring).
BF16_ATOL = 1e-2

#: Longest sequence of the ``max-length`` case, in tokens.
MAX_CASE_TOKENS = 1024

SENTENCE = "The quick brown fox jumps over the lazy dog because it wanted to see the river."
BATCH = [
    "The cat sat on the mat.",
    "A much longer sentence, which has quite a few more tokens than the first one does, follows here.",
    "Short one here.",
]
PAIR = ("Where did the cat sit this morning?", "The cat sat on the mat near the door.")
CACHE_TEXTS = [
    "Once upon a time there was a little robot who loved to read books about the sea.",
    "In the middle of the night the old clock in the hall struck twelve times and stopped.",
]
LONG_TEXT = (
    "Attention lets every token look at every other token of the sequence and take a weighted average "
    "of their values, the weights coming from a softmax over scaled dot products of queries and keys. "
    "Some heads look at the previous token, some at the first token, some at punctuation, and some "
    "spread their attention broadly over the whole sentence. "
)


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
        ref = float(b.abs().max())
        self.diff, self.ref = max(self.diff, diff), max(self.ref, ref)
        if rtol == 0:
            within = diff <= atol
        else:
            within = bool((d <= atol + rtol * b.abs()).all())
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
        layer: layer index.
        attn_max_abs: max |swapped - original| of attention probabilities (real rows and keys).
        attn_max_rel: attn_max_abs / max |original probability|.
        hidden_max_abs: max |difference| of the layer's output hidden states (real positions).
        hidden_max_rel: hidden_max_abs / max |original hidden state|.
        passed: every compared value within tolerance.
    """

    layer: int
    attn_max_abs: float
    attn_max_rel: float
    hidden_max_abs: float
    hidden_max_rel: float
    passed: bool


@dataclass
class CaseResult:
    """One input of the battery.

    Attributes:
        name: case name (``sentence``, ``right-padded`` ...).
        description: what the input is.
        shape: [batch, tokens] of the (first) forward pass.
        attn_max_abs / hidden_max_abs / output_max_abs: max absolute differences.
        output_max_rel: output_max_abs / max |original output|.
        max_abs_diff: the largest of the three.
        passed: every compared value within tolerance.
        seconds: wall time of both runs (seconds).
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
        """A JSON-serialisable dict: ``{"model", "passed", "max_abs_diff", "per_layer": [...], "cases": [...], ...}``."""
        out = {"model": self.model, "passed": self.passed, "max_abs_diff": _finite(self.max_abs_diff),
               "per_layer": [{k: _finite(v) for k, v in asdict(r).items()} for r in self.per_layer],
               "cases": [{k: _finite(v) for k, v in asdict(c).items()} for c in self.cases],
               "output": {"name": self.output_name, "max_abs": _finite(self.output_max_abs),
                          "max_rel": _finite(self.output_max_rel)},
               "atol": self.atol, "rtol": self.rtol, "mutant": self.mutant, "dtype": self.dtype,
               "notes": list(self.notes)}
        return out


def _finite(x):
    """JSON has no infinity: inf -> the string "inf"."""
    return "inf" if isinstance(x, float) and math.isinf(x) else x


# ---------------------------------------------------------------------------------------------
# The battery
# ---------------------------------------------------------------------------------------------

@dataclass
class _Pass:
    """One forward pass: model inputs, and which query rows / keys are real tokens."""

    inputs: dict
    query_keep: torch.Tensor  # [batch, T] bool
    key_keep: torch.Tensor  # [batch, past + T] bool


@dataclass
class _Case:
    name: str
    description: str
    passes: list[_Pass]
    use_cache: bool = False


def _tokenize(lm: LoadedModel, texts, side: str = "right", **kw) -> dict:
    tok = lm.tokenizer
    old = tok.padding_side
    tok.padding_side = side
    try:
        enc = tok(texts, return_tensors="pt", padding=True, **kw)
    finally:
        tok.padding_side = old
    vocab = lm.model.config.vocab_size
    if int(enc["input_ids"].max()) >= vocab:
        raise ProbeError(f"the tokenizer yields ids up to {int(enc['input_ids'].max())} but the model's vocabulary "
                         f"has {vocab} entries")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def _single_pass(inputs: dict) -> _Pass:
    keep = inputs["attention_mask"].bool()
    return _Pass(inputs, keep, keep)


def _battery(lm: LoadedModel) -> list[_Case]:
    cases = [
        _Case("sentence", "one sentence", [_single_pass(_tokenize(lm, [SENTENCE]))]),
        _Case("right-padded", "3 sentences of unequal length, right padding", [_single_pass(_tokenize(lm, BATCH))]),
    ]
    if lm.causal:
        cases.append(_Case("left-padded", "3 sentences of unequal length, left padding",
                           [_single_pass(_tokenize(lm, BATCH, side="left"))]))
        enc = _tokenize(lm, CACHE_TEXTS, truncation=True, max_length=9)
        ids = enc["input_ids"]
        if ids.shape[1] < 9 or not bool(enc["attention_mask"].all()):
            raise ProbeError("the kv-cache case needs two texts of at least 9 tokens")
        passes = []
        for end in (6, 7, 8, 9):  # a 6-token prefix, then 3 one-token steps
            start = 0 if end == 6 else end - 1
            mask = torch.ones(ids.shape[0], end, dtype=torch.long)  # covers cached + new tokens
            passes.append(_Pass({"input_ids": ids[:, start:end], "attention_mask": mask},
                                torch.ones(ids.shape[0], end - start, dtype=torch.bool), mask.bool()))
        cases.append(_Case("kv-cache", "6-token prefix, then 3 single-token steps with the key/value cache",
                           passes, use_cache=True))
    else:
        cases.append(_Case("sentence-pair", "two segments with token type ids",
                           [_single_pass(_tokenize(lm, [PAIR[0]], text_pair=[PAIR[1]]))]))
    n = min(lm.max_length, MAX_CASE_TOKENS)
    text = LONG_TEXT * (4 * n // 40 + 1)
    cases.append(_Case("max-length", f"one sequence of {n} tokens (min(model limit, {MAX_CASE_TOKENS}))",
                       [_single_pass(_tokenize(lm, [text], truncation=True, max_length=n))]))
    return cases


# ---------------------------------------------------------------------------------------------
# Running and comparing
# ---------------------------------------------------------------------------------------------

def _output_tensor(output) -> tuple[str, torch.Tensor]:
    logits = getattr(output, "logits", None)
    if logits is not None:
        return "logits", logits
    return "last_hidden_state", output.last_hidden_state


def _run_case(lm: LoadedModel, case: _Case, on_attn, on_hidden, on_output) -> None:
    """Run every pass of a case; callbacks get (pass index, layer, tensor) / (pass index, name, tensor)."""
    model = lm.model
    cache = None
    if case.use_cache:
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
    state = {"pass": 0}

    def hidden_hook(layer):
        def hook(module, args, output):
            on_hidden(state["pass"], layer, output[0] if isinstance(output, tuple) else output)
        return hook

    with attention_hooks(lm, lambda layer, probs: on_attn(state["pass"], layer, probs)), Hooks() as hooks:
        for i, layer in enumerate(layer_modules(model, lm.spec)):
            hooks.forward(layer, hidden_hook(i))
        for index, p in enumerate(case.passes):
            state["pass"] = index
            kwargs = dict(p.inputs)
            if lm.causal:
                kwargs["use_cache"] = case.use_cache
                if cache is not None:
                    kwargs["cache"] = cache
            output = model(**kwargs)
            on_output(index, *_output_tensor(output))


@torch.no_grad()
def _verify_case(lm: LoadedModel, case: _Case, mutant, atol, rtol, layer_attn, layer_hidden,
                 notes: list[str]) -> tuple[CaseResult, str, _Max]:
    start = time.perf_counter()
    ref_attn: dict = {}
    ref_hidden: dict = {}
    ref_out: dict = {}
    _run_case(lm, case,
              lambda i, layer, probs: ref_attn.__setitem__((i, layer), probs),
              lambda i, layer, h: ref_hidden.__setitem__((i, layer), h),
              lambda i, name, out: ref_out.__setitem__(i, out))

    attn, hidden, out = _Max(), _Max(), _Max()
    ok = [True]

    def cmp_attn(i, layer, probs):
        p = case.passes[i]
        ref = ref_attn.pop((i, layer))
        if probs.shape != ref.shape:
            raise ProbeError(f"{case.name}: layer {layer} probabilities have shape {tuple(probs.shape)}, "
                             f"the original's {tuple(ref.shape)}")
        if bool(p.query_keep.all()) and bool(p.key_keep.all()):
            a, b = probs, ref  # no padding: compare everything without copying
        else:
            sel = p.query_keep[:, None, :, None] & p.key_keep[:, None, None, :]  # (B, 1, Tq, Tk)
            sel = sel.expand_as(probs)
            a, b = probs[sel], ref[sel]
        ok[0] &= attn.add(a, b, atol, rtol) & layer_attn[layer].add(a, b, atol, rtol)

    def cmp_hidden(i, layer, h):
        keep = case.passes[i].query_keep
        a, b = h[keep], ref_hidden.pop((i, layer))[keep]
        ok[0] &= hidden.add(a, b, atol, rtol) & layer_hidden[layer].add(a, b, atol, rtol)

    name_holder = {}

    def cmp_out(i, name, o):
        name_holder["name"] = name
        keep = case.passes[i].query_keep
        ok[0] &= out.add(o[keep], ref_out.pop(i)[keep], atol, rtol)

    with swap_attention(lm, mutant) as swapped:
        notes.extend(n for n in swapped.notes if n not in notes)
        _run_case(lm, case, cmp_attn, cmp_hidden, cmp_out)
    shape = list(case.passes[0].inputs["input_ids"].shape)
    result = CaseResult(case.name, case.description, shape, attn.diff, hidden.diff, out.diff, out.rel,
                        max(attn.diff, hidden.diff, out.diff), bool(ok[0]), time.perf_counter() - start)
    return result, name_holder.get("name", "output"), out


def verify(lm: LoadedModel, atol: float = FP32_ATOL, mutant: str | None = None, *, rtol: float = 0.0,
           cases: list[str] | None = None) -> VerifyResult:
    """Run the original and the from-scratch attention on a battery of inputs and compare them.

    Args:
        lm: a loaded model (see :func:`probe.load_model` / :func:`probe.from_pretrained_objects`).
            It is switched to eager attention (noted) so the original returns probabilities.
        atol: absolute tolerance (probabilities are in [0, 1]; hidden states and logits in the
            model's units). Default 1e-5 for float32; use :data:`BF16_ATOL` (1e-2) for bfloat16.
        mutant: None, or a name from :data:`probe.reference.MUTANTS` to verify a deliberately
            broken variant (expected to FAIL; a note says when it cannot change anything).
        rtol: relative tolerance: a value passes when ``|swapped - original| <= atol + rtol * |original|``.
        cases: run only these case names (default: the whole battery).

    Returns:
        :class:`VerifyResult` with per-layer differences of attention probabilities [batch, heads,
        query, key] (real rows and keys only) and hidden states (real positions only), per-case
        results, the final outputs' difference and the pass/fail verdict.

    Raises:
        ProbeError: unknown mutant or case name; a tokenizer that does not fit the model.
    """
    if mutant is not None and mutant not in MUTANTS:
        raise ProbeError(f"unknown mutant {mutant!r}; choose from {', '.join(MUTANTS)}")
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ProbeError(f"{name} must be a finite number >= 0, got {value!r}")
    notes = list(lm.notes)
    impl = getattr(lm.model.config, "_attn_implementation", "eager")
    note = ensure_eager(lm.model)
    if note:
        notes.append(note + " for the original run (restored afterwards)")
    if mutant is not None:
        applies, why = mutant_applies(mutant, lm)
        if not applies:
            notes.append(f"mutant {mutant!r} cannot change this model: {why}")
    was_training = lm.model.training
    lm.model.eval()
    try:
        battery = _battery(lm)
        if isinstance(cases, str):
            cases = [cases]
        if cases is not None and len(cases) == 0:
            raise ProbeError("no verification case selected (cases=[]): nothing would be compared")
        if cases is not None:
            unknown = set(cases) - {c.name for c in battery}
            if unknown:
                raise ProbeError(f"unknown case(s) {', '.join(sorted(unknown))}; "
                                 f"choose from {', '.join(c.name for c in battery)}")
            battery = [c for c in battery if c.name in cases]
        n_layers = lm.geometry.n_layers
        layer_attn = [_Max() for _ in range(n_layers)]
        layer_hidden = [_Max() for _ in range(n_layers)]
        results = []
        swap_notes: list[str] = []
        output_name, out_total = "output", _Max()
        for case in battery:
            res, output_name, out = _verify_case(lm, case, mutant, atol, rtol, layer_attn, layer_hidden, swap_notes)
            results.append(res)
            out_total.diff = max(out_total.diff, out.diff)
            out_total.ref = max(out_total.ref, out.ref)
    finally:
        lm.model.train(was_training)
        if note:
            lm.model.set_attn_implementation(impl)
    notes.extend(n for n in swap_notes if n not in notes)
    per_layer = [LayerResult(i, a.diff, a.rel, h.diff, h.rel, a.ok and h.ok)
                 for i, (a, h) in enumerate(zip(layer_attn, layer_hidden))]
    passed = all(c.passed for c in results) and all(r.passed for r in per_layer)
    max_abs = max([c.max_abs_diff for c in results], default=0.0)
    dtype = str(next(lm.model.parameters()).dtype).replace("torch.", "")
    return VerifyResult(lm.name, passed, max_abs, per_layer, results, output_name, out_total.diff, out_total.rel,
                        atol, rtol, mutant, dtype, notes)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def format_table(result: VerifyResult) -> str:
    """The human-readable report: one row per layer, then the output and the cases."""
    lines = [f"probe verify: {result.model} ({result.dtype}), atol {result.atol:g}"
             + (f", rtol {result.rtol:g}" if result.rtol else "")
             + (f", mutant {result.mutant}" if result.mutant else "")]
    lines.append(f"{'layer':>5}  {'attn max abs':>12}  {'attn max rel':>12}  {'hidden max abs':>14}  "
                 f"{'hidden max rel':>14}  result")
    for r in result.per_layer:
        lines.append(f"{r.layer:>5}  {r.attn_max_abs:>12.3e}  {r.attn_max_rel:>12.3e}  {r.hidden_max_abs:>14.3e}  "
                     f"{r.hidden_max_rel:>14.3e}  {'PASS' if r.passed else 'FAIL'}")
    lines.append(f"output ({result.output_name}): max abs {result.output_max_abs:.3e}, max rel {result.output_max_rel:.3e}")
    lines.append("cases:")
    for c in result.cases:
        lines.append(f"  {c.name:<14} {str(c.shape):<11} max abs {c.max_abs_diff:.3e}  {c.seconds:6.1f} s  "
                     f"{'PASS' if c.passed else 'FAIL'}  ({c.description})")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append(f"{'PASS' if result.passed else 'FAIL'}: max abs diff {result.max_abs_diff:.3e}")
    return "\n".join(lines)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@click.command("verify")
@click.option("--model", "-m", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="Alias (probe models), Hugging Face Hub id, local folder or .gguf file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--atol", type=float, default=None,
              help=f"Absolute tolerance [default: {FP32_ATOL:g} for float32, {BF16_ATOL:g} for bfloat16/float16].")
@click.option("--rtol", type=float, default=0.0, show_default=True, help="Relative tolerance.")
@click.option("--mutant", type=click.Choice(sorted(MUTANTS)), default=None,
              help="Verify a deliberately broken attention instead (expected to FAIL).")
@click.option("--dtype", type=click.Choice(sorted(_DTYPES)), default="float32", show_default=True,
              help="Parameter dtype to load the model in.")
def verify_command(model_name: str, as_json: bool, atol: float | None, rtol: float, mutant: str | None,
                   dtype: str) -> None:
    """Check that probe's from-scratch attention reproduces the model (exit code 1 on FAIL)."""
    from .models import load_model

    if atol is None:
        atol = FP32_ATOL if dtype == "float32" else BF16_ATOL
    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if not (math.isfinite(value) and value >= 0):
            raise click.ClickException(f"{name} must be a finite number >= 0, got {value!r}")
    try:
        lm = load_model(model_name, dtype=_DTYPES[dtype])
        if mutant is not None:
            applies, why = mutant_applies(mutant, lm)
            if not applies:
                raise ProbeError(f"mutant {mutant!r} cannot change {model_name}: {why}")
        result = verify(lm, atol=atol, mutant=mutant, rtol=rtol)
    except ProbeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else format_table(result))
    if not result.passed:
        click.get_current_context().exit(1)
