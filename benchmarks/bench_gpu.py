"""Benchmark on a CUDA GPU: probe's analysis against the floor, a bare sdpa forward of the same batches.

For each model and sequence length: ``--sequences`` texts cut to that many tokens, in batches of
``--batch-size``, the model on the GPU in ``--dtype``. Timed (median of ``--repeats`` interleaved
rounds, each after a warm-up, with ``torch.cuda.synchronize()`` around every part):

- ``bare``: the model's forward on the pre-tokenized batches with sdpa attention, keeping no
  attention (the floor). Tokenization is not inside it.
- ``analyze``: :func:`probe.analyze` on the texts (its defaults: statistics, value-weighted
  statistics, examples, labels); tokenization is inside it, so ``tokenize`` is timed alone and the
  ratio is printed with and without it.

Also printed: the peak GPU memory of each part (``torch.cuda.max_memory_allocated``).

Usage: python benchmarks/bench_gpu.py [--model minilm] [--model smollm2 ...] [--lengths 128,512]
                                      [--dtype bfloat16] [--sequences 64] [--batch-size 8] [--repeats 3]
Without a CUDA device, ``--device cuda`` (the default) is refused in one ``Error:`` line (exit
status 1); ``--device cpu`` runs every part on the CPU (a smoke test of the script: no peak memory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's probe, not an installed one
from bench_floor import sdpa_pass  # noqa: E402  (the same floor as the CPU benchmark)


def texts_of(lm, n: int, length: int) -> list[str]:
    """``n`` texts of at least ``length`` tokens: the built-in sample, rotated and joined."""
    from probe.text.corpus import sample_texts

    sample = sample_texts()
    out = []
    for i in range(n):
        words, k = [], i
        while len(lm.tokenizer(" ".join(words))["input_ids"]) < length:
            words.extend(sample[k % len(sample)].split())
            k += 1
        out.append(" ".join(words))
    return out


def synced(fn) -> tuple[float, float]:
    """(seconds, peak GPU MiB; 0 without CUDA) of one call of ``fn``."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t, torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0


def measure(lm, length: int, n: int, batch_size: int, repeats: int) -> dict:
    """Median seconds and peak MiB of bare, analyze and tokenize at one length."""
    from probe.runs.analysis import analyze
    from probe.text.inputs import as_texts, iter_batches

    texts = texts_of(lm, n, length)
    batches = list(iter_batches(lm, as_texts(texts), batch_size=batch_size, max_length=length))

    fns = {"bare": lambda: sdpa_pass(lm, batches),
           "analyze": lambda: analyze(lm, texts, batch_size=batch_size, max_length=length),
           "tokenize": lambda: list(iter_batches(lm, as_texts(texts), batch_size=batch_size, max_length=length))}
    for fn in fns.values():
        fn()  # warm-up: kernels, allocator, caches
    runs = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(synced(fn))
    return {name: (statistics.median(r[0] for r in v), max(r[1] for r in v)) for name, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", default=None, help="repeatable [default: minilm]")
    parser.add_argument("--lengths", default="128,512", help="comma-separated token lengths")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke test of this script on a machine without a GPU")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("Error: no CUDA device here (torch.cuda.is_available() is False); --device cpu runs this script "
                 "as a smoke test")
    from probe.loading.models import load_model

    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}, {args.dtype}, {args.sequences} sequences, "
          f"batch {args.batch_size}, median of {args.repeats}")
    print(f"{'model':<12}{'tokens':>7}{'bare s':>9}{'analyze s':>11}{'tokenize s':>12}{'x bare':>8}"
          f"{'x bare w/o tok':>16}{'bare MiB':>10}{'analyze MiB':>13}")
    for name in args.model or ["minilm"]:
        lm = load_model(name, dtype=args.dtype, device=args.device)
        for length in lengths:
            if lm.max_length is not None and length > lm.max_length:
                print(f"{name:<12}{length:>7}  skipped: above the model's limit of {lm.max_length} tokens")
                continue
            m = measure(lm, length, args.sequences, args.batch_size, args.repeats)
            (bare, bare_mib), (full, full_mib), (tok, _) = m["bare"], m["analyze"], m["tokenize"]
            print(f"{name:<12}{length:>7}{bare:>9.3f}{full:>11.3f}{tok:>12.3f}{full / bare:>7.2f}x"
                  f"{(full - tok) / bare:>15.2f}x{bare_mib:>10.0f}{full_mib:>13.0f}")
        del lm
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
