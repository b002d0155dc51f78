"""The ``probe`` command line: a thin layer over the Python API.

Errors a user can cause end in one line (``Error: ...``) on stderr and exit status 1; a malformed
option (unknown option, a value out of range) is one line too and exits with status 2, as click's
usage errors do. The library never imports click; only this module does.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import sys
import time

import click

from . import IMPORT_STARTED, validate
from .errors import InputError, ProbeError
from .models import DEFAULT_MODEL
from .reference.mutants import MUTANTS
from .util import process_age


def user_errors(fn):
    """Turn :class:`ProbeError` into click's one-line ``Error: ...`` with exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ProbeError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


class ProbeGroup(click.Group):
    """A click group whose usage errors are one line (``Error: ... (see 'probe analyze --help')``)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"Error: {exc.format_message()}{where}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _setup_logging() -> None:
    """probe's own notes go to stderr as 'note: ...'; other libraries' log lines stay quiet."""
    log = logging.getLogger("probe")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("note: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


@click.group(cls=ProbeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="probe")
def main() -> None:
    """probe: see what the attention heads of a pretrained transformer do."""
    _setup_logging()


@main.command("models")
def models_command() -> None:
    """List model aliases and which embedded models are installed."""
    from .models import list_models

    click.echo(f"{'alias':<18}{'kind':<10}{'status':<15}target")
    for row in list_models():
        if row["kind"] == "embedded":
            status = "installed" if row["installed"] else "not installed"
        else:
            status = "Hub"
        default = " (default)" if row["default"] else ""
        click.echo(f"{row['alias'] + default:<18}{row['kind']:<10}{status:<15}{row['target']}")
        if row["kind"] == "embedded" and not row["installed"]:
            click.echo(f"{'':<43}install: {row['install']}")
    click.echo("Also accepted: any Hugging Face Hub id, a local model folder, or a .gguf file.")


def _parse_thresholds(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in values:
        label, sep, number = item.partition("=")
        try:
            value = float(number)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected LABEL=VALUE with a number VALUE") from None
        if not sep:
            raise click.BadParameter(f"{item!r}: expected LABEL=VALUE")
        out[label] = value
    try:
        return validate.thresholds(out)
    except ProbeError as exc:
        raise click.BadParameter(str(exc)) from None


_DTYPES = ("float32", "bfloat16", "float16")


def _placement_options(fn):
    """--device, --dtype and --device-map (where and how the weights sit)."""
    fn = click.option("--device-map", type=click.Choice(["auto"]), default=None,
                      help="Spread the layers over the devices present, offloading to CPU and disk what "
                           "does not fit (accelerate).")(fn)
    fn = click.option("--dtype", type=click.Choice(_DTYPES), default="float32", show_default=True,
                      help="Parameter dtype to load the model in.")(fn)
    return click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default=None,
                        help="Where the model runs [default: cpu; auto: cuda when present].")(fn)


def _parse_health(ctx, param, values: tuple[str, ...]) -> dict[str, float]:
    from .patterns.health import health_thresholds

    out = {}
    for item in values:
        name, sep, number = item.partition("=")
        try:
            out[name] = float(number)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected CHECK=VALUE with a number VALUE") from None
        if not sep:
            raise click.BadParameter(f"{item!r}: expected CHECK=VALUE")
    try:
        health_thresholds(out)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return out


def _model_option(fn):
    return click.option("--model", "-m", "model_name", default=DEFAULT_MODEL, show_default=True,
                        help="Alias (probe models), Hugging Face Hub id, local folder or .gguf file.")(fn)


def _check_seq2seq_input(lm, pairs, generate, annotated) -> bool:
    """Whether ``lm`` is an encoder-decoder model, after checking that its input fits it.

    Raises:
        InputError: --generate on another model; --coref/--syntax on an encoder-decoder model.
    """
    seq2seq = lm.spec.encoder_decoder
    if generate is not None and not seq2seq:
        raise InputError(f"--generate writes targets for encoder-decoder models (BART, Marian, T5); {lm.name} is "
                         "not one")
    if seq2seq and annotated is not None:
        raise InputError("--coref and --syntax score one-stack models (encoders, decoders); "
                         f"{lm.name} is an encoder-decoder model")
    return seq2seq


@main.command("analyze")
@_model_option
@click.option("--text", "-t", "texts", multiple=True, help="A sequence to analyze (repeatable).")
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Plain text (one sequence a line) or CoNLL-U (# text = lines).")
@click.option("--pairs", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Pairs, one a line, the two segments separated by a tab: sentence pairs for encoders (the "
                   "Kovaleva 'block' type needs two segments), source and target for encoder-decoder models.")
@click.option("--generate", type=click.IntRange(min=1), default=None, metavar="N",
              help="Encoder-decoder models: the model writes each source's target (greedy, at most N new "
                   "tokens); the sources come from --text or --corpus.")
@click.option("--limit", "-n", type=int, default=None, callback=validate.click_callback(validate.limit),
              help="Use at most N sequences (with --coref/--syntax: N of each file).")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--max-length", type=click.IntRange(min=2), default=None,
              help="Truncate sequences to this many tokens [default: the model's limit].")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True, help="Overwrite probe's files in an existing --out folder.")
@click.option("--examples", type=click.IntRange(min=0, max=20), default=3, show_default=True,
              help="Sequences whose attention maps are kept for the report.")
@click.option("--threshold", "thresholds", multiple=True, metavar="LABEL=VALUE", callback=_parse_thresholds,
              help="Override a label threshold, e.g. previous-token=0.4 (repeatable).")
@click.option("--parse-special-tokens", is_flag=True,
              help="Let typed special-token strings such as '[SEP]' become special tokens "
                   "(default: typed text is text).")
@click.option("--verify", "run_verify", is_flag=True,
              help="Also verify the from-scratch attention against the model and add it to the report.")
@click.option("--distance/--no-distance", default=True, show_default=True,
              help="Jensen-Shannon distances between heads (groups, head map, duplicate heads).")
@click.option("--map-sequences", type=click.IntRange(min=1), default=200, show_default=True,
              help="Sequences (the first of the corpus) in the all-heads distance behind the map and groups.")
@click.option("--circuits/--no-circuits", default=True, show_default=True,
              help="Decoders: induction / duplicate-token probe on repeated random tokens, attention sinks.")
@click.option("--health-threshold", "health", multiple=True, metavar="CHECK=VALUE", callback=_parse_health,
              help="Override a health-check threshold, e.g. saturated=0.99 (saturated, uniform, collapsed, "
                   "duplicates; repeatable).")
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
@click.option("--coref", is_flag=False, flag_value="builtin", default=None, metavar="[FILE|builtin]",
              help="Score coreference heads on a GAP TSV file (no value or 'builtin': the built-in probe set); "
                   "the examples are the analysed text. Writes coref.csv.")
@click.option("--syntax", "syntax_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="FILE.conllu", help="Score syntactic heads on the dependency trees of a CoNLL-U file; its "
                                          "sentences are the analysed text. Writes syntax.csv.")
@_placement_options
@user_errors
def analyze_command(model_name, texts, corpus, pairs, generate, limit, batch_size, max_length, out, force, examples,
                    thresholds, parse_special_tokens, run_verify, distance, map_sequences, circuits, health,
                    progress, coref, syntax_file, device, dtype, device_map) -> None:
    """Measure every attention head on text and write an HTML report, heads.csv and run.json.

    Without --text, --corpus or --pairs, a small built-in English sample is used. A corpus or a
    pairs file is read as it is analysed (memory does not grow with it). With --coref and/or
    --syntax, the annotated text is the analysed text (--limit applies to each file) and cannot be
    combined with --text, --corpus or --pairs. Also measured: head distances and groups, Kovaleva
    pattern types and health checks, and on decoders the induction / duplicate-token probe; the
    options --no-distance and --no-circuits turn off the costly parts. Under torchrun or accelerate
    launch, each process analyses its share of the corpus and rank 0 writes the one report.
    """
    from contextlib import nullcontext

    from . import distributed
    from .analysis import analyze
    from .models import load_model
    from .patterns import circuit_probe, pattern_accumulators
    from .patterns.circuits import SINK_TEXTS
    from .report import prepare_run_dir, write_run

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    timings = {"startup_s": time.perf_counter() - started}
    t = time.perf_counter()
    if generate is not None and pairs:
        raise InputError("give either --pairs (sources and targets) or --generate (sources only), not both")
    seqs, source, annotated = _analysis_input(texts, corpus, pairs, coref, syntax_file, limit)
    prepare_run_dir(out, model_name, force)  # fail before loading a model if the folder is taken
    timings["input_s"] = time.perf_counter() - t

    world = distributed.detect()
    import torch

    lm = load_model(model_name, dtype=getattr(torch, dtype), device=device, device_map=device_map)
    timings["model_load_s"] = lm.load_seconds
    show = (sys.stderr.isatty() if progress is None else progress) and (world is None or world.main)
    how_many = f"{len(seqs)} sequences" if hasattr(seqs, "__len__") else "the sequences"
    share = (f", process {world.rank} of {world.size}: sequences {world.rank}, {world.rank + world.size}, ..."
             if world else "")
    stacks = " + ".join(f"{sum(1 for s in lm.sites if s.stack == st and s.kind == 'self')} {st}"
                        for st in ("encoder", "decoder")) if lm.spec.encoder_decoder else lm.geometry.n_layers
    click.echo(f"Analyzing {how_many} ({source}{share}) with {lm.name}: "
               f"{stacks} layers x {lm.geometry.n_heads} heads", err=True)
    seq2seq = _check_seq2seq_input(lm, pairs, generate, annotated)
    finished, skipped = [], []
    if circuits and lm.causal and not seq2seq and (world is None or world.main):  # rank 0 alone reports the probe
        t = time.perf_counter()
        sink_texts, seqs = _first(seqs, SINK_TEXTS)
        try:
            finished.append(circuit_probe(lm, sink_texts=sink_texts))
        except ValueError as exc:  # e.g. a model whose limit is below the probe's 2 x 25 tokens
            skipped.append(f"decoder circuit probe skipped: {exc}")
        timings["circuits_s"] = time.perf_counter() - t
    extra = [] if seq2seq else pattern_accumulators(lm, distance=distance, map_sequences=map_sequences,
                                                     thresholds=health)
    if seq2seq:
        skipped.append("head distances, groups, pattern types, padding checks and the circuit probe cover "
                       "one-stack models; not run for this encoder-decoder model")
    if annotated is not None:
        # the readers' own left-out rows are counted once, by rank 0 (the accumulators are summed over ranks)
        extra += annotated.accumulators(lm, prior=world is None or world.main)
    with distributed.process_group(world) if world else nullcontext():
        result = analyze(lm, distributed.shard(seqs, world) if world else seqs, batch_size=batch_size,
                         max_length=max_length, n_examples=examples, thresholds=thresholds, progress=show,
                         parse_special_tokens=parse_special_tokens, accumulators=extra, finished=finished,
                         reduce=distributed.reducer(world), generate=generate)
    if world is not None and not world.main:
        return  # rank 0 writes the one report
    timings["analyze_s"] = result.timings["analyze_s"]
    result.notes.extend(skipped)
    verification = None
    if run_verify:
        from .verification import verify

        t = time.perf_counter()
        verification = verify(lm, progress=_verify_progress if show else None).to_json()
        timings["verify_s"] = time.perf_counter() - t
    result.settings["input"] = source
    path = write_run(result, lm.tokenizer, out, force=force, verification=verification,
                     timings=timings, started=started)
    counts = ", ".join(f"{n} {label}" for label, n in result.label_counts().items())
    trunc = f", {result.counts['truncated']} truncated" if result.counts["truncated"] else ""
    verdict = "" if verification is None else f"; verify {'PASS' if verification['passed'] else 'FAIL'}"
    t = result.timings
    parts = [("start-up", t["startup_s"] + t["input_s"]), ("model load", t["model_load_s"])]
    if "circuits_s" in t:
        parts.append(("circuit probe", t["circuits_s"]))
    parts.append(("analysis", t["analyze_s"]))
    if "verify_s" in t:
        parts.append(("verify", t["verify_s"]))
    parts += [("report", t["report_s"]), ("other", t["other_s"])]
    shown = _rounded_parts([v for _, v in parts], t["total_s"])
    click.echo(f"{len(result.heads)} heads ({counts}) from {result.counts['sequences']} sequences, "
               f"{result.counts['tokens']} tokens{trunc}{verdict} in {t['total_s']:.1f} s "
               f"({', '.join(f'{name} {value:.1f} s' for (name, _), value in zip(parts, shown))})")
    if annotated is not None:
        from .linguistic.report import summary_lines

        for line in summary_lines(result):
            click.echo(line)
    for note in result.notes:
        if note not in lm.notes:  # loading notes (e.g. "loaded the cached copy") stay in run.json
            click.echo(f"note: {note}", err=True)
    click.echo(f"Report: {path / 'index.html'}")


def _analysis_input(texts, corpus, pairs, coref, syntax_file, limit):
    """The texts of ``probe analyze`` (a list, or a stream for --corpus and --pairs), a description
    of where they come from, and the annotated input of --coref/--syntax (or None).

    Raises:
        InputError: two kinds of input given, or an input that cannot be read.
    """
    from .corpus import check_texts, iter_corpus, iter_pairs, peek, sample_texts
    from .errors import InputError

    if sum(bool(x) for x in (texts, corpus, pairs)) > 1:
        raise InputError("give either --text, --corpus or --pairs, not two of them")
    if coref is not None or syntax_file is not None:
        if texts or corpus or pairs:
            raise InputError("--coref and --syntax analyse their own annotated text; leave out --text, --corpus "
                             "and --pairs")
        from .linguistic import annotated_input

        annotated = annotated_input(coref, syntax_file, limit)
        return annotated.texts, annotated.source, annotated
    if corpus:
        return peek(iter_corpus(corpus, limit)), corpus, None
    if pairs:
        return peek(iter_pairs(pairs, limit)), pairs, None
    if texts:
        return check_texts(list(texts), limit), "--text", None
    return check_texts(sample_texts(), limit), "built-in sample", None


def _first(seqs, n: int):
    """The first ``n`` texts of ``seqs`` and ``seqs`` itself, whole (a stream is re-chained)."""
    if hasattr(seqs, "__len__"):
        return list(seqs[:n]), seqs
    head = list(itertools.islice(seqs, n))
    return head, itertools.chain(head, seqs)


def _rounded_parts(values: list[float], total: float) -> list[float]:
    """Round parts to 0.1 s so that the shown parts add up to the shown total (largest remainder)."""
    tenths = [v * 10 for v in values]
    shown = [int(x) for x in tenths]
    missing = round(total * 10) - sum(shown)
    for i in sorted(range(len(values)), key=lambda i: tenths[i] - shown[i], reverse=True)[:max(0, missing)]:
        shown[i] += 1
    return [x / 10 for x in shown]


# ---------------------------------------------------------------------------------------------
# probe verify
# ---------------------------------------------------------------------------------------------

def format_table(result) -> str:
    """The human-readable verification report: one row per layer, then the output and the cases."""
    lines = [f"probe verify: {result.model} ({result.dtype}), atol {result.atol:g}"
             + (f", rtol {result.rtol:g}" if result.rtol else "")
             + (f", mutant {result.mutant}" if result.mutant else "")]
    lines.append(f"{'layer':>5}  {'attn max abs':>12}  {'attn max rel':>12}  {'hidden max abs':>14}  "
                 f"{'hidden max rel':>14}  result")
    for r in result.per_layer:
        lines.append(f"{r.layer:>5}  {r.attn_max_abs:>12.3e}  {r.attn_max_rel:>12.3e}  {r.hidden_max_abs:>14.3e}  "
                     f"{r.hidden_max_rel:>14.3e}  {'PASS' if r.passed else 'FAIL'}")
    lines.append(f"output ({result.output_name}): max abs {result.output_max_abs:.3e}, "
                 f"max rel {result.output_max_rel:.3e}")
    lines.append("cases:")
    for c in result.cases:
        extra = ""
        if c.padding_max_abs is not None:
            extra = f"; padded vs alone {c.padding_max_abs:.3e} (batching noise {c.batching_noise:.3e})"
        lines.append(f"  {c.name:<18} {str(c.shape):<11} max abs {c.max_abs_diff:.3e}  {c.seconds:6.1f} s  "
                     f"{'PASS' if c.passed else 'FAIL'}  ({c.description}{extra})")
    for note in result.notes:
        lines.append(f"note: {note}")
    lines.append(f"{'PASS' if result.passed else 'FAIL'}: max abs diff {result.max_abs_diff:.3e}")
    return "\n".join(lines)


def _verify_progress(index: int, total: int, name: str, result) -> None:
    if result is None:
        click.echo(f"verify: case {index + 1}/{total} {name} ...", err=True)
    else:
        click.echo(f"verify: case {index + 1}/{total} {name}: {'PASS' if result.passed else 'FAIL'} "
                   f"in {result.seconds:.1f} s", err=True)


@main.command("verify")
@_model_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--atol", type=float, default=None,
              callback=validate.click_callback(lambda v: validate.tolerance("--atol", v)),
              help="Absolute tolerance [default: 1e-05 for float32, 0.01 for bfloat16/float16].")
@click.option("--rtol", type=float, default=0.0, show_default=True,
              callback=validate.click_callback(lambda v: validate.tolerance("--rtol", v)), help="Relative tolerance.")
@click.option("--mutant", type=click.Choice(sorted(MUTANTS)),
              default=None, help="Verify a deliberately broken attention instead (expected to FAIL).")
@click.option("--dtype", type=click.Choice(_DTYPES), default="float32", show_default=True,
              help="Parameter dtype to load the model in.")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default=None,
              help="Where the model runs [default: cpu; auto: cuda when present].")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Say which case runs (on stderr).")
@user_errors
def verify_command(model_name: str, as_json: bool, atol: float | None, rtol: float, mutant: str | None,
                   dtype: str, device: str | None, progress: bool) -> None:
    """Check that probe's from-scratch attention reproduces the model (exit status 1 on FAIL)."""
    import torch

    from .models import load_model
    from .reference import mutant_applies
    from .verification import BF16_ATOL, FP32_ATOL, verify

    if atol is None:
        atol = FP32_ATOL if dtype == "float32" else BF16_ATOL
    lm = load_model(model_name, dtype=getattr(torch, dtype), device=device)
    if mutant is not None:
        applies, why = mutant_applies(mutant, lm)
        if not applies:
            raise ProbeError(f"mutant {mutant!r} cannot change {model_name}: {why}")
    result = verify(lm, atol=atol, mutant=mutant, rtol=rtol, progress=_verify_progress if progress else None)
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else format_table(result))
    if not result.passed:
        click.get_current_context().exit(1)


