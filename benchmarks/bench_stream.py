"""Benchmark: a corpus larger than memory is streamed; peak memory is flat in its length.

Writes the built-in sample repeated to 10,000 and 100,000 lines (by default), runs
``python -m probe analyze --corpus FILE`` on each in a fresh process, and prints the peak resident
memory of each process (the whole process, model included), the ratio of the two peaks (flat = ~1.0)
and the throughput (sequences and tokens per second of analysis).

Usage: python benchmarks/bench_stream.py [--lines 10000 100000] [--model minilm] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def run(path: Path, out: Path, model: str, batch_size: int) -> dict:
    """One analysis in a child process: its peak RSS (MiB) and run.json timings/counts."""
    code = ("import resource, runpy, sys; sys.argv = ['probe'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('probe', run_name='__main__')\n"
            "finally:\n    print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, "analyze", "--model", model, "--corpus", str(path),
                           "--batch-size", str(batch_size), "--out", str(out), "--no-progress"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    peak = next((int(ln.split()[1]) for ln in proc.stderr.splitlines() if ln.startswith("PEAK_KIB")), None)
    if peak is None:  # probe's entry point leaves with os._exit: read the child's peak from here
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rec = json.loads((out / "run.json").read_text())
    return {"peak_mib": peak / 1024, "timings": rec["timings_s"], "counts": rec["counts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from probe.text.corpus import sample_texts

    sample = sample_texts()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lines:
            path = Path(tmp) / f"corpus-{n}.txt"
            with path.open("w", encoding="utf-8") as fh:
                for i in range(n):
                    fh.write(sample[i % len(sample)] + "\n")
            r = run(path, Path(tmp) / f"run-{n}", args.model, args.batch_size)
            t, c = r["timings"], r["counts"]
            rows.append((n, r))
            print(f"{n:>8} lines: peak RSS {r['peak_mib']:7.0f} MiB; analysis {t['analyze_s']:8.1f} s "
                  f"({c['sequences'] / t['analyze_s']:6.0f} sequences/s, {c['tokens'] / t['analyze_s']:7.0f} tokens/s)")
    if len(rows) >= 2:
        (n0, a), (n1, b) = rows[0], rows[-1]
        print(f"peak memory ratio {n1} / {n0} lines: {b['peak_mib'] / a['peak_mib']:.3f} (flat = ~1.0)")


if __name__ == "__main__":
    main()
