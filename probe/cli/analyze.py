"""``probe analyze``: measure every head on text; write the report, heads.csv and run.json."""

from __future__ import annotations

import sys
import time

import click

from .. import IMPORT_STARTED, bounds
from ..util import process_age
from .audioinput import audio_options, check_audio
from .group import main, user_errors
from .imageinput import image_options, parse_size
from .options import check_files, limit_option, model_option, parse_health, parse_thresholds, placement_options, stacked
from .summary import summary
from .verify import verify_progress

#: --text, --corpus, --pairs, --generate, --limit: what is analysed.
_input_options = stacked(
    click.option("--text", "-t", "texts", multiple=True, help="A sequence to analyze (repeatable)."),
    click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
                 help="Plain text (one sequence a line) or CoNLL-U (# text = lines)."),
    click.option("--pairs", type=click.Path(dir_okay=False, path_type=str), default=None,
                 help="Two texts a line, separated by a tab. Encoders and decoders: two segments of one input "
                      "(sentence pairs, BERT's [SEP]-joined segments; the Kovaleva 'block' type needs them). "
                      "Encoder-decoder models: the source the encoder reads and the target the decoder reads."),
    click.option("--generate", type=click.IntRange(min=1), default=None, metavar="N",
                 help="Encoder-decoder models: the model writes each source's target (greedy, at most N new "
                      "tokens); the sources come from --text or --corpus."),
    limit_option("Use at most N sequences (with --coref/--syntax: N of each file)."),
)

#: --distance, --map-sequences, --circuits, --health-threshold: the pattern analyses (probe.patterns).
_pattern_options = stacked(
    click.option("--distance/--no-distance", default=True, show_default=True,
                 help="Jensen-Shannon distances between heads (groups, head map, duplicate heads)."),
    click.option("--map-sequences", type=click.IntRange(min=1), default=200, show_default=True,
                 help="Sequences (the first of the corpus) in the all-heads distance behind the map and groups."),
    click.option("--circuits/--no-circuits", default=True, show_default=True,
                 help="Decoders: induction / duplicate-token probe on repeated random tokens, attention sinks."),
    click.option("--health-threshold", "health", multiple=True, metavar="CHECK=VALUE", callback=parse_health,
                 help="Override a health-check threshold, e.g. saturated=0.99 (saturated, uniform, collapsed, "
                      "duplicates; repeatable)."),
)

#: --norm, --labels-by: value-weighted statistics (probe.capture.values).
_norm_options = stacked(
    click.option("--norm/--no-norm", "value_weighted", default=True, show_default=True,
                 help="Value-weighted statistics (Kobayashi et al. 2020): every statistic also on the attention "
                      "map weighted by the norm of each key's value vector carried through the head's output "
                      "projection (heads.csv: <statistic>_by_norm, norm_mass)."),
    click.option("--labels-by", type=click.Choice(["weight", "norm"]), default="weight", show_default=True,
                 help="Label heads by their attention statistics (weight) or by their value-weighted ones (norm)."),
)

#: --coref, --syntax: annotated text (probe.linguistic).
_annotation_options = stacked(
    click.option("--coref", is_flag=False, flag_value="builtin", default=None, metavar="[FILE|builtin]",
                 help="Score coreference heads on a GAP TSV file (no value or 'builtin': the built-in probe set); "
                      "the examples are the analysed text. Writes coref.csv."),
    click.option("--syntax", "syntax_file", type=click.Path(dir_okay=False, path_type=str), default=None,
                 metavar="FILE.conllu", help="Score syntactic heads on the dependency trees of a CoNLL-U file; "
                                             "its sentences are the analysed text. Writes syntax.csv."),
)


@main.command("analyze")
@model_option
@_input_options
@image_options
@audio_options
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--max-length", type=click.IntRange(min=2), default=None,
              help="Truncate sequences to this many tokens, at most the model's limit (above it: an error) "
                   "[default: the model's limit].")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out folder probe wrote; other files are kept.")
@click.option("--examples", type=click.IntRange(min=0, max=20), default=3, show_default=True,
              help="Sequences whose attention maps are kept for the report.")
@click.option("--threshold", "thresholds", multiple=True, metavar="LABEL=VALUE", callback=parse_thresholds,
              help="Override a label threshold, e.g. previous-token=0.4 (repeatable).")
@click.option("--parse-special-tokens", is_flag=True,
              help="Let typed special-token strings such as '[SEP]' become special tokens "
                   "(default: typed text is text).")
@click.option("--rollout/--no-rollout", default=True, show_default=True,
              help="Attention rollout and flow (flow: the reported row, texts of at most 64 tokens) of the first "
                   "3 kept examples, side by side with the weights, in the report.")
@click.option("--verify", "run_verify", is_flag=True,
              help="Also verify the from-scratch attention against the model and add it to the report.")
@click.option("--query-block", type=click.IntRange(min=0), default=None, metavar="N",
              help="Capture attention N query rows at a time (flat memory at long lengths; docs/length.md); 0: "
                   "whole maps always. [default: automatic: batches longer than 1024 tokens]. Analyses that need "
                   "whole maps are left out of block-captured batches (with N >= 1: not run).")
