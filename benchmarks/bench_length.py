"""Benchmark: one long text analysed at full length, in flat memory (block capture).

For each length (default 1,024, 2,048, 4,096 and 8,192 tokens) a fresh child process loads the
model, runs ``probe.runs.analysis.analyze`` on one text of exactly that many tokens (the UD English EWT
dev sentences concatenated, or the built-in sample repeated when that file is missing) with block
capture at every length (the automatic block size, :data:`probe.capture.blocks.BLOCK_PROBABILITIES`
probabilities per block; ``--dense N`` adds one whole-map run of N tokens for reference), and reports its
peak resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the child: the whole
process, model weights included) and the seconds of the analysis. Then peak(longest) /
peak(shortest).

``--check N`` (default 2048; 0: none) also runs, in one child, the N-token text through the dense
path (whole maps, Hugging Face's eager attention) and through block capture, and prints the
largest difference of every statistic column of ``heads``, of the example maps and, where the
head-distance accumulator supports row blocks, of the distances (goal: <= 1e-5).

Usage: OMP_NUM_THREADS=2 python benchmarks/bench_length.py [--lengths 1024 2048 4096 8192]
       [--model smollm2] [--check 2048] [--dense 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UD_DEV = Path("/work/shared/data/ud-ewt/en_ewt-ud-dev.conllu")

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from probe.runs.analysis import analyze
from probe.capture.blocks import BLOCK_PROBABILITIES
from probe.loading.models import load_model
from probe.patterns import HeadDistances

args = json.loads(sys.stdin.read())
lm = load_model(args["model"])
sentences = args["sentences"]
ids, i = [], 0
while len(ids) < args["tokens"] + 8:  # sentences joined by spaces until the text has enough tokens
    ids += lm.tokenizer(" " + sentences[i % len(sentences)], add_special_tokens=False)["input_ids"]
    i += 1
text = lm.tokenizer.decode(ids[:args["tokens"] + 8])
n = args["tokens"]

def one(query_block, extra=()):
    t0 = time.perf_counter()
    r = analyze(lm, [text], max_length=n, batch_size=1, query_block=query_block, accumulators=list(extra))
    return r, time.perf_counter() - t0

out = {{}}
if args["check"]:
    dense, td = one(0, [HeadDistances(lm.sites, lm.geometry.n_heads)])
    dist = HeadDistances(lm.sites, lm.geometry.n_heads)
    blocked, tb = one(None if n > 1024 else 256, [dist] if getattr(dist, "row_blocks", False) else [])
    cols = [c for c in blocked.heads.select_dtypes("number").columns
            if c in dense.heads and c not in ("layer", "head", "cluster", "group")]
    diffs = {{c: float(np.nanmax(np.abs(dense.heads[c].to_numpy(float) - blocked.heads[c].to_numpy(float))))
             for c in cols}}
    ex = max(float(np.abs(a.probs - b.probs).max()) for a, b in zip(dense.examples, blocked.examples))
    out.update(check=diffs, example=ex, dense_s=td, block_s=tb, tokens=blocked.counts["tokens"],
               notes=blocked.notes)
    if "distances" in blocked.results:
        a, b = dense.results["distances"], blocked.results["distances"]
        out["distance"] = float(np.nanmax(np.abs(a.layer - b.layer)))
        if a.model is not None and b.model is not None:
            out["distance"] = max(out["distance"], float(np.nanmax(np.abs(a.model - b.model))))
else:
    qb = args["query_block"]
    if qb == "blocks":  # block capture at the automatic block size, whatever the length
        qb = max(1, BLOCK_PROBABILITIES // (lm.geometry.n_heads * n))
    r, t = one(qb)
    out["query_block"] = qb
    out.update(seconds=t, tokens=r.counts["tokens"], notes=r.notes)
out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT", json.dumps(out))
"""


def sentences() -> list[str]:
    """The UD EWT dev sentences (``# text =`` lines), or the built-in sample."""
    if UD_DEV.exists():
        return [ln[len("# text = "):].strip() for ln in UD_DEV.read_text(encoding="utf-8").splitlines()
                if ln.startswith("# text = ")]
    sys.path.insert(0, str(ROOT))
    from probe.text.corpus import sample_texts
    return list(sample_texts())


def child(model: str, tokens: int, texts: list[str], *, check: bool = False, query_block=None) -> dict:
    """One analysis in a fresh process: its result record (peak MiB, seconds, differences)."""
    arg = json.dumps({"model": model, "tokens": tokens, "sentences": texts, "check": check,
                      "query_block": query_block})
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT))], input=arg, capture_output=True,
                          text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--check", type=int, default=2048, help="tokens of the dense == blocks check (0: none)")
    ap.add_argument("--dense", type=int, default=1024, help="also this length with whole maps, for reference (0: no)")
    args = ap.parse_args()
    texts = sentences()
    print(f"model {args.model}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; load {os.getloadavg()}")
    peaks = {}
    if args.dense:
        r = child(args.model, args.dense, texts, query_block=0)
        print(f"{args.dense:>6} tokens (whole maps, for reference): peak RSS {r['peak_mib']:7.0f} MiB; analyze "
              f"{r['seconds']:7.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
    for n in args.lengths:
        r = child(args.model, n, texts, query_block="blocks")
        peaks[n] = r["peak_mib"]
        print(f"{n:>6} tokens (blocks of {r['query_block']} rows): peak RSS {r['peak_mib']:7.0f} MiB; analyze "
              f"{r['seconds']:7.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
    if len(peaks) > 1:
        lo, hi = min(peaks), max(peaks)
        print(f"peak({hi}) / peak({lo}) = {peaks[hi] / peaks[lo]:.2f}")
    if args.check:
        r = child(args.model, args.check, texts, check=True)
        worst = max(r["check"].items(), key=lambda kv: kv[1])
        print(f"dense vs blocks at {r['tokens']} tokens: largest statistic difference {worst[1]:.2e} ({worst[0]}); "
              f"example maps {r['example']:.2e}; distances "
              + (f"{r['distance']:.2e}" if "distance" in r else "not compared (HeadDistances has no row blocks)"))
        print("per column:", ", ".join(f"{c} {v:.1e}" for c, v in r["check"].items()))
        print(f"dense {r['dense_s']:.1f} s, blocks {r['block_s']:.1f} s; peak of that child {r['peak_mib']:.0f} MiB")
        for note in r["notes"]:
            print("note:", note)


if __name__ == "__main__":
    main()
