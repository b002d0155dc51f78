"""Benchmark: time to draw the report vs time of the analysis, for ``probe analyze`` with no arguments.

Runs the command N times (fresh processes, default run: minilm on the built-in sample), reads
``run.json`` ``timings_s`` of each run and prints the medians of ``analyze_s`` and ``report_s``
and their ratio (target, issue "One shape": report_s <= analyze_s), plus the page's size.

Usage: python benchmarks/bench_report.py [--runs 5] [-- extra probe analyze arguments]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="extra arguments for probe analyze")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            out = Path(tmp) / f"run{i}"
            subprocess.run([sys.executable, "-m", "probe", "analyze", "--out", str(out), "--no-progress",
                            *args.extra], check=True, capture_output=True, text=True)
            t = json.loads((out / "run.json").read_text())["timings_s"]
            size = (out / "index.html").stat().st_size
            rows.append((t["analyze_s"], t["report_s"], t["total_s"], size))
            print(f"run {i + 1}: analysis {t['analyze_s']:.3f} s, report {t['report_s']:.3f} s, "
                  f"total {t['total_s']:.2f} s, index.html {size / 1024:.0f} KiB")
    a = statistics.median(r[0] for r in rows)
    r = statistics.median(r[1] for r in rows)
    print(f"median: analysis {a:.3f} s, report {r:.3f} s -> report / analysis {r / a:.3f} (target <= 1)")


if __name__ == "__main__":
    main()
