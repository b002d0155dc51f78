"""Benchmark: what the coreference and syntax accumulators add to an analysis.

Runs :func:`probe.runs.analysis.analyze` on the same annotated texts with and without the coreference
and syntax accumulators, interleaved (plain, with, plain, with ...) so that both see the same
machine load, and prints the median seconds of each and their ratio. The texts: the built-in
coreference set plus the first ``--sentences`` sentences of a CoNLL-U file (default: UD EWT dev
beside the checkout), or the built-in set alone when that file is missing.

Usage: python benchmarks/bench_linguistic.py [--model minilm] [--runs 3] [--sentences 300] [--conllu FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

DEFAULT_CONLLU = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud-ewt" / "en_ewt-ud-dev.conllu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--conllu", type=Path, default=DEFAULT_CONLLU)
    args = ap.parse_args()

    from probe import load_model
    from probe.linguistic import annotated_input
    from probe.runs.analysis import analyze

    lm = load_model(args.model)
    source = annotated_input("builtin", str(args.conllu) if args.conllu.exists() else None, args.sentences)
    print(f"{lm.name}: {source.source}")
    analyze(lm, source.texts[:16])  # warm-up
    plain, with_acc = [], []
    for i in range(args.runs):
        t = time.perf_counter()
        analyze(lm, source.texts, n_examples=0)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        analyze(lm, source.texts, n_examples=0, accumulators=source.accumulators(lm))
        with_acc.append(time.perf_counter() - t)
        print(f"run {i + 1}: statistics only {plain[-1]:.2f} s, with coreference + syntax {with_acc[-1]:.2f} s")
    p, w = statistics.median(plain), statistics.median(with_acc)
    print(f"median: statistics only {p:.2f} s, with coreference + syntax {w:.2f} s -> ratio {w / p:.2f}")


if __name__ == "__main__":
    main()
