"""Benchmark: memory kept for example maps vs a run that keeps none.

Each configuration runs in a fresh process analysing the same long text(s) with SmolLM2 (30 layers
x 9 heads): the default (3 examples, cropped to 64 x 64 tokens, what the report draws), no examples
at all, and, for comparison, whole maps kept (``example_tokens=None``). Prints the peak resident
memory of the analysis itself (the mark is reset after the model has loaded) and the ratios.

Usage: python benchmarks/bench_examples.py [--model smollm2] [--tokens 1024] [--texts 3] [--skip-whole]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TEXT = ("Attention lets every token look at every other token of the sequence and take a weighted average "
        "of their values, the weights coming from a softmax over scaled dot products of queries and keys. ")


def _status_kib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(model: str, tokens: int, n_texts: int, examples: int, crop: str) -> None:
    from probe.loading.models import load_model
    from probe.runs.analysis import analyze

    lm = load_model(model)
    texts = [TEXT * (tokens // 30 + 2)] * n_texts
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak mark: measure the analysis only
    before = _status_kib("VmRSS")
    res = analyze(lm, texts, max_length=tokens, batch_size=1, n_examples=examples,
                  example_tokens=None if crop == "none" else int(crop))
    kept = sum(ex.probs.nbytes for ex in res.examples)
    print(json.dumps({"peak_mib": _status_kib("VmHWM") / 1024, "before_mib": before / 1024,
                      "kept_mib": kept / 2**20, "tokens": res.counts["longest"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--texts", type=int, default=1)
    ap.add_argument("--skip-whole", action="store_true", help="do not run the whole-map configuration")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.tokens, args.texts, int(args.child[0]), args.child[1])
        return
    configs = [("no examples", "0", "64"), ("default: 3 examples cropped to 64 tokens", "3", "64")]
    if not args.skip_whole:
        configs.append(("3 examples, whole maps (example_tokens=None)", "3", "none"))
    rows = {}
    for name, examples, crop in configs:
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens),
                              "--texts", str(args.texts), "--child", examples, crop],
                             capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        r = rows[name]
        print(f"{name:<46} peak {r['peak_mib']:8.0f} MiB (growth over the loaded model "
              f"{r['peak_mib'] - r['before_mib']:7.0f} MiB); maps kept {r['kept_mib']:8.1f} MiB; "
              f"{r['tokens']} tokens")
    base = rows["no examples"]["peak_mib"]
    for name in rows:
        print(f"peak ratio {name} / no examples: {rows[name]['peak_mib'] / base:.3f}")


if __name__ == "__main__":
    main()
