"""``probe patch``: activation patching per head, direct logit attribution and composition scores."""

from __future__ import annotations

import json
import sys
import time

import click

from .. import IMPORT_STARTED, bounds
from ..util import plural, process_age
from .group import main, user_errors
from .options import click_callback, model_option, model_placement, run_folder_options
from .pairstart import pair_input, pairs_and_model


def _components(text: str) -> None:
    """The --component list, checked before the model loads (a usage error: exit 2)."""
    from ..bounds import components  # no heavy library: answered before torch is imported

    components(text)


@main.command("patch")
@model_option(default="smollm2")  # patching runs on decoders: the embedded decoder
@click.option("--pairs", "pairs_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@click.option("--direction", type=click.Choice(["denoise", "noise"]), default="denoise", show_default=True,
              help="denoise: corrupted run, clean head output; noise: clean run, corrupted head output.")
@click.option("--method", type=click.Choice(["activation", "attribution"]), default="activation", show_default=True,
              help="attribution: also attribution patching (the gradient estimate), with its correlation to "
                   "activation patching.")
@click.option("--component", "component", default="z", show_default=True, metavar="C,C,...",
              callback=click_callback(lambda v: _components(v)),
              help="What is patched, comma-separated: z (each head's output), q (per query head), k, v (per "
                   "key/value head where grouped), pattern (per head), resid (the residual stream entering each "
                   "block), mlp (each MLP's output). z is always patched; the others go to components.csv.")
@click.option("--heads-per-pass", type=int, default=None,
              callback=click_callback(lambda v: v if v is None else bounds.positive_int("--heads-per-pass", v)),
              help="Patched copies of the batch in one forward pass [default: 2 x heads, one layer a pass].")
@click.option("--rope-offsets", type=int, default=1, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--rope-offsets", v)),
              help="RoPE models: average the Q- and K-composition scores over relative offsets D = 0..K-1 "
                   "(1: the content term D = 0 only).")
@run_folder_options
@click.option("--json", "as_json", is_flag=True, help="Print the section's record as JSON.")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def patch_command(model_name, pairs_file, direction, method, component, heads_per_pass, rope_offsets, out, force,
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
    given = pair_input(pairs_file)  # before torch is imported: a bad pairs file is answered at once
    from ..effects.components import check_components, parse_components
    from ..effects.patch_report import component_rows
    from ..effects.patch_run import patch_run
    from ..effects.patching import check_patchable
    from ..sites import head_name

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    components = tuple(dict.fromkeys(("z", *parse_components(component))))

    def check(lm) -> None:
        check_patchable(lm)
        check_components(lm, components)

    # an encoder with its masked-LM head where the checkpoint has one
    lm, pairs, source, out = pairs_and_model(model_name, pairs_file, out, force, dtype=dtype, device=device,
                                             head="auto", given=given, check=check)
    show = sys.stderr.isatty() if progress is None else progress
    click.echo(f"Patching {lm.name} ({plural(len(lm.sites) * lm.geometry.n_heads, 'head')}) on {len(pairs)} pairs "
               f"({source}), {direction}", err=True)
    result, path = patch_run(lm, pairs, out=out, force=force, source=source, direction=direction,
                             heads_per_pass=heads_per_pass, progress=show, rope_offsets=rope_offsets, method=method,
                             components=components,
                             timings={"model_load_s": lm.load_seconds}, started=started,
                             say=None if show else lambda line: click.echo(line, err=True))  # no bars: a line a stage
    p = result.patching
    if as_json:
        record = json.loads((path / "run.json").read_text(encoding="utf-8")).get("patching")
        click.echo(json.dumps(record, indent=2))
    else:
        top = p.reindex(p["effect"].abs().sort_values(ascending=False).index).head(5)
        several = lm.kind == "encoder-decoder"
        click.echo(f"LD clean {p.attrs['ld_clean']:.4g}, corrupted {p.attrs['ld_corrupted']:.4g}; largest effects: "
                   + ", ".join(f"{head_name(r._asdict() if several else int(r.layer), int(r.head))} {r.effect:.3g}"
                               for r in top.itertuples()))
        if "attribution" in p.attrs:
            a = p.attrs["attribution"]
            click.echo(f"attribution vs activation patching: correlation {_corr(a['correlation'])} (all positions), "
                       f"{_corr(a['correlation_last'])} (last position)")
        for c in (component_rows(result.components) if result.components is not None else []):
            corr = (f"; attribution correlation {_corr(c['correlation'])} (all positions), "
                    f"{_corr(c['correlation_last'])} (last)") if "correlation" in c else ""
            click.echo(f"component {c['component']} ({c['units']} {c['unit']} units): largest effect {c['top']} "
                       f"{c['top_effect']:.3g}{corr}")
        click.echo(f"Report: {path / 'index.html'}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def _corr(value) -> str:
    """A correlation to print: three decimals, or ``undefined`` (one side constant, or fewer than 3 units)."""
    return "undefined" if value is None or value != value else f"{value:.3f}"