# ---------------------------------------------------------------------------------------------
# probe compare
# ---------------------------------------------------------------------------------------------

@main.command("compare")
@click.argument("runs", nargs=-1, type=click.Path(file_okay=False, path_type=str))
@click.option("--model", "-m", "models", multiple=True,
              help="Analyze this model (give two) on one corpus instead of comparing run folders.")
@click.option("--text", "-t", "texts", multiple=True, help="A sequence for --model runs (repeatable).")
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Corpus for --model runs [default: the built-in sample].")
@click.option("--limit", "-n", type=int, default=None, callback=validate.click_callback(validate.limit),
              help="Use at most N sequences.")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--max-length", type=click.IntRange(min=2), default=None, help="Truncate sequences to this many tokens.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Comparison folder [default: a new reports/compare-<A>-vs-<B>-<time>].")
@click.option("--force", is_flag=True, help="Overwrite probe's files in an existing --out folder.")
@click.option("--top", type=click.IntRange(min=0, max=20), default=4, show_default=True,
              help="Most changed heads drawn side by side.")
@user_errors
def compare_command(runs, models, texts, corpus, limit, batch_size, max_length, out, force, top) -> None:
    """Compare two runs head by head: RUN_A RUN_B (run folders), or --model A --model B on one corpus.

    Writes index.html, compare.csv (layer, head, delta_<statistic> = B - A, labels, status) and
    compare.json. Runs of different depths are aligned by relative depth (the report says how).
    """
    from .compare import compare_runs, load_run, write_compare
    from .report import prepare_run_dir

    if bool(runs) == bool(models) or (runs and len(runs) != 2) or (models and len(models) != 2):
        raise click.UsageError("give two run folders (RUN_A RUN_B) or two models (--model A --model B)")
    if runs and (texts or corpus or limit):
        raise click.UsageError("--text, --corpus and --limit go with --model, not with run folders")
    if runs:
        a, b = load_run(runs[0]), load_run(runs[1])
        prepare_run_dir(out, "compare", force)
        tokenizers = (None, None)
    else:
        a, b, tokenizers = _analyze_pair(models, texts, corpus, limit, batch_size, max_length, out, force)
    path = write_compare(a, b, out, force=force, top=top, tokenizers=tokenizers)
    df = compare_runs(a, b)
    changed, gone = int(df["label_changed"].sum()), int(df["status"].str.startswith("removed").sum())
    deltas = df.filter(like="delta_").abs().max().dropna()
    biggest = "" if deltas.empty else f"; largest |difference|: {deltas.idxmax()[6:]} {deltas.max():.3g}"
    both = int((df["status"] == "both").sum())
    click.echo(f"Compared {a.model.get('name')} (A) with {b.model.get('name')} (B): {both} heads in both, "
               f"{changed} label(s) changed, {gone} removed{biggest}")
    for note in df.attrs["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"Report: {path / 'index.html'}")


def _analyze_pair(models, texts, corpus, limit, batch_size, max_length, out, force):
    """Analyze two models on the same sequences (``probe compare --model A --model B``)."""
    from .analysis import analyze
    from .corpus import check_texts, read_corpus, sample_texts
    from .errors import InputError
    from .models import load_model
    from .report import prepare_run_dir

    if texts and corpus:
        raise InputError("give either --text or --corpus, not both")
    if corpus:
        seqs, source = read_corpus(corpus, limit), corpus
    elif texts:
        seqs, source = check_texts(list(texts), limit), "--text"
    else:
        seqs, source = check_texts(sample_texts(), limit), "built-in sample"
    prepare_run_dir(out, "compare", force)  # fail before loading a model if the folder is taken
    results, tokenizers = [], []
    for name in models:
        lm = load_model(name)
        click.echo(f"Analyzing {len(seqs)} sequences ({source}) with {lm.name}: "
                   f"{lm.geometry.n_layers} layers x {lm.geometry.n_heads} heads", err=True)
        result = analyze(lm, seqs, batch_size=batch_size, max_length=max_length)
        result.settings["input"] = source
        results.append(result)
        tokenizers.append(lm.tokenizer)
    return results[0], results[1], tuple(tokenizers)


# ---------------------------------------------------------------------------------------------
# probe prune
# ---------------------------------------------------------------------------------------------

def _orders(ctx, param, value: str) -> list[str]:
    from .pruning.curves import ORDERS

    orders = [o.strip() for o in value.split(",") if o.strip()]
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders or len(set(orders)) != len(orders):
        raise click.BadParameter(f"{value!r}: a comma-separated list of distinct orders from {', '.join(ORDERS)}")
    return orders


@main.command("prune")
@_model_option
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Plain text (one sequence a line) or CoNLL-U [default: the built-in sample].")
@click.option("--limit", "-n", type=int, default=None, callback=validate.click_callback(validate.limit),
              help="Use at most N sequences.")
@click.option("--objective", type=click.Choice(["clm", "mlm", "fidelity", "classification"]), default=None,
              help="What pruning must not hurt [default: chosen from the model, see above].")
@click.option("--labels", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="classification: one label (class id or name) per line, in corpus order.")
@click.option("--order", "orders", default="importance,redundancy,random", show_default=True, callback=_orders,
              help="Curves to run; the first one's heads are removed from the pruned copy.")
@click.option("--steps", type=int, default=10, show_default=True,
              callback=validate.click_callback(lambda v: validate.positive_int("--steps", v)),
              help="Pruning steps (points after step 0).")
@click.option("--fraction", type=float, default=0.5, show_default=True,
              callback=validate.click_callback(lambda v: validate.fraction("--fraction", v)),
              help="Share of all heads pruned by the last step, in (0, 1).")
@click.option("--seeds", type=int, default=3, show_default=True,
              callback=validate.click_callback(lambda v: validate.positive_int("--seeds", v, 3)),
              help="Random orders (at least 3).")
@click.option("--save-pruned", "save_to", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Write the model with those heads removed from its weights to this new folder.")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True, help="Overwrite probe's files in an existing --out / --save-pruned folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              callback=validate.click_callback(lambda v: validate.positive_int("--batch-size", v)))
@click.option("--max-length", type=int, default=None, help="Token limit per sequence [default: the model's].")
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@user_errors
def prune_command(model_name, corpus, limit, objective, labels, orders, steps, fraction, seeds, save_to, out, force,
                  as_json, batch_size, max_length, progress) -> None:
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
    from pathlib import Path

    from .corpus import check_texts, read_corpus, sample_texts
    from .models import load_model
    from .pruning.run import prune_run, read_labels
    from .pruning.saving import check_target
    from .report import prepare_run_dir

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    seqs, source = (read_corpus(corpus, limit), corpus) if corpus else (check_texts(sample_texts(), limit), "sample")
    label_list = read_labels(labels, len(seqs)) if labels else None
    prepare_run_dir(out, model_name, force)  # fail before loading a model if a folder is taken
    if save_to:
        check_target(Path(save_to), force)
    head = {"mlm": "mlm", "classification": "classification", None: "auto"}.get(objective)
    lm = load_model(model_name, head=head)
    show = sys.stderr.isatty() if progress is None else progress
    click.echo(f"Pruning {lm.name} ({lm.geometry.n_layers} x {lm.geometry.n_heads} heads) on {len(seqs)} sequences "
               f"({source}): {', '.join(orders)}, {steps} steps to {fraction:.0%}", err=True)
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
        click.echo(f"{result.objective} ({result.unit}) on {result.split['held_out']} held-out sequences: "
                   f"{result.curves['value'].iloc[0]:.4g} unpruned; at {last['fraction'].iloc[0]:.0%} pruned: "
                   f"{', '.join(parts)}")
        click.echo(f"pruned copy ({len(result.removed)} heads removed): {result.params_before:,} -> "
                   f"{result.pruned_params:,} parameters, forward {result.speedup:.2f}x, "
                   f"max |removed - gated| {result.max_abs_diff:.2g}")
        click.echo(f"Report: {path / 'index.html'}")
        if save_to:
            click.echo(f"Pruned model: {save_to}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)


def entry() -> None:
    """The ``probe`` console script and ``python -m probe``: run the command, then leave at once.

    Tearing down the interpreter after torch and transformers are loaded takes about a second on
    two cores and would be wall time the user waits for nothing, so after the command has written
    everything and flushed its output, the process exits without that teardown.
    """
    code = 0
    try:
        main(prog_name="probe")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            click.echo(str(exc.code), err=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
