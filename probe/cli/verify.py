"""``probe verify``: does probe's from-scratch attention reproduce the model?"""

from __future__ import annotations

import json

import click

from ..settings import VerifySettings
from ..settings.kinds import FP32_RTOL, MUTANT_NAMES
from .group import main, user_errors
from .options import build, device_option, dtype_option, model_option, setting_option
from .start import command_console

#: Re-exported from :mod:`probe.settings.kinds`, where they are written (tests/test_start_up.py checks them).
__all__ = ["FP32_RTOL", "MUTANT_NAMES", "format_table", "verify_progress"]


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
@setting_option(VerifySettings, "atol", "--atol",
                help="Absolute tolerance [default: 1e-05 for float32, 0.01 for bfloat16/float16].")
@setting_option(VerifySettings, "rtol", "--rtol", show_default=True, help="Relative tolerance.")
@setting_option(VerifySettings, "mutant", "--mutant",
                help="Verify a deliberately broken attention instead (expected to FAIL).")
@dtype_option
@device_option
@setting_option(VerifySettings, "quick", "--quick", is_flag=True,
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
    settings = build(VerifySettings, locals())
    from ..entries.checks import run_verify

    run = run_verify(model_name, settings, console=command_console(True, case=verify_progress if progress else None),
                     device=device, dtype=dtype)
    result = run.measured
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else format_table(result))
    if not result.passed:
        click.get_current_context().exit(1)
