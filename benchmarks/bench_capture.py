"""Benchmark: probe's capture + statistics vs a bare eager forward pass, side by side.

Prints, measured in one run on the same batches (sorted by length, same batch size):
  - time of ``probe.runs.analysis.analyze``'s forward + statistics loop (hooks, token features,
    running sums; padding included) and of a bare eager forward with ``output_attentions=True``
    (inputs padded beforehand, not timed), interleaved over several repeats; ratio of medians;
  - peak resident memory (MiB) of a fresh process analysing 100 vs 1,000 sentences.

Usage: python benchmarks/bench_capture.py [--model minilm] [--n 500] [--repeats 5]
Text: the UD English EWT dev set from the shared data folder when present, else the built-in sample repeated.
Target (issue 2): ratio <= 1.2 on minilm with 500 UD sentences; memory flat.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

UD = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud-ewt" / "en_ewt-ud-dev.conllu"


def corpus(n: int) -> tuple[list[str], str]:
    from probe.text.corpus import read_corpus, sample_texts

    if UD.exists():
        texts = read_corpus(UD)
        source = f"UD EWT dev ({UD})"
    else:
        texts = sample_texts()
        source = "built-in sample (repeated)"
    while len(texts) < n:
        texts = texts + texts
    return texts[:n], source


def bare_forward(lm, batches) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for enc in batches:
            kw = enc.model_inputs()
            if lm.kind != "encoder":
                kw["use_cache"] = False
            out = lm.model(**kw, output_attentions=True)
            assert out.attentions is not None and len(out.attentions) == lm.geometry.n_layers
    return time.perf_counter() - start


def child(model: str, n: int, batch_size: int) -> None:
    from probe.loading.models import load_model
    from probe.runs.analysis import analyze

    lm = load_model(model)
    texts, _ = corpus(n)
    base = _rss_kib("VmRSS")
    reset = _reset_peak()  # so the peak is that of the analysis, not of loading the model
    res = analyze(lm, texts, batch_size=batch_size, n_examples=3)
    longest = max(len(f) for f in lm.tokenizer(texts)["input_ids"])
    peak = _rss_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"n": n, "peak_mib": peak / 1024, "before_mib": base / 1024, "peak_reset": reset,
                      "tokens": res.counts["tokens"], "longest": longest}))


def _rss_kib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (KiB); ru_maxrss where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _reset_peak() -> bool:
    """Reset the peak-RSS mark (Linux: write 5 to /proc/self/clear_refs); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child is not None:
        child(args.model, args.child, args.batch_size)
        return

    from probe.loading.models import load_model
    from probe.runs.analysis import analyze
    from probe.text.inputs import as_texts, iter_batches

    lm = load_model(args.model)
    texts, source = corpus(args.n)
    batches = list(iter_batches(lm, as_texts(texts), batch_size=args.batch_size))
    print(f"model {args.model}: {lm.geometry.n_layers} layers x {lm.geometry.n_heads} heads; "
          f"{len(texts)} sequences from {source}; {len(batches)} batches of <= {args.batch_size}; "
          f"torch threads {torch.get_num_threads()}")
    bare_forward(lm, batches[:2])  # warm-up
    analyze(lm, texts[:32], batch_size=args.batch_size, n_examples=0)
    t_bare, t_probe = [], []
    for r in range(args.repeats):
        t_bare.append(bare_forward(lm, batches))
        res = analyze(lm, texts, batch_size=args.batch_size, n_examples=3)
        t_probe.append(res.timings["forward_and_statistics_s"])
        print(f"  repeat {r + 1}: bare eager forward (output_attentions=True) {t_bare[-1]:.3f} s | "
              f"probe capture + statistics {t_probe[-1]:.3f} s | ratio {t_probe[-1] / t_bare[-1]:.3f}")
    mb, mp = statistics.median(t_bare), statistics.median(t_probe)
    print(f"median: bare {mb:.3f} s, probe {mp:.3f} s -> ratio {mp / mb:.3f} (target <= 1.2)")

    if not args.skip_memory:
        rows = []
        for n in (100, 1000):
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", str(n),
                                  "--batch-size", str(args.batch_size)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for row in rows:
            print(f"peak RSS while analysing {row['n']:>5} sequences: {row['peak_mib']:.0f} MiB "
                  f"(after loading the model: {row['before_mib']:.0f} MiB; growth "
                  f"{row['peak_mib'] - row['before_mib']:.0f} MiB; {row['tokens']} tokens, longest sequence "
                  f"{row['longest']} tokens)")
        print(f"peak ratio 1000 / 100 sequences: {rows[1]['peak_mib'] / rows[0]['peak_mib']:.3f} (flat = ~1.0)")


if __name__ == "__main__":
    main()
