"""Benchmark: the default analysis against the floor, a bare sdpa forward of the same batches.

Measured in one process, interleaved over ``--repeats`` rounds (median of each part), on the same
texts (the UD English EWT dev sentences when the shared data folder is present, else the built-in
sample repeated):

- ``bare sdpa``: the model's forward on the pre-tokenized batches with sdpa attention, keeping no
  attention (the floor). Tokenization is NOT inside it.
- ``eager + output_attentions``: the same batches, eager attention returning every layer's maps.
  Tokenization is NOT inside it.
- ``analyze()``: :func:`probe.analyze` on the texts (statistics, value-weighted statistics, examples,
  labels: its defaults). Tokenization IS inside it (analyze tokenizes its texts).
- ``default probe analyze``: what ``probe analyze`` runs by default besides writing the report:
  ``analyze`` with :func:`probe.patterns.pattern_accumulators` (distances, Kovaleva types, health) and,
  for decoders, the circuit probe (its own forward passes on repeated random tokens). Tokenization IS
  inside it. The report itself (rollout of the examples, HTML) is not timed.
- ``tokenize``: the tokenization and batching of the texts alone (:func:`probe.text.inputs.iter_batches`),
  timed separately so that both ratios can be read: ``with tok`` = part / bare; ``without tok`` =
  (part - tokenize) / bare for the parts that tokenize.

The machine's load average (``os.getloadavg``) is printed before and after.

``--path torch|kernel`` chooses how the per-head statistics are computed in every part
(:func:`probe.measures.kernel.stats_path`: the tensor operations, or one compiled pass per call,
which falls back to the tensor operations where numba is missing). After the table, the statistics'
own time per call (:func:`probe.measures.stats.map_sums`) is printed for both paths, side by side:
the first ``--calls`` calls of one ``analyze()`` run are recorded, then each path runs them over the
same interleaved repeats (minimum per call, microseconds).

``--dtype bfloat16`` (or float16) loads the model in that dtype for every part (the statistics are
still computed in float32 and summed in float64); the table's first line says the dtype.

Usage: python benchmarks/bench_floor.py [--model minilm] [--n 500] [--repeats 3] [--batch-size 16]
                                        [--threads 2] [--corpus FILE] [--json OUT] [--dtype float32]
                                        [--clock wall|cpu] [--path torch|kernel] [--calls 64]
Goals (issue 19): default <= 1.15x and analyze() <= 1.05x the bare sdpa forward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's probe, not an installed one
import bench_capture  # noqa: E402

#: Sentences per model by default (issue 19's measurement).
DEFAULT_N = {"minilm": 500, "smollm2": 200}


#: Where the UD English EWT dev set lies: beside the checkout (bench_capture.UD), or in the machine's shared folder.
UD_PLACES = (bench_capture.UD, Path("/work/shared/data/ud-ewt/en_ewt-ud-dev.conllu"))


def texts_for(n: int, path: str | None) -> tuple[list[str], str]:
    """``n`` texts from ``path`` (plain text or CoNLL-U, repeated to n), else UD EWT dev, else the sample."""
    if path is None:
        path = next((str(p) for p in UD_PLACES if p.exists()), None)
    if path is None:
        return bench_capture.corpus(n)
    from probe.text.corpus import read_corpus

    texts = read_corpus(path)
    while len(texts) < n:
        texts = texts + texts
    return texts[:n], path


#: The clock parts are timed with: ``wall`` (time.perf_counter) or ``cpu`` (time.process_time: this
#: process's CPU seconds, all threads; on a machine shared with other work, where wall time includes
#: waiting for a core, the CPU time of a one-thread run is the steadier measure of the work).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(fn, clock: str = "wall") -> float:
    now = CLOCKS[clock]
    t = now()
    fn()
    return now() - t


def sdpa_pass(lm, batches) -> None:
    """The floor: one bare forward pass over ``batches`` with sdpa attention (no probabilities), the
    model switched back to eager afterwards."""
    from probe.capture.maps import forward

    lm.model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            for b in batches:
                forward(lm, b)
    finally:
        lm.model.set_attn_implementation("eager")


def parts(lm, texts: list[str], batch_size: int) -> dict:
    """name -> zero-argument function running that part once."""
    from probe.capture.maps import forward
    from probe.patterns import CircuitProbe, circuit_probe, pattern_accumulators
    from probe.patterns.circuits import SINK_TEXTS
    from probe.runs.analysis import analyze
    from probe.text.inputs import as_texts, iter_batches

    batches = list(iter_batches(lm, as_texts(texts), batch_size=batch_size))

    def tokenize():
        list(iter_batches(lm, as_texts(texts), batch_size=batch_size))

    def bare():
        sdpa_pass(lm, batches)

    def eager():
        with torch.no_grad():
            for b in batches:
                forward(lm, b, output_attentions=True)

    def analyze_default():
        analyze(lm, texts, batch_size=batch_size)

    decoder = CircuitProbe.refusal(lm) is None

    def cli_default():  # probe/cli/analyze.py's defaults: distances, types, health (+ circuits on decoders)
        finished = [circuit_probe(lm, sink_texts=texts[:SINK_TEXTS])] if decoder else []
        extra = [a for a in pattern_accumulators(lm) if a.refusal(lm) is None]
        analyze(lm, texts, batch_size=batch_size, accumulators=extra, finished=finished)

    return {"bare sdpa": bare, "eager + output_attentions": eager, "analyze()": analyze_default,
            "default probe analyze": cli_default, "tokenize": tokenize}


#: Parts that tokenize their texts inside the timed call.
TOKENIZING = ("analyze()", "default probe analyze")


def run(model: str, n: int, repeats: int, batch_size: int, corpus: str | None, dtype: str = "float32",
        clock: str = "wall", calls: int = 64) -> dict:
    from probe.loading.models import load_model

    texts, source = texts_for(n, corpus)
    lm = load_model(model, dtype=dtype)
    fns = parts(lm, texts, batch_size)
    for fn in fns.values():  # warm-up: first-call costs (allocator, caches) out of the medians
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, clock))
    med = {name: statistics.median(v) for name, v in times.items()}
    from probe.measures.kernel import PATH_ENV

    out = {"model": model, "dtype": dtype, "n": n, "source": source, "batch_size": batch_size, "repeats": repeats,
           "threads": torch.get_num_threads(), "clock": clock, "path": os.environ.get(PATH_ENV, "kernel"),
           "times": times, "median_s": med, "min_s": {name: min(v) for name, v in times.items()}}
    if calls:
        out["map_sums"] = per_call(lm, texts, batch_size, repeats, calls, clock)
    return out


def per_call(lm, texts: list[str], batch_size: int, repeats: int, limit: int, clock: str = "wall") -> dict:
    """The statistics' own time per call on both paths: the first ``limit`` calls of
    :func:`probe.measures.stats.map_sums` in one ``analyze()`` run, recorded, then timed on each path
    over ``repeats`` interleaved rounds with ``clock`` (each call's minimum; the sums of those minima
    / calls, s)."""
    from probe.measures import stats
    from probe.runs.analysis import analyze

    calls, original = [], stats.map_sums

    def record(a, w, norms=None, scores=None, path=None):
        if len(calls) < limit:
            calls.append((a.clone(), w, None if norms is None else norms.clone(), scores))
        return original(a, w, norms, scores, path)

    stats.map_sums = record
    try:
        analyze(lm, texts, batch_size=batch_size)
    finally:
        stats.map_sums = original
    best = {path: [float("inf")] * len(calls) for path in ("torch", "kernel")}
    for path in best:  # warm-up (the kernel's first call loads it)
        original(*calls[0], path=path)
    for _ in range(repeats):
        for path, mins in best.items():
            for i, call in enumerate(calls):
                mins[i] = min(mins[i], timed(lambda c=call, p=path: original(*c, path=p), clock))
    shapes = sorted({tuple(c[0].shape) for c in calls})
    return {"calls": len(calls), "shapes": [shapes[0], shapes[-1]],
            "per_call_s": {path: sum(m) / len(m) for path, m in best.items()}}


def table(r: dict, load_before, load_after) -> str:
    med = r["median_s"]
    bare, tok = med["bare sdpa"], med["tokenize"]
    lines = [f"{r['model']} ({r.get('dtype', 'float32')}): {r['n']} texts ({r['source']}), "
             f"batch {r['batch_size']}, {r['threads']} threads, "
             f"{r['repeats']} interleaved repeats, {r.get('clock', 'wall')} clock, statistics path "
             f"{r.get('path', 'torch')}; load average before {load_before}, "
             f"after {load_after}",
             f"{'part':<28}{'median s':>10}{'tokenizes':>11}{'x bare (with tok)':>19}{'x bare (without tok)':>22}"
             f"{'min s':>9}{'min x bare':>12}"]
    for name in ("bare sdpa", "eager + output_attentions", "analyze()", "default probe analyze", "tokenize"):
        t = med[name]
        inside = name in TOKENIZING
        without = (t - tok) / bare if inside else t / bare
        low = r.get("min_s", med)
        lines.append(f"{name:<28}{t:>10.3f}{'yes' if inside else 'no':>11}{t / bare:>18.2f}x{without:>21.2f}x"
                     f"{low[name]:>9.3f}{low[name] / low['bare sdpa']:>11.2f}x")
    if "map_sums" in r:
        m = r["map_sums"]
        t, k = m["per_call_s"]["torch"], m["per_call_s"]["kernel"]
        lines.append(f"statistics per call (map_sums, first {m['calls']} calls, maps {m['shapes'][0]} to "
                     f"{m['shapes'][1]}): torch {1e6 * t:.0f} us, kernel {1e6 * k:.0f} us ({t / k:.2f}x)")
    lines.append("with tok: the part as timed / bare sdpa (bare and eager never tokenize; analyze() and the default "
                 "tokenize inside); without tok: (part - tokenize) / bare sdpa. Goals: default <= 1.15x, "
                 "analyze() <= 1.05x.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=None, help="texts [default: 500 minilm, 200 smollm2, else 200]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--json", default=None, help="also write the raw times here")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="parameter dtype of the model in every part")
    parser.add_argument("--clock", default="wall", choices=tuple(CLOCKS),
                        help="wall seconds, or this process's CPU seconds (steadier on a shared machine)")
    parser.add_argument("--path", default=None, choices=("torch", "kernel"),
                        help="how the statistics are computed [default: PROBE_STATS_PATH, else kernel]")
    parser.add_argument("--calls", type=int, default=64,
                        help="statistics calls timed on both paths after the table (0: none)")
    args = parser.parse_args()
    if args.path:
        from probe.measures.kernel import PATH_ENV

        os.environ[PATH_ENV] = args.path
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (medians of interleaved repeats)")
    torch.set_num_threads(args.threads)
    before = tuple(round(x, 2) for x in os.getloadavg())
    r = run(args.model, args.n or DEFAULT_N.get(args.model, 200), args.repeats, args.batch_size, args.corpus,
            args.dtype, args.clock, args.calls)
    after = tuple(round(x, 2) for x in os.getloadavg())
    print(table(r, before, after))
    if args.json:
        Path(args.json).write_text(json.dumps({**r, "load_before": before, "load_after": after}, indent=1))


if __name__ == "__main__":
    main()
