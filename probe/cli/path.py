"""``probe path``: path patching of sender heads into chosen receivers (a head's q, k or v input, or the logits)."""

from __future__ import annotations

import click

from ..settings import PathSettings
from ..util import fixed
from .group import main, user_errors
from .options import build, model_option, model_placement, run_folder_options, setting_option
from .start import Folder, command_console, read_pairs
from .summary import report_line


@main.command("path", short_help="Path patching of sender heads into receivers (q, k, v or logits).")
@model_option(default="smollm2")  # path patching runs on decoders: the embedded decoder
@setting_option(PathSettings, "senders", "--senders", required=True, metavar="L5H1,L5H2",
                help="Sender heads, comma-separated (layer and head, 0-based).")
@setting_option(PathSettings, "receivers", "--receivers", required=True, metavar="logits|L9H6.q,...",
                help="Receivers, comma-separated: logits, or a head's query, key or value input (L9H6.q, L9H6.k, "
                   "L9H6.v; k and v of a grouped model name the key/value head serving that query head, or "
                   "L9KV1.k).")
@setting_option(PathSettings, "pairs", "--pairs", type=click.Path(dir_okay=False, path_type=str),
                help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@run_folder_options
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def path_command(model_name, senders, receivers, pairs, out, force, progress, device=None, dtype=None) -> None:
    """Path patching (Wang et al. 2022): the clean run with the sender heads' outputs from the corrupted
    run and every other head frozen at its clean output, read only by the receivers; the change of the
    logit difference answer - wrong, for each sender into each receiver and for all together. Norms on
    a receiver's input are recomputed from the patched stream. Pre-norm models the circuit graph fits
    (GPT-2, LLaMA, Qwen, Mistral, Phi-3, GPT-NeoX, Falcon, ModernBERT ...).

    \b
    Pairs file: one pair a line, four tab-separated fields
      clean  corrupted  answer  wrong
    """
    settings = build(PathSettings, locals())
    given = read_pairs(settings.pairs)  # before torch is imported: a bad pairs file is answered at once
    from ..entries.pairs import run_path

    folder = Folder(out, force)
    console = command_console(progress, folder, estimate=True)  # the other paths' time, after the first
    run = run_path(model_name, settings, pairs=given, console=console, device=device, dtype=dtype)
    path = run.save(folder.path, force=force)
    result = run.measured
    click.echo(f"LD clean {result.ld_clean:.4g}, corrupted {result.ld_corrupted:.4g}; path patching (norms on the "
               "receivers' inputs recomputed from the patched stream):")
    for r in result.frame.itertuples():
        share = "" if r.share != r.share else f" (share {fixed(r.share, 3)})"
        click.echo(f"  {r.senders} -> {r.receivers}: {r.effect:.4g}{share}")
    if (result.frame["effect"] == 0).any():
        click.echo("  (an effect of exactly 0: a receiver at or below its sender's layer reads nothing the sender "
                   "writes)")
    report_line(path)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
