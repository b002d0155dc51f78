"""``probe patch``: activation patching per head, direct logit attribution and composition scores."""

from __future__ import annotations

import json

import click

from ..settings import PatchSettings
from .group import main, user_errors
from .options import build, model_option, model_placement, run_folder_options, setting_option
from .start import Folder, command_console, read_pairs
from .summary import report_line


@main.command("patch")
@model_option(default="smollm2")  # patching runs on decoders: the embedded decoder
@setting_option(PatchSettings, "pairs", "--pairs", type=click.Path(dir_okay=False, path_type=str),
                help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@setting_option(PatchSettings, "direction", "--direction", show_default=True,
                help="denoise: corrupted run, clean head output; noise: clean run, corrupted head output.")
@setting_option(PatchSettings, "method", "--method", show_default=True,
                help="attribution: also attribution patching (the gradient estimate), with its correlation to "
                     "activation patching.")
@setting_option(PatchSettings, "components", "--component", show_default=True, metavar="C,C,...",
                help="What is patched, comma-separated: z (each head's output), q (per query head), k, v (per "
                   "key/value head where grouped), pattern (per head), resid (the residual stream entering each "
                   "block), mlp (each MLP's output). z is always patched; the others go to components.csv.")
@setting_option(PatchSettings, "heads_per_pass", "--heads-per-pass",
                help="Patched copies of the batch in one forward pass [default: 2 x heads, one layer a pass].")
@setting_option(PatchSettings, "rope_offsets", "--rope-offsets", show_default=True,
                help="RoPE models: average the Q- and K-composition scores over relative offsets D = 0..K-1 "
                   "(1: the content term D = 0 only).")
@run_folder_options
@click.option("--json", "as_json", is_flag=True, help="Print the section's record as JSON.")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def patch_command(model_name, pairs, direction, method, components, heads_per_pass, rope_offsets, out, force,
                  as_json, progress, device=None, dtype=None) -> None:
    """Patch each head's output (before the output projection) between clean and corrupted prompts
    and measure how much of the logit difference answer - wrong it restores; with the direct logit
    attribution of every head and the heads' Q/K/V-composition scores (decoders). Also masked-LM
    encoders (the metric at the clean prompt's first [MASK]) and encoder-decoder models (every encoder
    self, decoder self and cross head; the metric at the decoder's last position).

    \b
    Pairs file: one pair a line, four tab-separated fields
      clean  corrupted  answer  wrong  [target prefix: encoder-decoder models]
    clean and corrupted must have the same number of tokens; answer and wrong one token each
    (with their leading space: " Mary"). Default: 20 indirect-object pairs written for probe,
    "When Mary and John went to the store, John gave a drink to" -> " Mary" vs " John".
    """
    settings = build(PatchSettings, locals())
    given = read_pairs(settings.pairs)  # before torch is imported: a bad pairs file is answered at once
    from ..entries.pairs import patch_components, run_patch
    from ..sites import head_name

    folder = Folder(out, force)
    console = command_console(progress, folder, say=True, estimate=True)  # the patched passes' time, once measured
    run = run_patch(model_name, settings, pairs=given, console=console, device=device, dtype=dtype)
    path = run.save(folder.path, force=force)
    result, lm = run.measured, run.lm
    p = result.patching
    if as_json:
        record = json.loads((path / "run.json").read_text(encoding="utf-8")).get("patching")
        click.echo(json.dumps(record, indent=2))
    else:
        top = p.reindex(p["effect"].abs().sort_values(ascending=False).index).head(5)
        several = lm.kind == "encoder-decoder"
        if not p.attrs["normalized"]:  # the gap too small to divide by: patch.csv holds LD changes
            unit = "each the change of LD, in logits"
        elif p.attrs["direction"] == "noise":
            unit = "each the share of the clean - corrupted LD lost"
        else:
            unit = "each the share of the clean - corrupted LD recovered"
        click.echo(f"logit difference (LD) clean {p.attrs['ld_clean']:.4g}, corrupted {p.attrs['ld_corrupted']:.4g}; "
                   f"largest effects ({unit}; patch.csv): "
                   + ", ".join(f"{head_name(r._asdict() if several else int(r.layer), int(r.head))} {r.effect:.3g}"
                               for r in top.itertuples()))
        if "attribution" in p.attrs:
            a = p.attrs["attribution"]
            click.echo(f"attribution vs activation patching: correlation {_corr(a['correlation'])} (all positions), "
                       f"{_corr(a['correlation_last'])} (last position)")
        for c in patch_components(run):
            corr = (f"; attribution correlation {_corr(c['correlation'])} (all positions), "
                    f"{_corr(c['correlation_last'])} (last)") if "correlation" in c else ""
            click.echo(f"component {c['component']} ({c['units']} {c['unit']} units): largest effect {c['top']} "
                       f"{c['top_effect']:.3g}{corr}")
        report_line(path)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def _corr(value) -> str:
    """A correlation to print: three decimals, or ``undefined`` (one side constant, or fewer than 3 units)."""
    return "undefined" if value is None or value != value else f"{value:.3f}"
