"""``probe why``: one head's attention scores at one query row split by what built its query and its key."""

from __future__ import annotations

import click

from ..bounds import why_head_kind
from ..settings import WhySettings
from .group import main, user_errors
from .options import build, check_files, model_option, model_placement, run_folder_options, setting_option
from .start import Folder, command_console
from .summary import report_line


@main.command("why")
@model_option
@setting_option(WhySettings, "text", "--text", "-t",
                help="The sequence (one text; an encoder-decoder model's source).")
@setting_option(WhySettings, "target", "--target",
                help="Encoder-decoder models: the decoder's text [default: the source].")
@setting_option(WhySettings, "corpus", "--corpus", "-c", type=click.Path(dir_okay=False, path_type=str),
                help="Instead of --text: plain text (one sequence a line) or CoNLL-U; the contributions are averaged "
                     "over every row whose most attended key fits the head's label.")
@setting_option(WhySettings, "label", "--label",
                help="With --corpus: the rows to average [default: the head's label in the short analysis].")
@setting_option(WhySettings, "limit", "--limit", "-n", help="Use at most N sequences.")
@setting_option(WhySettings, "head", "--head", required=True, metavar="L5H1",
                help="The head (layer and head, 0-based); an encoder-decoder model's cross-attention head: "
                     "'cross L5H1'.")
@setting_option(WhySettings, "query", "--query", type=int,
                help="The query row (0-based token position) [default: the last].")
@setting_option(WhySettings, "top", "--top", show_default=True,
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
    score. Writes why.csv, run.json and index.html (the heads labelled by the analysis of the built-in
    sample, cached per model).

    With --corpus: the contributions averaged over every row whose most attended key fits the head's
    label (why_corpus.csv, why_sources.csv).

    Encoder-decoder models: a cross-attention head ('cross L1H2'), its query split by the decoder's
    writers and its key by the encoder's (--text the source, --target the decoder's text)."""
    settings = build(WhySettings, locals())
    why_head_kind(settings.head)  # what the name alone decides: before torch's import (seconds)
    check_files((corpus, "corpus file"))
    from ..entries.why import run_why

    folder = Folder(out, force)
    run = run_why(model_name, settings, console=command_console(progress, folder), device=device, dtype=dtype)
    path = run.save(folder.path, force=force)
    result = run.measured
    if result.corpus is not None:
        click.echo(result.corpus.sentence(result.labels))
        report_line(path)
        for note in result.notes:
            click.echo(f"note: {note}", err=True)
        return
    w = result.why
    click.echo(f"{w.name} at query {w.query} ({w.query_token!r}): {len(w.sources)} sources; sum of the "
               f"contributions - the model's score: {w.residual:.2g} (tolerance {w.tolerance:.2g})")
    click.echo("  A: attention probability; s: the scaled q.k that the sources split (before any cap, position "
               "bias and the softmax); then query source x key source: its part of s (more in why.csv)")
    for j in w.top_keys(top):
        rows = result.frame[result.frame["key"] == j].iloc[:3]
        pairs = ", ".join(f"{r.query_source} x {r.key_source} {r.contribution:.3g}" for r in rows.itertuples())
        click.echo(f"  key {j} ({w.tokens[j]!r}): A {w.pattern[j]:.3f}, s {w.scores[j]:.4g}; {pairs}")
    report_line(path)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
