"""``probe path``: path patching of sender heads into chosen receivers (a head's q, k or v input, or the logits)."""

from __future__ import annotations

import sys
import time

import click

from .. import IMPORT_STARTED
from ..util import fixed, process_age
from .group import main, user_errors
from .options import click_callback, model_option, model_placement, run_folder_options
from .pairstart import pair_input, pairs_and_model


def _names(option: str, text: str) -> None:
    """The form of a --senders or --receivers list, before the model loads (a usage error: exit 2)."""
    from ..bounds import head_names  # no heavy library: answered before torch is imported

    head_names(option, text)


@main.command("path")
@model_option(default="smollm2")  # path patching runs on decoders: the embedded decoder
@click.option("--senders", required=True, metavar="L5H1,L5H2",
              callback=click_callback(lambda v: _names("--senders", v)),
              help="Sender heads, comma-separated (layer and head, 0-based).")
@click.option("--receivers", required=True, metavar="logits|L9H6.q,...",
              callback=click_callback(lambda v: _names("--receivers", v)),
              help="Receivers, comma-separated: logits, or a head's query, key or value input (L9H6.q, L9H6.k, "
                   "L9H6.v; k and v of a grouped model name the key/value head serving that query head, or "
                   "L9KV1.k).")
@click.option("--pairs", "pairs_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@run_folder_options
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def path_command(model_name, senders, receivers, pairs_file, out, force, progress, device=None, dtype=None) -> None:
    """Path patching (Wang et al. 2022): the clean run with the sender heads' outputs from the corrupted
    run and every other head frozen at its clean output, read only by the receivers; the change of the
    logit difference answer - wrong, for each sender into each receiver and for all together. Norms on
    a receiver's input are recomputed from the patched stream. Pre-norm models the circuit graph fits
    (GPT-2, LLaMA, Qwen, Mistral, Phi-3, GPT-NeoX, Falcon, ModernBERT ...).

    \b
    Pairs file: one pair a line, four tab-separated fields
      clean  corrupted  answer  wrong
    """
    given = pair_input(pairs_file)  # before torch is imported: a bad pairs file is answered at once
    from ..circuits.names import check_reads

    check_reads(senders, receivers)  # what the names decide: at once, before torch is imported
    from ..circuits.path_run import check_arguments, path_run
    from ..circuits.wiring import check_kind
    from ..loading.models import peek_config

    check_arguments(senders, receivers, peek_config(model_name))  # and the config: before the weights

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    lm, pairs, source, out = pairs_and_model(model_name, pairs_file, out, force, dtype=dtype, device=device,
                                             head="auto", given=given,
                                             kind_check=lambda lm: check_kind(lm, "path patching"))  # pre-norm models
    show = sys.stderr.isatty() if progress is None else progress
    result, path = path_run(lm, senders, receivers, pairs, out=out, force=force, source=source, progress=show,
                            timings={"model_load_s": lm.load_seconds}, started=started)
    click.echo(f"LD clean {result.ld_clean:.4g}, corrupted {result.ld_corrupted:.4g}; path patching (norms on the "
               "receivers' inputs recomputed from the patched stream):")
    for r in result.frame.itertuples():
        share = "" if r.share != r.share else f" (share {fixed(r.share, 3)})"
        click.echo(f"  {r.senders} -> {r.receivers}: {r.effect:.4g}{share}")
    if (result.frame["effect"] == 0).any():
        click.echo("  (an effect of exactly 0: a receiver at or below its sender's layer reads nothing the sender "
                   "writes)")
    click.echo(f"Report: {path / 'index.html'}")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
