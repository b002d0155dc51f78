"""``probe prune``: pruning curves (importance, redundancy, random) and the pruned model's folder."""

from __future__ import annotations

import json
import sys
import time

import click
from click.core import ParameterSource

from .. import IMPORT_STARTED, bounds
from ..util import plural, process_age
from .group import hold, main, user_errors
from .options import check_files, click_callback, limit_option, model_option, model_placement, stacked


def _orders(ctx, param, value: str) -> list[str]:
    """``--order``: a comma-separated list of distinct orders (:data:`probe.bounds.PRUNING_ORDERS`)."""
    orders = [o.strip() for o in value.split(",") if o.strip()]
    if ctx.get_parameter_source(param.name) is ParameterSource.DEFAULT:
        return orders
    bad = [o for o in orders if o not in bounds.PRUNING_ORDERS]
    if bad or not orders or len(set(orders)) != len(orders):
        raise click.BadParameter(f"{value!r}: a comma-separated list of distinct orders from "
                                 f"{', '.join(bounds.PRUNING_ORDERS)}")
    return orders


#: --objective, --labels, --order, --steps, --fraction, --seeds: the pruning experiment.
_experiment_options = stacked(
    click.option("--objective", type=click.Choice(["clm", "mlm", "fidelity", "classification"]), default=None,
                 help="What pruning must not hurt [default: chosen from the model, see above]."),
    click.option("--labels", type=click.Path(dir_okay=False, path_type=str), default=None,
                 help="classification: one label (class id or name) per line, in corpus order."),
    click.option("--order", "orders", default="importance,redundancy,random", show_default=True, callback=_orders,
                 help="Curves to run; the first one's heads are removed from the pruned copy."),
    click.option("--steps", type=int, default=10, show_default=True,
                 callback=click_callback(lambda v: bounds.positive_int("--steps", v)),
                 help="Pruning steps (points after step 0)."),
    click.option("--fraction", type=float, default=0.5, show_default=True,
                 callback=click_callback(lambda v: bounds.fraction("--fraction", v)),
                 help="Share of all heads pruned by the last step, in (0, 1)."),
    click.option("--seeds", type=int, default=3, show_default=True,
                 callback=click_callback(lambda v: bounds.positive_int("--seeds", v, 3)),
                 help="Random orders (at least 3)."),
)


@main.command("prune")
@model_option
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Plain text (one sequence a line) or CoNLL-U [default: the built-in sample].")
@limit_option()
@_experiment_options
@click.option("--save-pruned", "save_to", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Write the model with those heads removed from its weights to this new folder.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out / --save-pruned folder probe wrote; other files are kept.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--batch-size", v)))
@click.option("--max-length", type=int, default=None, help="Token limit per sequence [default: the model's].")
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
    check_files((corpus, "corpus file"))  # before torch is imported: at once
    from pathlib import Path

    from ..text.corpus import check_texts, read_corpus, sample_texts

    # read before torch is imported: a file that is not UTF-8 or holds no text is answered at once
    seqs, source = (read_corpus(corpus, limit), corpus) if corpus else (check_texts(sample_texts(), limit), "sample")

    from ..loading.models import load_model
    from ..pruning.experiment import SPEED_REPEATS
    from ..pruning.run import prune_run, read_labels
    from ..pruning.saving import claim_target
    from ..report import claim_run_dir

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    label_list = read_labels(labels, len(seqs)) if labels else None
    out = hold(claim_run_dir(out, model_name, force))  # claimed before loading a model: one run per folder
    if save_to:
        hold(claim_target(Path(save_to), force))
    head = {"mlm": "mlm", "classification": "classification", None: "auto"}.get(objective)
    lm = load_model(model_name, head=head, dtype=dtype, device=device)
    show = sys.stderr.isatty() if progress is None else progress
    if save_to:
        from ..errors import InputError
        from ..pruning.removal import removal_unsupported

        if removal_unsupported(lm):
            raise InputError(f"--save-pruned: cannot remove heads: {removal_unsupported(lm)}")
    click.echo(f"Pruning {lm.name} ({lm.geometry.n_layers} x {lm.geometry.n_heads} heads) on "
               f"{plural(len(seqs), 'sequence')} ({source}): {', '.join(orders)}, {plural(steps, 'step')} "
               f"to {fraction:.0%}", err=True)
    result, path = prune_run(lm, seqs, out=out, force=force, save_pruned_to=save_to, labels=label_list,
                             objective=objective, orders=orders, steps=steps, fraction=fraction, seeds=seeds,
                             batch_size=batch_size, max_length=max_length, progress=show,
                             timings={"model_load_s": lm.load_seconds}, started=started)
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
        click.echo(f"Report: {path / 'index.html'}")
        if save_to:
            click.echo(f"Pruned model: {save_to}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
