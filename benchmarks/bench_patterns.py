"""Benchmark: what the pattern analyses add to probe's forward + statistics pass, side by side.

Prints, measured in one run on the same texts (interleaved over several repeats, median of each):
  - forward + statistics time of ``analyze`` alone, with the head distances
    (:class:`probe.patterns.HeadDistances`: per layer over the corpus, all heads over the first
    ``--map-sequences`` sequences), and with every pattern accumulator (distances, Kovaleva types,
    health probe); ratios to the statistics alone (target for the distances: <= 1.5);
  - for decoders, the time of the circuit probe (its own forward passes, outside the corpus pass);
  - peak resident memory (MiB) of a fresh process analysing 100 vs 1,000 sentences with every pattern
    accumulator (flat = memory independent of corpus length).

Usage: python benchmarks/bench_patterns.py [--model minilm] [--n 500] [--repeats 3] [--map-sequences 200]
                                          [--corpus FILE] [--threads N] [--memory-sizes 100,1000]
--threads 1 on a shared machine: when other processes keep the cores busy, every multi-threaded torch
operation waits for its slowest thread, and the many small operations of the pairwise loop suffer
most (measured here: 3-17x slower with 2 threads than with 1 on a machine at load 10).
Text: --corpus (plain text or CoNLL-U, repeated to --n), else the UD English EWT dev set from
the shared data folder beside the checkout when present, else the built-in sample repeated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_capture  # noqa: E402
from bench_capture import _reset_peak, _rss_kib  # noqa: E402


def corpus(n: int, path: str | None = None) -> tuple[list[str], str]:
    if path is None:
        return bench_capture.corpus(n)
    from probe.text.corpus import read_corpus

    texts = read_corpus(path)
    while len(texts) < n:
        texts = texts + texts
    return texts[:n], path


def accumulators(lm, which: str, map_sequences: int) -> list:
    from probe.patterns import HeadDistances, pattern_accumulators

    if which == "statistics":
        return []
    if which == "distances":
        return [HeadDistances(lm.sites, lm.geometry.n_heads, map_sequences=map_sequences)]
    return pattern_accumulators(lm, map_sequences=map_sequences)


def child(model: str, n: int, batch_size: int, map_sequences: int, path: str | None, kind: str) -> None:
    from probe.loading.models import load_model
    from probe.runs.analysis import analyze

    lm = load_model(model)
    texts, _ = corpus(n, path)
    base = _rss_kib("VmRSS")
    reset = _reset_peak()
    res = analyze(lm, texts, batch_size=batch_size, n_examples=3, accumulators=accumulators(lm, kind, map_sequences))
    peak = _rss_kib("VmHWM")
    print(json.dumps({"n": n, "peak_mib": peak / 1024, "before_mib": base / 1024, "peak_reset": reset,
                      "tokens": res.counts["tokens"], "longest": res.counts["longest"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--map-sequences", type=int, default=200)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--memory-sizes", default="100,1000", help="corpus sizes of the peak-memory runs")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="all", help=argparse.SUPPRESS)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child is not None:
        child(args.model, args.child, args.batch_size, args.map_sequences, args.corpus, args.kind)
        return

    from probe.loading.models import load_model
    from probe.patterns import circuit_probe
    from probe.runs.analysis import analyze

    lm = load_model(args.model)
    texts, source = corpus(args.n, args.corpus)
    print(f"model {args.model}: {lm.geometry.n_layers} layers x {lm.geometry.n_heads} heads; {len(texts)} sequences "
          f"from {source}; batch {args.batch_size}; all-heads distance on the first {args.map_sequences} sequences; "
          f"torch threads {torch.get_num_threads()}")
    analyze(lm, texts[:32], batch_size=args.batch_size, n_examples=0, accumulators=accumulators(lm, "all", 32))
    kinds = ("statistics", "distances", "all")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.repeats):  # --repeats 0: memory only
        for k in kinds:
            res = analyze(lm, texts, batch_size=args.batch_size, n_examples=3,
                          accumulators=accumulators(lm, k, args.map_sequences))
            times[k].append(res.timings["forward_and_statistics_s"])
        base = times["statistics"][-1]
        print(f"  repeat {r + 1}: statistics {base:.2f} s | + distances {times['distances'][-1]:.2f} s "
              f"(x{times['distances'][-1] / base:.3f}) | + all pattern accumulators {times['all'][-1]:.2f} s "
              f"(x{times['all'][-1] / base:.3f})")
    med = {k: statistics.median(v) for k, v in times.items() if v}
    if med:
        print(f"median: statistics {med['statistics']:.2f} s; + distances {med['distances']:.2f} s -> ratio "
              f"{med['distances'] / med['statistics']:.3f} (target <= 1.5); + all {med['all']:.2f} s -> ratio "
              f"{med['all'] / med['statistics']:.3f}")
    if lm.kind == "decoder" and args.repeats:
        t = time.perf_counter()
        probe = circuit_probe(lm, sink_texts=texts)
        print(f"circuit probe (16 x 2 x 25 random tokens, and the sinks on 16 corpus texts with and without BOS): "
              f"{time.perf_counter() - t:.2f} s")
        del probe

    if not args.skip_memory:  # peak of the statistics alone and with every pattern accumulator, two corpus sizes
        sizes = [int(v) for v in args.memory_sizes.split(",")]
        rows = {}
        for kind in ("statistics", "all"):
            for n in sizes:
                cmd = [sys.executable, __file__, "--model", args.model, "--child", str(n), "--kind", kind,
                       "--threads", str(args.threads), "--batch-size", str(args.batch_size),
                       "--map-sequences", str(args.map_sequences)] + (["--corpus", args.corpus] if args.corpus else [])
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                rows[kind, n] = row = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"peak RSS analysing {n:>5} sequences, {kind:<10}: {row['peak_mib']:.0f} MiB (after loading "
                      f"{row['before_mib']:.0f} MiB; {row['tokens']} tokens, longest {row['longest']})")
        for kind in ("statistics", "all"):
            ratio = rows[kind, sizes[-1]]["peak_mib"] / rows[kind, sizes[0]]["peak_mib"]
            print(f"{kind}: peak ratio {sizes[-1]} / {sizes[0]} sequences {ratio:.3f} (flat = ~1.0)")
        for n in sizes:
            extra = rows["all", n]["peak_mib"] - rows["statistics", n]["peak_mib"]
            print(f"pattern accumulators add {extra:.0f} MiB to the peak at {n} sequences")

if __name__ == "__main__":
    main()
