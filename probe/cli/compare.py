"""``probe compare``: two runs head by head (run folders, or two models analysed on one corpus)."""

from __future__ import annotations

from pathlib import Path

import click

from ..util import plural
from .group import hold, main, user_errors
from .options import limit_option


@main.command("compare")
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False, path_type=str))
@click.option("--model", "-m", "models", multiple=True,
              help="Analyze this model (give two) on one corpus instead of comparing run folders.")
@click.option("--text", "-t", "texts", multiple=True, help="A sequence for --model runs (repeatable).")
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Corpus for --model runs [default: the built-in sample].")
@limit_option()
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--max-length", type=click.IntRange(min=2), default=None, help="Truncate sequences to this many tokens.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Comparison folder [default: a new reports/compare-<A>-vs-<B>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out folder probe wrote; other files are kept.")
@click.option("--top", type=click.IntRange(min=0, max=20), default=4, show_default=True,
              help="Most changed heads drawn side by side.")
@user_errors
def compare_command(runs, models, texts, corpus, limit, batch_size, max_length, out, force, top) -> None:
    """Compare two runs head by head: RUN_A RUN_B (run folders), or --model A --model B on one corpus.

    Writes index.html, compare.csv (layer, head, delta_<statistic> = B - A, labels, status) and
    compare.json. Runs of different depths are aligned by relative depth (the report says how);
    encoder-decoder runs are compared site kind by site kind (stack, kind columns).
    """
    if bool(runs) == bool(models) or (runs and len(runs) != 2) or (models and len(models) != 2):
        raise click.UsageError("give two run folders (RUN_A RUN_B) or two models (--model A --model B)")
    if runs and (texts or corpus or limit):
        raise click.UsageError("--text, --corpus and --limit go with --model, not with run folders")
    given = None if runs else _sequences(texts, corpus, limit)  # before torch is imported: at once
    from ..compare import compare_runs, load_run, write_compare
    from ..compare.report import compare_name
    from ..report import claim_run_dir

    if runs:
        a, b = load_run(runs[0]), load_run(runs[1])
        out = hold(claim_run_dir(out, compare_name(a, b), force, kind="compare"))
        tokenizers = (None, None)
    else:
        a, b, tokenizers, out = _analyze_pair(models, given, batch_size, max_length, out, force)
    path = write_compare(a, b, out, force=force, top=top, tokenizers=tokenizers)
    df = compare_runs(a, b)
    changed, gone = int(df["label_changed"].sum()), int(df["status"].str.startswith("removed").sum())
    deltas = df.filter(like="delta_").abs().max().dropna()
    biggest = "" if deltas.empty else f"; largest |difference|: {deltas.idxmax()[6:]} {deltas.max():.3g}"
    both = int((df["status"] == "both").sum())
    click.echo(f"Compared {a.model.get('name')} (A) with {b.model.get('name')} (B): {plural(both, 'head')} in both, "
               f"{plural(changed, 'label')} changed, {gone} removed{biggest}")
    for note in df.attrs["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"Report: {path / 'index.html'}")


def _sequences(texts, corpus, limit) -> tuple[list[str], str]:
    """The sequences of ``probe compare --model A --model B`` and where they come from, read before
    torch is imported (:mod:`probe.text.corpus` needs no heavy library)."""
    from ..errors import InputError
    from ..text.corpus import check_texts, read_corpus, sample_texts

    if texts and corpus:
        raise InputError("give either --text or --corpus, not both")
    if corpus:
        return read_corpus(corpus, limit), corpus
    if texts:
        return check_texts(list(texts), limit), "--text"
    return check_texts(sample_texts(), limit), "built-in sample"


def _analyze_pair(models, given, batch_size, max_length, out, force):
    """Analyze two models on the same sequences (``probe compare --model A --model B``); ``given`` is
    (sequences, source) from :func:`_sequences`."""
    from ..compare.report import COMPARE_STEM
    from ..loading.models import load_model
    from ..report import claim_run_dir
    from ..runs.analysis import analyze

    seqs, source = given
    # claimed before loading a model: one run per folder
    out = hold(claim_run_dir(out, COMPARE_STEM.format(*(Path(m).name for m in models)), force, kind="compare"))
    results, tokenizers = [], []
    for name in models:
        lm = load_model(name)
        click.echo(f"Analyzing {plural(len(seqs), 'sequence')} ({source}) with {lm.name}: "
                   f"{plural(lm.geometry.n_layers, 'layer')} x {plural(lm.geometry.n_heads, 'head')}", err=True)
        result = analyze(lm, seqs, batch_size=batch_size, max_length=max_length)
        result.settings["input"] = source
        results.append(result)
        tokenizers.append(lm.tokenizer)
    return results[0], results[1], tuple(tokenizers), out
