"""``probe circuit``: edge attribution over the graph of heads and MLPs (EAP, EAP-IG), the circuit of the
top-scoring edges and its faithfulness against random circuits."""

from __future__ import annotations

import sys
import time

import click

from .. import IMPORT_STARTED, bounds
from ..errors import InputError
from ..util import fixed, plural, process_age
from .group import main, user_errors
from .options import click_callback, model_option, model_placement, run_folder_options
from .pairstart import pair_input, pairs_and_model


def _shares(text: str) -> tuple[float, ...]:
    """``--shares``: comma-separated numbers in (0, 1]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise InputError(f"--shares must be comma-separated numbers in (0, 1], got {text!r}")
    return tuple(bounds.fraction("--shares", v, closed_high=True) for v in values)


@main.command("circuit")
@model_option(default="smollm2")  # circuits run on decoders: the embedded decoder
@click.option("--pairs", "pairs_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@click.option("--method", type=click.Choice(["eap-ig", "eap"]), default="eap-ig", show_default=True,
              help="eap: gradient at the clean run; eap-ig: averaged over --steps points from corrupted to clean.")
@click.option("--steps", type=int, default=5, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--steps", v)),
              help="EAP-IG's integration points m (alpha = k/m, k = 1..m; see --points).")
@click.option("--points", type=click.Choice(["right", "left"]), default="right", show_default=True,
              help="EAP-IG's points: right, alpha = k/m for k = 1..m (the clean run is one); left, k = 0..m-1 (the "
                   "corrupted run is one: hannamw/EAP-IG's convention, for comparing with published scores).")
@click.option("--edges", type=int, default=None,
              callback=click_callback(lambda v: v if v is None else bounds.positive_int("--edges", v)),
              help="Edges in the circuit (the largest |score|) [default: 5% of all edges].")
@click.option("--select", type=click.Choice(["top-k", "greedy"]), default="top-k", show_default=True,
              help="top-k: the --edges of largest |score|; greedy: remove edges from the lowest |score| up while "
                   "faithfulness stays >= --threshold, re-evaluating the circuit each time, rounds repeated until "
                   "nothing changes.")
@click.option("--threshold", type=float, default=0.8, show_default=True,
              callback=click_callback(lambda v: bounds.fraction("--threshold", v, closed_high=True)),
              help="--select greedy: the faithfulness the circuit keeps.")
@click.option("--max-passes", type=int, default=2000, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--max-passes", v)),
              help="--select greedy: the most circuits evaluated (each one pass per batch of pairs).")
@click.option("--seeds", type=int, default=5, show_default=True,
              callback=click_callback(lambda v: bounds.positive_int("--seeds", v)),
              help="Random circuits per size for the faithfulness baseline.")
@click.option("--shares", default=None, metavar="F,F,...",
              callback=click_callback(lambda v: v if v is None else _shares(v)),
              help="Circuit sizes of the faithfulness curve, as shares of all edges [default: 0.001, 0.002, 0.005, "
                   "0.01, 0.02, 0.05, 0.1, 0.2, 0.5].")
@click.option("--batch-size", type=int, default=None,
              callback=click_callback(lambda v: v if v is None else bounds.positive_int("--batch-size", v)),
              help="Pairs per forward pass [default: all pairs, as many as about 3 GB of writes and gradients hold].")
@run_folder_options
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def circuit_command(model_name, pairs_file, method, steps, points, edges, select, threshold, max_passes, seeds, shares,
                    batch_size, out, force, progress, device=None, dtype=None) -> None:
    """Score every edge of the graph of heads and MLPs (embeddings, each head's query, key and value
    inputs, each MLP's input, the logits) by attribution patching between clean and corrupted prompts,
    keep the top-scoring edges as a circuit, and measure its faithfulness (the circuit run with every
    other edge fed the corrupted run's activations) against random circuits of the same size.
    Pre-norm models whose stream is the sum of the writes (GPT-2, LLaMA, Qwen, Mistral, Phi-3,
    GPT-NeoX, Falcon, and models found by a pass such as ModernBERT with its masked-LM head).

    \b
    Pairs file: one pair a line, four tab-separated fields
      clean  corrupted  answer  wrong
    clean and corrupted must have the same number of tokens; answer and wrong one token each.
    Default: the 20 built-in indirect-object pairs.
    """
    given = pair_input(pairs_file)  # before torch is imported: a bad pairs file is answered at once
    from ..circuits.run import circuit_run
    from ..circuits.wiring import check_kind

    age = process_age()
    started = time.perf_counter() - age if age is not None else IMPORT_STARTED
    lm, pairs, source, out = pairs_and_model(model_name, pairs_file, out, force, dtype=dtype, device=device,
                                             head="auto", given=given, kind_check=check_kind)  # pre-norm models
    show = sys.stderr.isatty() if progress is None else progress
    m = 1 if method == "eap" else steps

    def plan(graph, sizes: int, n_batches: int) -> None:  # once the graph is checked: a model it does not fit gets
        # only its error
        click.echo(f"Circuit of {lm.name} on {plural(len(pairs), 'pair')} ({source}), {method}"
                   f"{f' m={m} ({points} points)' if method == 'eap-ig' else ''}, {graph.n_edges} edges: cost "
                   f"{n_batches * (2 + m)} forward and {n_batches * m} backward passes for the scores, about "
                   f"{n_batches} x (4 + {sizes} sizes x {1 + seeds}) passes for faithfulness"
                   + (f", up to {n_batches} x {max_passes} for greedy" if select == "greedy" else ""), err=True)

    result, path = circuit_run(lm, pairs, out=out, force=force, source=source, method=method, steps=steps,
                               points=points, edges=edges, seeds=seeds, shares=shares, batch_size=batch_size,
                               progress=show, select=select, threshold=threshold, max_passes=max_passes, plan=plan,
                               timings={"model_load_s": lm.load_seconds}, started=started,
                               say=None if show else lambda line: click.echo(line, err=True),
                               estimate=lambda line: click.echo(line, err=True))
    f = result.faithfulness.frame
    k = int(result.circuit.sum())
    row = f[f["k"] == k].iloc[0]
    g = result.greedy
    chosen = f"circuit of {k} edges: faithfulness {fixed(row.faithfulness)}"
    if g is not None:
        chosen = (f"greedy circuit of {plural(k, 'edge')}: faithfulness {fixed(g.faithfulness)} "
                  f"({plural(g.rounds, 'round')}, {g.passes} circuits"
                  f"{'' if g.converged else ', --max-passes spent before convergence'}); top {k} edges "
                  f"{fixed(row.faithfulness)}")
    click.echo(f"{result.graph.n_edges} edges; LD clean {result.ld_clean:.4g}, corrupted {result.ld_corrupted:.4g}; "
               f"{chosen} (random {fixed(row.random_mean)} +- {fixed(row.random_std)})")
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"Report: {path / 'index.html'}")
