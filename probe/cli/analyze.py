"""``probe analyze``: measure every head on text; write the report, heads.csv and run.json."""

from __future__ import annotations

import sys
import time

import click

from ..settings import AnalyzeSettings
from .audioinput import audio_options, check_audio
from .group import main, user_errors
from .imageinput import image_options
from .options import (
    build,
    check_files,
    model_option,
    parse_health,
    parse_thresholds,
    placement_options,
    setting_option,
    stacked,
)
from .start import command_console, started
from .summary import report_line, summary
from .verify import verify_progress

#: --text, --corpus, --pairs, --generate, --limit: what is analysed.
_input_options = stacked(
    setting_option(AnalyzeSettings, "texts", "--text", "-t", multiple=True,
                   help="A sequence to analyze (repeatable)."),
    setting_option(AnalyzeSettings, "corpus", "--corpus", "-c", type=click.Path(dir_okay=False, path_type=str),
                   help="Plain text (one sequence a line) or CoNLL-U (# text = lines)."),
    setting_option(AnalyzeSettings, "pairs", "--pairs", type=click.Path(dir_okay=False, path_type=str),
                   help="Two texts a line, separated by a tab. Encoders and decoders: two segments of one input "
                        "(sentence pairs, BERT's [SEP]-joined segments; the Kovaleva 'block' type needs them). "
                        "Encoder-decoder models: the source the encoder reads and the target the decoder reads."),
    setting_option(AnalyzeSettings, "generate", "--generate", metavar="N",
                   help="Encoder-decoder models: the model writes each source's target (greedy, at most N new "
                        "tokens); the sources come from --text or --corpus."),
    setting_option(AnalyzeSettings, "limit", "--limit", "-n",
                   help="Use at most N sequences (with --coref/--syntax: N of each file)."),
)

#: --distance, --map-sequences, --circuits, --health-threshold: the pattern analyses (probe.patterns).
_pattern_options = stacked(
    setting_option(AnalyzeSettings, "distance", "--distance/--no-distance", show_default=True,
                   help="Jensen-Shannon distances between heads (groups, head map, duplicate heads)."),
    setting_option(AnalyzeSettings, "map_sequences", "--map-sequences", show_default=True,
                   help="Sequences (the first of the corpus) in the all-heads distance behind the map and groups."),
    setting_option(AnalyzeSettings, "circuits", "--circuits/--no-circuits", show_default=True,
                   help="Decoders: induction / duplicate-token probe on repeated random tokens, attention sinks."),
    setting_option(AnalyzeSettings, "health", "--health-threshold", multiple=True, metavar="CHECK=VALUE",
                   callback=parse_health,
                   help="Override a health-check threshold, e.g. saturated=0.99 (saturated, uniform, collapsed, "
                        "duplicates; repeatable)."),
)

#: --norm, --labels-by: value-weighted statistics (probe.capture.values).
_norm_options = stacked(
    setting_option(AnalyzeSettings, "value_weighted", "--norm/--no-norm", show_default=True,
                   help="Value-weighted statistics (Kobayashi et al. 2020): every statistic also on the attention "
                        "map weighted by the norm of each key's value vector carried through the head's output "
                        "projection (heads.csv: <statistic>_by_norm, norm_mass)."),
    setting_option(AnalyzeSettings, "labels_by", "--labels-by", show_default=True,
                   help="Label heads by their attention statistics (weight) or by their value-weighted ones (norm)."),
)

#: --coref, --syntax: annotated text (probe.linguistic).
_annotation_options = stacked(
    setting_option(AnalyzeSettings, "coref", "--coref", is_flag=False, flag_value="builtin", metavar="[FILE|builtin]",
                   help="Score coreference heads on a GAP TSV file (no value or 'builtin': the built-in probe set); "
                        "the examples are the analysed text. Writes coref.csv."),
    setting_option(AnalyzeSettings, "syntax", "--syntax", type=click.Path(dir_okay=False, path_type=str),
                   metavar="FILE.conllu", help="Score syntactic heads on the dependency trees of a CoNLL-U file; "
                                               "its sentences are the analysed text. Writes syntax.csv."),
)


@main.command("analyze")
@model_option
@_input_options
@image_options
@audio_options
@setting_option(AnalyzeSettings, "batch_size", "--batch-size", "-b", show_default=True)
@setting_option(AnalyzeSettings, "max_length", "--max-length",
                help="Truncate sequences to this many tokens, at most the model's limit (above it: an error) "
                    "[default: the model's limit].")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True,
              help="Replace probe's own files in an --out folder probe wrote; other files are kept.")
@setting_option(AnalyzeSettings, "examples", "--examples", show_default=True,
                help="Sequences whose attention maps are kept for the report.")
@setting_option(AnalyzeSettings, "thresholds", "--threshold", multiple=True, metavar="LABEL=VALUE",
                callback=parse_thresholds,
                help="Override a label threshold, e.g. previous-token=0.4 (repeatable).")
@setting_option(AnalyzeSettings, "parse_special_tokens", "--parse-special-tokens", is_flag=True,
                help="Let typed special-token strings such as '[SEP]' become special tokens "
                    "(default: typed text is text).")
@setting_option(AnalyzeSettings, "rollout", "--rollout/--no-rollout", show_default=True,
                help="Attention rollout and flow (flow: the reported row, texts of at most 64 tokens) of the first "
                    "3 kept examples, side by side with the weights, in the report.")
@setting_option(AnalyzeSettings, "verify", "--verify", is_flag=True,
                help="Also verify the from-scratch attention against the model and add it to the report.")
@setting_option(AnalyzeSettings, "query_block", "--query-block", metavar="N",
                help="Capture attention N query rows at a time (flat memory at long lengths; docs/length.md); 0: "
                    "whole maps always. [default: automatic: batches longer than 1024 tokens]. Analyses that need "
                    "whole maps are left out of block-captured batches (with N >= 1: not run).")
@_pattern_options
@_norm_options
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
@_annotation_options
@placement_options
@user_errors
def analyze_command(model_name, texts, corpus, pairs, generate, limit, images, image_folder, image_size,
                    audio, transcripts, batch_size, max_length, out, force, examples,
                    thresholds, parse_special_tokens, rollout, verify, query_block, distance, map_sequences,
                    circuits, health, value_weighted, labels_by, progress, coref, syntax, device, dtype,
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
    settings = build(AnalyzeSettings, locals())  # before torch is imported: at once
    check_files((corpus, "corpus file"), (pairs, "pairs file"), (syntax, "CoNLL-U file"),
                (None if coref in (None, "builtin") else coref, "GAP file"))
    counted = _check_input(texts, corpus, pairs, limit, audio)  # also before torch: a streamed file's count
    from ..entries.analyze import analyze_run, start_up_note

    start = started()
    timings = {"startup_s": time.perf_counter() - start}
    run = analyze_run(model_name, settings=settings, out=out, force=force, device=device, dtype=dtype,
                      device_map=device_map, counted=counted,
                      console=command_console(progress, case=verify_progress, timings=timings, start=start))
    if run.folder is None:
        return  # rank 0 writes the one report
    summary(run.result, run.result.results.get("verification"), run.annotated, run.loading_notes)
    if started_as_command() and (note := start_up_note(timings["startup_s"])):  # in a test runner or notebook
        click.echo(note)  # the "start-up" is the host process's age: only the command's own is explained
    report_line(run.folder)


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
