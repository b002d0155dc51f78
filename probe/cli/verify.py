"""``probe verify``: does probe's from-scratch attention reproduce the model?"""

from __future__ import annotations

import json

import click

from .. import bounds
from ..errors import ProbeError
from .group import main, user_errors
from .options import click_callback, device_option, dtype_option, model_option

#: The names of ``probe.capture.reference.mutants.MUTANTS`` (that module imports torch: not read here so that
#: ``probe --help`` starts without it; tests/test_start_up.py checks the two agree).
MUTANT_NAMES = ("alibi-sign", "c2p-sign", "causal-inverted", "merge-without-transpose", "no-causal-mask",
                "no-padding-mask", "no-scale", "scale-d-model")
#: ``probe.verification.FP32_RTOL``, the default relative tolerance (written here for the same reason and
#: checked by the same test).
FP32_RTOL = 1e-5


def format_table(result) -> str:
    """The human-readable verification report: one row per layer, then the output and the cases."""
    lines = [f"probe verify: {result.model} ({result.dtype}), atol {result.atol:g}"
             + (f", rtol {result.rtol:g}" if result.rtol else "")
             + (f", mutant {result.mutant}" if result.mutant else ""),
             "(each value passes within atol + rtol x |original|; max rel is max |difference| / max |original|, "
             "a summary, not the rule)"]
    lines.append(f"{'layer':>5}  {'attn max abs':>12}  {'attn max rel':>12}  {'hidden max abs':>14}  "
                 f"{'hidden max rel':>14}  result")
    for r in result.per_layer:
        lines.append(f"{r.layer:>5}  {r.attn_max_abs:>12.3e}  {r.attn_max_rel:>12.3e}  {r.hidden_max_abs:>14.3e}  "
                     f"{r.hidden_max_rel:>14.3e}  {'PASS' if r.passed else 'FAIL'}")
    lines.append(f"output ({result.output_name}): max abs {result.output_max_abs:.3e}, "
                 f"max rel {result.output_max_rel:.3e}")
    lines.append("cases:")
    name_w = max([18, *(len(c.name) for c in result.cases)])  # "sentence-pair (sdpa)" is 20
    shape_w = max([11, *(len(str(c.shape)) for c in result.cases)])
    for c in result.cases:
        extra = ""
        if c.padding_max_abs is not None:
            extra = f"; padded vs alone {c.padding_max_abs:.3e} (batching noise {c.batching_noise:.3e})"
        lines.append(f"  {c.name:<{name_w}} {str(c.shape):<{shape_w}} max abs {c.max_abs_diff:.3e}  "
                     f"{c.seconds:6.1f} s  {'PASS' if c.passed else 'FAIL'}  ({c.description}{extra})")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append(f"{'PASS' if result.passed else 'FAIL'}: max abs diff {result.max_abs_diff:.3e}")
    return "\n".join(lines)


def verify_progress(index: int, total: int, name: str, result) -> None:
    """Say on stderr which verification case starts, and how it ended."""
    if result is None:
        click.echo(f"verify: case {index + 1}/{total} {name} ...", err=True)
    else:
        click.echo(f"verify: case {index + 1}/{total} {name}: {'PASS' if result.passed else 'FAIL'} "
                   f"in {result.seconds:.1f} s", err=True)


@main.command("verify")
@model_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--atol", type=float, default=None,
              callback=click_callback(lambda v: bounds.tolerance("--atol", v)),
              help="Absolute tolerance [default: 1e-05 for float32, 0.01 for bfloat16/float16].")
@click.option("--rtol", type=float, default=FP32_RTOL, show_default=True,
              callback=click_callback(lambda v: bounds.tolerance("--rtol", v)), help="Relative tolerance.")
@click.option("--mutant", type=click.Choice(MUTANT_NAMES),
              default=None, help="Verify a deliberately broken attention instead (expected to FAIL).")
@dtype_option
@device_option
@click.option("--quick", is_flag=True,
              help="Check one sentence only (the 'sentence' case): seconds instead of the whole battery's minutes "
                   "on a large model (padding, key/value cache and the long sequence are left out).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Say which case runs (on stderr).")
@user_errors
def verify_command(model_name: str, as_json: bool, atol: float | None, rtol: float, mutant: str | None,
                   dtype: str | None, device: str | None, quick: bool, progress: bool) -> None:
    """Check that probe's from-scratch attention reproduces the model (exit status 1 on FAIL).

    The whole battery runs by default: on SmolLM2 (135M) it takes minutes on two CPU cores, most of it
    in the padding, 1,024-token and key/value-cache cases; --quick checks one sentence."""
    import torch

    from ..capture.reference import mutant_applies
    from ..loading.models import load_model
    from ..verification import BF16_ATOL, FP32_ATOL, verify

    lm = load_model(model_name, dtype=dtype, device=device)
    if atol is None:
        atol = FP32_ATOL if next(lm.model.parameters()).dtype == torch.float32 else BF16_ATOL
    if mutant is not None and not lm.spec.discovered:  # (a discovered spec refuses mutants in verify)
        applies, why = mutant_applies(mutant, lm)
        if not applies:
            raise ProbeError(f"mutant {mutant!r} cannot change {model_name}: {why}")
    result = verify(lm, atol=atol, mutant=mutant, rtol=rtol, cases=["sentence"] if quick else None,
                    progress=verify_progress if progress else None)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else format_table(result))
    if not result.passed:
        click.get_current_context().exit(1)
