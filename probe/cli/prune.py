"""``probe prune``: pruning curves (importance, redundancy, random) and the pruned model's folder."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..settings import PruneSettings
from ..util import plural
from .group import hold, main, user_errors
from .options import build, check_files, model_option, model_placement, setting_option, stacked
from .start import Folder, command_console
from .summary import report_line

#: --objective, --labels, --order, --steps, --fraction, --seeds: the pruning experiment.
_experiment_options = stacked(
    setting_option(PruneSettings, "objective", "--objective",
                   help="What pruning must not hurt [default: chosen from the model, see above]."),
    setting_option(PruneSettings, "labels", "--labels", type=click.Path(dir_okay=False, path_type=str),
                   help="classification: one label (class id or name) per line, in corpus order."),
    setting_option(PruneSettings, "orders", "--order", show_default=True,
                   help="Curves to run; the first one's heads are removed from the pruned copy."),
    setting_option(PruneSettings, "steps", "--steps", show_default=True, help="Pruning steps (points after step 0)."),
    setting_option(PruneSettings, "fraction", "--fraction", show_default=True,
                   help="Share of all heads pruned by the last step, in (0, 1)."),
    setting_option(PruneSettings, "seeds", "--seeds", show_default=True, help="Random orders (at least 3)."))


@main.command("prune")
@model_option
@setting_option(PruneSettings, "corpus", "--corpus", "-c", type=click.Path(dir_okay=False, path_type=str),
                help="Plain text (one sequence a line) or CoNLL-U [default: the built-in sample].")
@setting_option(PruneSettings, "limit", "--limit", "-n", help="Use at most N sequences.")
@_experiment_options
@click.option("--save-pruned", "save_to", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Write the model with those heads removed from its weights to this new folder.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out / --save-pruned folder probe wrote; other files are kept.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@setting_option(PruneSettings, "batch_size", "--batch-size", show_default=True)
@setting_option(PruneSettings, "max_length", "--max-length", help="Token limit per sequence [default: the model's].")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def prune_command(model_name, corpus, limit, objective, labels, orders, steps, fraction, seeds, save_to, out, force,
                  as_json, batch_size, max_length, progress, device=None, dtype=None) -> None:
    """Prune attention heads step by step in importance, redundancy and random order; plot the
    objective on held-out text against the share of heads pruned; optionally save the model with
    the heads really removed.

    \b
    Default objective, by model:
      clm             decoders (loaded with their language-model head): next-token loss
      classification  a sequence-classification checkpoint with --labels: cross-entropy
      mlm             encoders whose checkpoint has a masked-LM head (e.g. bert-base): masked-token loss
      fidelity        other encoders (e.g. minilm, which has no head): 1 - cosine similarity to the
                      original model's mean-pooled sentence embedding
    Each is the loss the checkpoint was trained for, or, without a head, what its users rely on.
    """
    settings = build(PruneSettings, locals())
    check_files((corpus, "corpus file"))  # before torch is imported: at once
    from ..text.corpus import corpus_input

    # read before torch is imported: a file that is not UTF-8 or holds no text is answered at once
    seqs, source = corpus_input(settings.corpus, None, settings.limit)

    from ..entries.ablation import run_prune, save_pruned_copy
    from ..pruning.experiment import SPEED_REPEATS
    from ..pruning.saving import claim_target

    folder = Folder(out, force)

    def claim_both(name: str) -> None:  # both folders claimed before the model loads: one run per folder
        folder(name)
        if save_to:
            hold(claim_target(Path(save_to), force))

    console = command_console(progress, claim_both, estimate=True)  # the curves' time left, once it is measured
    run = run_prune(model_name, settings, texts=seqs, source=source, console=console, device=device, dtype=dtype,
                    removable=bool(save_to))
    path = run.save(folder.path, force=force)
    if save_to:
        save_pruned_copy(run, save_to, force=force)
    result = run.measured
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        last = result.curves.groupby("order", sort=False).tail(1)
        parts = [f"{r.order} {r.value:.4g}" + (f" +- {r.std:.2g}" if r.order == "random" else "")
                 for r in last.itertuples()]
        click.echo(f"{result.objective} ({result.unit}) on {plural(result.split['held_out'], 'held-out sequence')}: "
                   f"{result.curves['value'].iloc[0]:.4g} unpruned; at {last['fraction'].iloc[0]:.0%} pruned: "
                   f"{', '.join(parts)}")
        if result.pruned_params is not None:  # None where heads cannot be removed (the notes say why)
            lo, hi = result.speedup_range
            click.echo(f"pruned copy ({plural(len(result.removed), 'head')} removed): {result.params_before:,} -> "
                       f"{result.pruned_params:,} parameters, forward {result.speedup:.2f}x (median of "
                       f"{SPEED_REPEATS} interleaved repeats, {lo:.2f}x-{hi:.2f}x), "
                       f"max |removed - gated| {result.max_abs_diff:.2g}")
        report_line(path)
        if save_to:
            click.echo(f"Pruned model: {save_to}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
