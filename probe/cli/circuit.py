"""``probe circuit``: edge attribution over the graph of heads and MLPs (EAP, EAP-IG), the circuit of the
top-scoring edges and its faithfulness against random circuits."""

from __future__ import annotations

import click

from ..settings import CircuitSettings
from ..util import fixed, plural
from .group import main, user_errors
from .options import build, model_option, model_placement, run_folder_options, setting_option
from .start import Folder, command_console, read_pairs
from .summary import report_line


@main.command("circuit")
@model_option(default="smollm2")  # circuits run on decoders: the embedded decoder
@setting_option(CircuitSettings, "pairs", "--pairs", type=click.Path(dir_okay=False, path_type=str),
                help="Tab-separated clean, corrupted, answer, wrong per line [default: the built-in IOI set].")
@setting_option(CircuitSettings, "method", "--method", show_default=True,
                help="eap: gradient at the clean run; eap-ig: averaged over --steps points from corrupted to clean.")
@setting_option(CircuitSettings, "steps", "--steps", show_default=True,
                help="EAP-IG's integration points m (alpha = k/m, k = 1..m; see --points).")
@setting_option(CircuitSettings, "points", "--points", show_default=True,
                help="EAP-IG's points: right, alpha = k/m for k = 1..m (the clean run is one); left, k = 0..m-1 (the "
                     "corrupted run is one: hannamw/EAP-IG's convention, for comparing with published scores).")
@setting_option(CircuitSettings, "edges", "--edges",
                help="Edges in the circuit (the largest |score|) [default: 5% of all edges].")
@setting_option(CircuitSettings, "select", "--select", show_default=True,
                help="top-k: the --edges of largest |score|; greedy: remove edges from the lowest |score| up while "
                     "faithfulness stays >= --threshold, re-evaluating the circuit each time, rounds repeated until "
                     "nothing changes.")
@setting_option(CircuitSettings, "threshold", "--threshold", show_default=True,
                help="--select greedy: the faithfulness the circuit keeps.")
@setting_option(CircuitSettings, "max_passes", "--max-passes", show_default=True,
                help="--select greedy: the most circuits evaluated (each at most one pass per batch of "
                     "pairs; none for one whose pruned form was run before).")
@setting_option(CircuitSettings, "seeds", "--seeds", show_default=True,
                help="Random circuits per size for the faithfulness baseline.")
@setting_option(CircuitSettings, "shares", "--shares", metavar="F,F,...",
                help="Circuit sizes of the faithfulness curve, as shares of all edges [default: 0.001, 0.002, 0.005, "
                     "0.01, 0.02, 0.05, 0.1, 0.2, 0.5].")
@setting_option(CircuitSettings, "batch_size", "--batch-size",
                help="Pairs per forward pass [default: all pairs, as many as about 3 GB of writes and gradients hold].")
@run_folder_options
@click.option("--progress/--no-progress", default=None, help="Progress bars [default: on a terminal].")
@model_placement
@user_errors
def circuit_command(model_name, pairs, method, steps, points, edges, select, threshold, max_passes, seeds, shares,
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
    settings = build(CircuitSettings, locals())
    given = read_pairs(settings.pairs)  # before torch is imported: a bad pairs file is answered at once
    from ..entries.pairs import run_circuit

    folder = Folder(out, force)
    run = run_circuit(model_name, settings, pairs=given, console=command_console(progress, folder, say=True,
                                                                                  estimate=True),
                      device=device, dtype=dtype)
    path = run.save(folder.path, force=force)
    result = run.measured
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
    report_line(path)
