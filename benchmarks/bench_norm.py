"""Benchmark: the cost of the value-weighted statistics (``analyze(value_weighted=True)``, the default).

Runs ``analyze()`` on the same texts with and without value-weighted statistics, interleaved
(with, without, with, without ...) so that load on the machine hits both alike, ``--repeats``
times each, and prints the median and the fastest seconds of each and both ratios (goal: <= 1.10;
on a shared machine the fastest runs are the least disturbed).

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_norm.py [--model minilm] [--sentences 200] [--repeats 3]
Texts: the UD English EWT dev sentences where present, else the built-in sample repeated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from probe import load_model
from probe.runs.analysis import analyze
from probe.text.corpus import read_corpus, sample_texts

#: The shared data folder beside the repository root (a worktree elsewhere: PROBE_SHARED_DATA).
SHARED_DATA = Path(os.environ.get("PROBE_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
UD_DEV = SHARED_DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    lm = load_model(args.model)
    if UD_DEV.exists():
        texts = read_corpus(UD_DEV, limit=args.sentences)
    else:
        texts = (sample_texts() * (args.sentences // len(sample_texts()) + 1))[:args.sentences]
    analyze(lm, texts[:16], n_examples=0)  # warm-up: first-call costs out of the timings
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for weighted in (True, False):
            t = time.perf_counter()
            analyze(lm, texts, batch_size=args.batch_size, n_examples=0, value_weighted=weighted)
            times[weighted].append(time.perf_counter() - t)
    with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
    print(f"{args.model}, {len(texts)} texts, batch {args.batch_size}, {torch.get_num_threads()} thread(s), "
          f"{args.repeats} repeats interleaved")
    print(f"with value-weighted statistics:    {with_s:.2f} s (runs {', '.join(f'{t:.2f}' for t in times[True])})")
    print(f"without value-weighted statistics: {without_s:.2f} s (runs {', '.join(f'{t:.2f}' for t in times[False])})")
    print(f"ratio with / without: median {with_s / without_s:.3f}, fastest "
          f"{min(times[True]) / min(times[False]):.3f} (goal <= 1.10)")


if __name__ == "__main__":
    main()
