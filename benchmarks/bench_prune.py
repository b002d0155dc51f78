"""Benchmark: forward speed of a physically pruned model (half of its heads removed) vs the
original, side by side in one run, on the CPU.

For each model, half of the heads (a fixed random choice, seed 0: speed depends on how many heads
go from each layer, not on which) are removed from a copy of the model with
:func:`probe.pruning.remove_heads`; then one batch (default 16 sequences x 128 tokens, no
padding) runs through the original and the pruned copy, interleaved (the order alternates every
repeat) after warm-up passes. Prints parameter counts, median wall time per forward pass
(seconds) and the ratio original / pruned (> 1: the pruned model is faster), also of the fastest
runs (less disturbed by other work on a shared machine). Michel et al. 2019
(sec. 4.2, Table 4) measured +17.5% throughput at 50% of the heads pruned on a GPU. No assertions:
timings depend on the machine.

Usage: python benchmarks/bench_prune.py [--models minilm smollm2] [--batch 16] [--tokens 128]
       [--repeats 7] [--warmup 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_reference import make_batch as make_inputs  # noqa: E402 (the same real-text batch)


def half_of_the_heads(lm, seed: int = 0) -> dict[int, list[int]]:
    g = lm.geometry
    n = g.n_layers * g.n_heads
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: n // 2].tolist()
    heads: dict[int, list[int]] = {}
    for i in perm:
        heads.setdefault(i // g.n_heads, []).append(i % g.n_heads)
    return heads


def bench(name: str, batch: int, tokens: int, repeats: int, warmup: int) -> dict:
    from probe.loading.models import load_model
    from probe.pruning import remove_heads
    from probe.pruning.experiment import copy_model

    lm = load_model(name)
    pruned = copy_model(lm)
    removal = remove_heads(pruned, half_of_the_heads(lm))
    inputs = make_inputs(lm, batch, tokens)
    models = {"original": lm.model, "pruned": pruned.model}

    def run(which: str) -> float:
        with torch.no_grad():
            start = time.perf_counter()
            models[which](**inputs)
            return time.perf_counter() - start

    for _ in range(warmup):
        run("original"), run("pruned")
    times = {"original": [], "pruned": []}
    for r in range(repeats):
        for which in (("original", "pruned") if r % 2 == 0 else ("pruned", "original")):
            times[which].append(run(which))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "params_original": removal.params_before, "params_pruned": removal.params_after,
            "heads_removed": sum(len(h) for h in removal.removed.values()), **med,
            "ratio": med["original"] / med["pruned"], "ratio_min": min(times["original"]) / min(times["pruned"]),
            "notes": removal.notes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch} x {args.tokens} tokens, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'model':<10}{'heads removed':>14}{'params original':>17}{'params pruned':>15}"
          f"{'original s':>12}{'pruned s':>10}{'original/pruned':>17}{'(fastest runs)':>16}")
    for name in args.models:
        r = bench(name, args.batch, args.tokens, args.repeats, args.warmup)
        print(f"{r['model']:<10}{r['heads_removed']:>14}{r['params_original']:>17,}{r['params_pruned']:>15,}"
              f"{r['original']:>12.3f}{r['pruned']:>10.3f}{r['ratio']:>16.2f}x{r['ratio_min']:>15.2f}x")
        for note in r["notes"]:
            print(f"  note: {note}")


if __name__ == "__main__":
    main()