@_pattern_options
@_norm_options
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
@_annotation_options
@placement_options
@user_errors
def analyze_command(model_name, texts, corpus, pairs, generate, limit, image_files, image_folder, image_size,
                    audio_files, transcripts, batch_size, max_length, out, force, examples,
                    thresholds, parse_special_tokens, rollout, run_verify, query_block, distance, map_sequences,
                    circuits, health, value_weighted, labels_by, progress, coref, syntax_file, device, dtype,
                    device_map) -> None:
    """Measure every attention head on text and write an HTML report, heads.csv and run.json.

    Without --text, --corpus or --pairs, a small built-in English sample is used; an image model
    reads --image files or an --images folder (heads.csv adds the grid measures, the report the
    attention laid over the first images). A corpus or a
    pairs file is read as it is analysed (memory does not grow with it). With --coref and/or
    --syntax, the annotated text is the analysed text (--limit applies to each file) and cannot be
    combined with --text, --corpus or --pairs. Also measured: head distances and groups, Kovaleva
    pattern types and health checks, on decoders the induction / duplicate-token probe, and the
    value-weighted statistics; --no-distance, --no-circuits and --no-norm turn them off. Under torchrun or accelerate
    launch, each process analyses its share of the corpus and rank 0 writes the one report.
    """
    _check_usage(texts, corpus, pairs, generate, coref, syntax_file)  # before torch is imported: at once
    user_errors(bounds.value_weighting)(value_weighted, labels_by)  # --labels-by norm with --no-norm
    counted = _check_input(texts, corpus, pairs, limit, audio_files)  # also before torch: a streamed file's count
    from ..entries.analyze import analyze_run, start_up_note

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    timings = {"startup_s": time.perf_counter() - started}
    run = analyze_run(
        model_name, texts, corpus=corpus, pairs=pairs, coref=coref, syntax=syntax_file, images=image_files,
        image_folder=image_folder, image_size=parse_size(image_size), audio=audio_files, transcripts=transcripts,
        limit=limit, out=out, force=force, device=device, dtype=dtype, device_map=device_map,
        batch_size=batch_size, max_length=max_length, examples=examples, thresholds=thresholds,
        parse_special_tokens=parse_special_tokens, rollout=rollout, run_verify=run_verify, query_block=query_block,
        distance=distance, map_sequences=map_sequences, circuits=circuits, health=health,
        value_weighted=value_weighted, labels_by=labels_by, generate=generate,
        progress=sys.stderr.isatty() if progress is None else progress, timings=timings, started=started,
        verify_progress=verify_progress, announce=lambda line: click.echo(line, err=True), counted=counted)
    if run.folder is None:
        return  # rank 0 writes the one report
    summary(run.result, run.result.results.get("verification"), run.annotated, run.loading_notes)
    if started_as_command() and (note := start_up_note(timings["startup_s"])):  # in a test runner or notebook
        click.echo(note)  # the "start-up" is the host process's age: only the command's own is explained
    click.echo(f"Report: {run.folder / 'index.html'}")


def _check_usage(texts, corpus, pairs, generate, coref, syntax_file) -> None:
    """Options that cannot go together (usage errors: exit status 2) and missing input files (exit
    status 1), decided before any library is imported."""
    if sum(bool(x) for x in (texts, corpus, pairs)) > 1:
        raise click.UsageError("give either --text, --corpus or --pairs, not two of them")
    if (coref is not None or syntax_file is not None) and (texts or corpus or pairs):
        raise click.UsageError("--coref and --syntax analyse their own annotated text; leave out --text, --corpus "
                               "and --pairs")
    if generate is not None and pairs:
        raise click.UsageError("give either --pairs (sources and targets) or --generate (sources only), not both")
    check_files((corpus, "corpus file"), (pairs, "pairs file"), (syntax_file, "CoNLL-U file"),
                (None if coref in (None, "builtin") else coref, "GAP file"))


@user_errors
def _check_input(texts, corpus, pairs, limit, audio_files) -> int | None:
    """The given input read before torch is imported (a second, not the import): each ``--text`` not
    empty, a corpus or pairs file counted in a first read (UTF-8, at least one sequence, well-formed
    pairs), each ``--audio`` file an audio file (:func:`probe.audio.sniff.check_audio`). Returns the
    number of sequences of a corpus or pairs file (None for the other inputs).

    Raises:
        click.ClickException: the library's one line (exit status 1).
    """
    from ..text.corpus import check_texts, count_sequences

    if texts:
        check_texts(list(texts), limit)
        import os

        for text in texts:  # a path given as --text is analysed as the text it is: say so, once per path
            if os.sep in text and os.path.exists(text.strip()):
                kind = "folder" if os.path.isdir(text.strip()) else "file"
                click.echo(f"note: --text takes the text itself: {text!r} (a {kind} on this machine) is analysed as "
                           f"those characters; a file of texts is --corpus FILE", err=True)
    for path in audio_files:
        check_audio(str(path))
    return count_sequences(corpus, pairs, limit)


def started_as_command() -> bool:
    """This process was started as the ``probe`` command (the console script or ``python -m probe``)."""
    arg = sys.argv[0] if sys.argv else ""
    path = arg.replace("\\", "/")
    return path.rsplit("/", 1)[-1] in ("probe", "probe.exe") or path.endswith(("probe/__main__.py",
                                                                                 "probe/cli/__main__.py"))
