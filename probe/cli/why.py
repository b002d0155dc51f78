"""``probe why``: one head's attention scores at one query row split by what built its query and its key."""

from __future__ import annotations

import sys
import time

import click

from .. import IMPORT_STARTED
from ..util import process_age
from .group import hold, main, user_errors
from .options import check_files, click_callback, limit_option, model_option, model_placement, run_folder_options


def _head_form(value: str) -> None:
    """The form of --head (L5H1, or with an encoder-decoder model's site kind first: cross L5H1), before
    any model is loaded (whether it exists is checked once it is)."""
    from ..errors import InputError

    prefix, _, rest = value.strip().partition(" ")
    text = (rest if prefix.lower() in ("enc", "dec", "cross") and rest else value).strip().upper()
    if not (text.startswith("L") and "H" in text[1:] and text[1:].replace("H", "", 1).isdigit()):
        raise InputError(f"{value!r} is not a head of the form L5H1 (layer and head, 0-based; an encoder-decoder "
                         "model's cross-attention head: 'cross L5H1')")


@main.command("why")
@model_option
@click.option("--text", "-t", default=None, help="The sequence (one text; an encoder-decoder model's source).")
@click.option("--target", default=None, help="Encoder-decoder models: the decoder's text [default: the source].")
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Instead of --text: plain text (one sequence a line) or CoNLL-U; the contributions are averaged "
                   "over every row whose most attended key fits the head's label.")
@click.option("--label", type=click.Choice(["previous-token", "next-token", "self", "first-token", "induction",
                                            "duplicate-token", "sep"]), default=None,
              help="With --corpus: the rows to average [default: the head's label in the short analysis].")
@limit_option()
@click.option("--head", "head", required=True, metavar="L5H1", callback=click_callback(_head_form),
              help="The head (layer and head, 0-based); an encoder-decoder model's cross-attention head: "
                   "'cross L5H1'.")
@click.option("--query", type=int, default=None, help="The query row (0-based token position) [default: the last].")
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True,
              help="Keys listed (the most attended), each with its 10 largest source pairs.")
@run_folder_options
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def why_command(model_name, text, target, corpus, label, limit, head, query, top, out, force, progress, device=None,
                dtype=None) -> None:
    """Why a head attends where it does: each score s_ij of the query row split into C_ij[a, b] over
    the sources a of the query and b of the key (token and position embeddings, each earlier head,
    each earlier MLP, the biases), every norm frozen at the run, checked against the model's own
    score. Writes why.csv, run.json and index.html (the heads labelled by a short analysis).

    With --corpus: the contributions averaged over every row whose most attended key fits the head's
    label (why_corpus.csv, why_sources.csv).

    Encoder-decoder models: a cross-attention head ('cross L1H2'), its query split by the decoder's
    writers and its key by the encoder's (--text the source, --target the decoder's text)."""
    from ..loading.models import load_model, peek_config
    from ..qk.run import why_run
    from ..qk.score import check_head_config
    from ..report import claim_run_dir
    from ..text.corpus import read_corpus

    if (text is None) == (corpus is None):
        raise click.UsageError("give either --text or --corpus")
    if corpus is None and (label is not None or limit is not None):
        raise click.UsageError("--label and --limit go with --corpus")
    if corpus is not None and (query is not None or target is not None):
        raise click.UsageError("--query and --target go with --text")
    check_files((corpus, "corpus file"))

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    check_head_config(head, peek_config(model_name), model_name)  # what the config decides: before the weights
    out = hold(claim_run_dir(out, model_name, force))  # claimed before loading a model: one run per folder
    lm = load_model(model_name, dtype=dtype, device=device)
    show = sys.stderr.isatty() if progress is None else progress
    texts = None if corpus is None else read_corpus(corpus, limit)
    result, path = why_run(lm, text, head, query, top=top, out=out, force=force, progress=show,
                           timings={"model_load_s": lm.load_seconds}, started=started, corpus=texts, label=label,
                           target=target)
    if result.corpus is not None:
        click.echo(result.corpus.sentence(result.labels))
        click.echo(f"Report: {path / 'index.html'}")
        for note in result.notes:
            click.echo(f"note: {note}", err=True)
        return
    w = result.why
    click.echo(f"{w.name} at query {w.query} ({w.query_token!r}): {len(w.sources)} sources; sum of the "
               f"contributions - the model's score: {w.residual:.2g} (tolerance {w.tolerance:.2g})")
    for j in w.top_keys(top):
        rows = result.frame[result.frame["key"] == j].iloc[:3]
        pairs = ", ".join(f"{r.query_source} x {r.key_source} {r.contribution:.3g}" for r in rows.itertuples())
        click.echo(f"  key {j} ({w.tokens[j]!r}): A {w.pattern[j]:.3f}, s {w.scores[j]:.4g}; {pairs}")
    click.echo(f"Report: {path / 'index.html'}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
