"""``probe effects``: zero and mean ablation effects of every head, label groups against random
heads, and on decoders the induction claim."""

from __future__ import annotations

import json

import click

from ..settings import EffectsSettings
from ..util import plural
from .group import main, user_errors
from .options import build, check_files, model_option, model_placement, run_folder_options, setting_option
from .start import Folder, command_console
from .summary import report_line


@main.command("effects")
@model_option
@setting_option(EffectsSettings, "corpus", "--corpus", "-c", type=click.Path(dir_okay=False, path_type=str),
                help="Plain text (one sequence a line) or CoNLL-U [default: the built-in sample].")
@setting_option(EffectsSettings, "pairs", "--pairs", type=click.Path(dir_okay=False, path_type=str),
                help="Encoder-decoder models: source<TAB>target per line (the corpus; targets teacher-forced).")
@setting_option(EffectsSettings, "limit", "--limit", "-n", help="Use at most N sequences.")
@setting_option(EffectsSettings, "objective", "--objective",
                help="What an ablation may hurt [default: seq2seq for encoder-decoder models, else chosen from the "
                     "model as probe prune].")
@setting_option(EffectsSettings, "ablation", "--ablation", show_default=True, metavar="KINDS",
                help="Comma-separated ablations: zero, mean, resample (the head's output on a reference text at "
                     "least as long, drawn with seed 0).")
@setting_option(EffectsSettings, "seeds", "--seeds", show_default=True,
                help="Random head sets per label group (at least 5).")
@setting_option(EffectsSettings, "copies", "--copies", show_default=True,
                help="Ablation sets per forward pass (the batch repeated this many times).")
@setting_option(EffectsSettings, "clusters", "--clusters", is_flag=True,
                help="Also ablate each head group (the report's clusters) against random heads (more passes).")
@setting_option(EffectsSettings, "induction", "--no-induction", is_flag=True, flag_value=False,
                help="Decoders: skip the induction claim.")
@run_folder_options
@click.option("--json", "as_json", is_flag=True, help="Print the label table and the claim as JSON.")
@setting_option(EffectsSettings, "batch_size", "--batch-size", show_default=True)
@setting_option(EffectsSettings, "max_length", "--max-length", help="Token limit per sequence [default: the model's].")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def effects_command(model_name, corpus, pairs, limit, objective, ablation, seeds, copies, clusters, induction, out,
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
    settings = build(EffectsSettings, locals())
    check_files((corpus, "corpus file"), (pairs, "pairs file"))  # before torch is imported: at once
    from ..text.corpus import corpus_input

    # read before torch is imported: a file that is not UTF-8 or holds no text is answered at once
    seqs, source = corpus_input(settings.corpus, settings.pairs, settings.limit)
    from ..effects.induction import claim_lines
    from ..entries.ablation import run_effects
    from ..sites import head_name

    folder = Folder(out, force)
    console = command_console(progress, folder, estimate=True)  # the ablation passes' time, after the second
    run = run_effects(model_name, settings, texts=seqs, source=source, console=console, device=device, dtype=dtype)
    path = run.save(folder.path, force=force)
    result, lm, kinds = run.measured, run.lm, settings.ablation
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
    report_line(path)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
