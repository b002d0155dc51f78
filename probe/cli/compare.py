"""``probe compare``: two runs head by head (run folders, or two models analysed on one corpus)."""

from __future__ import annotations

import click

from ..settings import CompareSettings
from ..util import plural
from .group import main, user_errors
from .options import build, setting_option
from .start import Folder, command_console
from .summary import report_line


@main.command("compare")
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False, path_type=str))
@setting_option(CompareSettings, "models", "--model", "-m", multiple=True,
                help="Analyze this model (give two) on one corpus instead of comparing run folders.")
@setting_option(CompareSettings, "texts", "--text", "-t", multiple=True,
                help="A sequence for --model runs (repeatable).")
@setting_option(CompareSettings, "corpus", "--corpus", "-c", type=click.Path(dir_okay=False, path_type=str),
                help="Corpus for --model runs [default: the built-in sample].")
@setting_option(CompareSettings, "limit", "--limit", "-n", help="Use at most N sequences.")
@setting_option(CompareSettings, "batch_size", "--batch-size", "-b", show_default=True)
@setting_option(CompareSettings, "max_length", "--max-length", help="Truncate sequences to this many tokens.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Comparison folder [default: a new reports/compare-<A>-vs-<B>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out folder probe wrote; other files are kept.")
@setting_option(CompareSettings, "top", "--top", show_default=True, help="Most changed heads drawn side by side.")
@user_errors
def compare_command(runs, models, texts, corpus, limit, batch_size, max_length, out, force, top) -> None:
    """Compare two runs head by head: RUN_A RUN_B (run folders), or --model A --model B on one corpus.

    Writes index.html, compare.csv (layer, head, delta_<statistic> = B - A, labels, status) and
    compare.json. Runs of different depths are aligned by relative depth (the report says how);
    encoder-decoder runs are compared site kind by site kind (stack, kind columns).
    """
    settings = build(CompareSettings, locals())
    given = None
    if not settings.runs:  # before torch is imported: at once
        from ..text.corpus import corpus_input

        given = corpus_input(settings.corpus, None, settings.limit, texts=settings.texts, sample="built-in sample")
    from ..entries.compare import run_compare

    folder = Folder(out, force, kind="compare")
    run = run_compare(settings, texts=given and given[0], source=given and given[1],
                      console=command_console(False, folder))
    path = run.save(folder.path, force=force)
    a, b, _ = run.pair
    df = run.measured
    changed, gone = int(df["label_changed"].sum()), int(df["status"].str.startswith("removed").sum())
    deltas = df.filter(like="delta_").abs().max().dropna()
    biggest = "" if deltas.empty else f"; largest |difference|: {deltas.idxmax()[6:]} {deltas.max():.3g}"
    both = int((df["status"] == "both").sum())
    click.echo(f"Compared {a.model.get('name')} (A) with {b.model.get('name')} (B): {plural(both, 'head')} in both, "
               f"{plural(changed, 'label')} changed, {gone} removed{biggest}")
    for note in df.attrs["notes"]:
        click.echo(f"note: {note}", err=True)
    report_line(path)
