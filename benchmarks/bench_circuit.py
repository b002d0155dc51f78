"""Benchmark: ``probe circuit`` beside the bare forward passes its work needs, and a circuit's pass
beside a forward pass of the same batch, in one run (SmolLM2, the 20 built-in pairs).

1. Circuit passes: for the default circuit (top 5% of the edges by the scores of EAP, one gradient),
   the top 0.5% and 50%, and random circuits of 5% and 50%, the time of the circuit's pass
   (``Evaluator.metric``) beside a bare forward pass of the same batch (the model alone, no hooks,
   logits at the metric's positions), interleaved, minima of ``--repeats``.
2. With --run: the default run (``probe.run_circuit`` and its ``save``: EAP-IG m = 5 scores, the
   faithfulness curve of 9 sizes x 6 circuits, the labelling analysis, the run folder) timed stage by
   stage, beside the bare forward passes its work needs of the same batches: (2 + 3 m) for the scores
   (a backward pass counted as two forward ones) and one per circuit of the curve, timed in the same
   process right after.

The machine's load (os.getloadavg, as uptime prints it) is printed with each figure, and torch's
thread count. Run it from two checkouts to compare code (the script uses only what both have).

Usage: PYTHONPATH=. python benchmarks/bench_circuit.py [--repeats 3] [--batch-size 20] [--run] [--threads N]
       [--clock wall|cpu]   (cpu: the process's CPU seconds, for a shared machine at --threads 1)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import probe
from probe.circuits.attribution import edge_scores, metric_positions
from probe.circuits.checked import graph_of
from probe.circuits.evaluate import Evaluator, random_edges, top_edges
from probe.effects.pairs import builtin_pairs, encode_pairs

#: The clock of every figure: wall seconds, or the process's CPU seconds (``--clock cpu``: on a shared
#: machine with one thread, the work itself, whatever else runs).
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def bare_forward(lm, enc, rows_list) -> float:
    """Seconds of the model's own forward pass over every batch (no hooks)."""
    t = clock()
    with torch.no_grad():
        for rows in rows_list:
            lm.model(input_ids=enc.clean[rows], attention_mask=enc.mask[rows], use_cache=False,
                     logits_to_keep=metric_positions(enc, rows))
    return clock() - t


def passes(lm, enc, batch_size: int, repeats: int) -> None:
    with graph_of(lm) as (wiring, graph, _):
        ev = Evaluator(lm, wiring, graph, enc, batch_size)
        scores = edge_scores(lm, wiring, graph, enc, method="eap", batch_size=batch_size)
        n = graph.n_edges
        circuits = {"top 5% (default)": top_edges(scores, round(0.05 * n)),
                    "top 0.5%": top_edges(scores, round(0.005 * n)), "top 50%": top_edges(scores, n // 2),
                    "random 5%": random_edges(n, round(0.05 * n), 0),
                    "random 50%": random_edges(n, n // 2, 0)}
        print(f"circuit passes, {len(ev.rows)} batch(es) of up to {batch_size} pairs, {torch.get_num_threads()} "
              f"threads, {load()}")
        for name, included in circuits.items():
            fwd, run = [], []
            for _ in range(repeats):
                fwd.append(bare_forward(lm, enc, ev.rows))
                if hasattr(ev, "forget"):  # a circuit run before is remembered, not run again
                    ev.forget()
                t = clock()
                ev.metric(included)
                run.append(clock() - t)
            plan = getattr(ev, "plan", None)
            how = "" if plan is None else f" [{plan(included).run}]"
            print(f"  {name:18s}{how}: circuit pass {min(run):.3f} s, forward {min(fwd):.3f} s, "
                  f"ratio {min(run) / min(fwd):.2f}  ({load()})", flush=True)


def circuit_command(lm, folder: str, estimate):
    """What ``probe circuit`` runs by default, its folder written: ``probe.run_circuit`` and ``save`` (a checkout
    from before the run calls: ``probe.circuits.run.circuit_run``); returns the :class:`CircuitRun`."""
    try:
        from probe.entries.kinds import run_circuit
    except ImportError:  # before the run calls (issue 46)
        from probe.circuits.run import circuit_run

        return circuit_run(lm, out=folder, estimate=estimate)[0]
    from probe.entries.result import Console
    from probe.settings import CircuitSettings

    run = run_circuit(lm, CircuitSettings(), console=Console(estimate=estimate))
    run.save(folder)
    return run.measured


def default_run(lm, enc, steps: int = 5) -> None:
    print(f"default run: EAP-IG m = {steps}, the 20 built-in pairs, {torch.get_num_threads()} threads, "
          f"{'CPU' if clock is time.process_time else 'wall'} seconds, {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        t = clock()
        result = circuit_command(lm, os.path.join(tmp, "run"), lambda line: print("  " + line, flush=True))
        total = clock() - t
    s = result.seconds
    n_batches = result.passes["edges"] // (2 + 2 * steps)
    from probe.circuits.attribution import batches as batch_slices

    rows_list = batch_slices(len(enc), len(enc) if n_batches == 1 else 8)  # 8: the batch size before it was automatic
    circuits = 2 + len(result.faithfulness.frame) * (1 + result.seeds)
    needed = (2 + 3 * steps) + circuits
    print(f"  stages: scores {s['edges_s']:.1f} s, faithfulness {s['faithfulness_s']:.1f} s, labelling "
          f"{s.get('analyze_s', 0):.1f} s; in all {total:.1f} s ({load()}); passes {result.passes}")
    one = min(bare_forward(lm, enc, rows_list) for _ in range(3))
    print(f"  bare forward passes of the same batches: {one:.3f} s each; the work needs {needed} "
          f"((2 + 3 m) = {2 + 3 * steps} for the scores, {circuits} circuits): {needed * one:.1f} s; "
          f"the run is {total / (needed * one):.2f}x of them, the scores {s['edges_s'] / ((2 + 3 * steps) * one):.2f}x "
          f"of theirs, the curve {s['faithfulness_s'] / (circuits * one):.2f}x of its circuits' ({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--run", action="store_true", help="also the default run beside its forward passes")
    parser.add_argument("--skip-passes", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=list(CLOCK), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    if args.clock == "cpu":  # the run's stage times (run.json's seconds) on the same clock
        import probe.circuits.run as run_module

        run_module.time = type("CpuTime", (), {"perf_counter": staticmethod(time.process_time)})
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = probe.load_model("smollm2")
    enc = encode_pairs(lm, builtin_pairs())
    np.random.seed(0)
    if not args.skip_passes:
        passes(lm, enc, args.batch_size, args.repeats)
    if args.run:
        default_run(lm, enc)


if __name__ == "__main__":
    main()
