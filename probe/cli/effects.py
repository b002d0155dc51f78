"""``probe effects``: zero and mean ablation effects of every head, label groups against random
heads, and on decoders the induction claim."""

from __future__ import annotations

import json
import sys
import time

import click

from .. import IMPORT_STARTED, bounds
from ..util import plural, process_age
from .group import hold, main, user_errors
from .options import check_files, click_callback, limit_option, model_option, model_placement, run_folder_options


@main.command("effects")
@model_option
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Plain text (one sequence a line) or CoNLL-U [default: the built-in sample].")
@click.option("--pairs", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Encoder-decoder models: source<TAB>target per line (the corpus; targets teacher-forced).")
@limit_option()
@click.option("--objective", type=click.Choice(["clm", "mlm", "fidelity", "seq2seq"]), default=None,
              help="What an ablation may hurt [default: seq2seq for encoder-decoder models, else chosen from the "
                   "model as probe prune].")
@click.option("--ablation", "ablation", default="zero,mean", show_default=True, metavar="KINDS",
              callback=click_callback(lambda v: _ablation_kinds(v)),
              help="Comma-separated ablations: zero, mean, resample (the head's output on a reference text at "
                   "least as long, drawn with seed 0).")
@click.option("--seeds", type=int, default=10, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--seeds", v, 5)),
              help="Random head sets per label group (at least 5).")
@click.option("--copies", type=int, default=8, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--copies", v)),
              help="Ablation sets per forward pass (the batch repeated this many times).")
@click.option("--clusters", is_flag=True,
              help="Also ablate each head group (the report's clusters) against random heads (more passes).")
@click.option("--no-induction", "no_induction", is_flag=True, help="Decoders: skip the induction claim.")
@run_folder_options
@click.option("--json", "as_json", is_flag=True, help="Print the label table and the claim as JSON.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--batch-size", v)))
@click.option("--max-length", type=int, default=None, help="Token limit per sequence [default: the model's].")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def effects_command(model_name, corpus, pairs, limit, objective, ablation, seeds, copies, clusters, no_induction, out,
                    force, as_json, batch_size, max_length, progress, device=None, dtype=None) -> None:
    """Ablate every attention head (zero and mean ablation at the output projection's input; with
    --ablation also resample: the head's output on another text of the corpus) and
    measure the change of the model's objective on held-out text; ablate each label's heads
    together against random heads; on decoders, test whether ablating the induction heads raises
    the loss on repeated random tokens more than ablating random heads.

    Encoder-decoder models: every encoder self, decoder self and cross head; the corpus is --pairs
    (source TAB target), the objective the loss on the targets.

    Cost: (heads + labels x (1 + seeds)) x ablation kinds held-out passes, COPIES sets per pass.
    """
    if corpus and pairs:
        raise click.UsageError("give either --corpus or --pairs, not both")
    check_files((corpus, "corpus file"), (pairs, "pairs file"))  # before torch is imported: at once
    from ..text.corpus import check_texts, read_corpus, read_pairs, sample_texts

    # read before torch is imported: a file that is not UTF-8 or holds no text is answered at once
    seqs, source = ((read_corpus(corpus, limit), corpus) if corpus else (read_pairs(pairs, limit), pairs) if pairs
                    else (check_texts(sample_texts(), limit), "sample"))
    from ..effects.induction import claim_lines
    from ..effects.run import effects_run
    from ..errors import InputError
    from ..loading.models import load_model
    from ..loading.seq2seq import as_targets
    from ..report import claim_run_dir
    from ..sites import head_name

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    kinds = ablation if isinstance(ablation, tuple) else _ablation_kinds(ablation)  # checked when given
    out = hold(claim_run_dir(out, model_name, force))  # claimed before loading a model
    lm = load_model(model_name, head={"mlm": "mlm"}.get(objective, "auto"), dtype=dtype, device=device)
    if lm.kind == "encoder-decoder":
        if not pairs:
            raise InputError(f"{lm.name} is an encoder-decoder model: give its sources and targets with --pairs FILE "
                             "(source<TAB>target per line)")
        seqs = as_targets(seqs)
    show = sys.stderr.isatty() if progress is None else progress
    click.echo(f"Ablating the {plural(len(lm.sites) * lm.geometry.n_heads, 'head')} of {lm.name} on "
               f"{plural(len(seqs), 'sequence')} ({source})", err=True)
    result, path = effects_run(lm, seqs, out=out, force=force, objective=objective, kinds=kinds, seeds=seeds,
                               copies=copies,
                               clusters=clusters, batch_size=batch_size, max_length=max_length, progress=show,
                               induction=not no_induction, timings={"model_load_s": lm.load_seconds},
                               started=started)
    if as_json:
        click.echo(json.dumps({"clean": result.clean, "objective": result.objective, "unit": result.unit,
                               "labels": result.labels.drop(columns=["heads"]).to_dict("records"),
                               "induction": result.induction}, indent=2, default=float))
        return
    shown = "mean" if "mean" in kinds else kinds[0]
    top = result.heads.nlargest(3, f"effect_{shown}")
    click.echo(f"{result.objective} ({result.unit}) on {plural(result.split['held_out'], 'held-out sequence')}: "
               f"clean {result.clean:.4g}; largest {shown}-ablation effects: "
               + ", ".join(f"{head_name(r._asdict() if lm.kind == 'encoder-decoder' else r.layer, r.head)} "
                           f"{getattr(r, f'effect_{shown}'):+.3g}" for r in top.itertuples()))
    for r in result.labels.itertuples():
        click.echo(f"  {r.label} ({r.ablation}, {plural(r.n_heads, 'head')}): {r.effect:+.4g} "
                   f"[{r.effect_low:+.3g}, {r.effect_high:+.3g}] vs random {r.random_mean:+.4g} +- {r.random_std:.2g}: "
                   f"{r.verdict}")
    for line in claim_lines(result.induction) if result.induction else []:
        click.echo(line)
    click.echo(f"Report: {path / 'index.html'}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def _ablation_kinds(value: str) -> tuple[str, ...]:
    """``--ablation``'s comma-separated kinds, checked by :func:`probe.bounds.ablation_kinds` (before torch
    is imported)."""
    from ..bounds import ablation_kinds

    return ablation_kinds([k.strip() for k in value.split(",") if k.strip()])
