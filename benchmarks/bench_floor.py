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

``--threads 1,2`` (the default: 1 and torch's default count, :func:`probe.threads.cores`) measures every
part at each thread count in the same process, interleaved (each repeat runs every part at every count,
:func:`probe.threads.set_threads` sizing torch's and numba's pools), prints one table per count and
then the ratios side by side (minima of the repeats): the statistics' overlap with the forward pass
(:mod:`probe.runs.overlap`) is meant to keep the ratios at the default count no worse than at one.
``analyze()`` and ``default probe analyze`` run with ``PROBE_OVERLAP`` as the environment has it (unset: ``auto``,
the overlap where torch leaves a core over or the machine is busy at the start, :class:`probe.runs.overlap.Policy`);
``--serial`` adds ``analyze() serial`` and ``default serial``, the two parts with the serial loop
(``PROBE_OVERLAP=0``), and ``--overlapped`` adds ``analyze() overlapped`` and ``default overlapped``, the two parts
always overlapped (``PROBE_OVERLAP=1``), to every round. Each thread count's table ends with what ``auto``
chose in each timed run of the two parts (``PROBE_OVERLAP`` unset).

``--path torch|kernel`` chooses how the per-head statistics are computed in every part
(:func:`probe.measures.kernel.stats_path`: the tensor operations, or one compiled pass per call,
which falls back to the tensor operations where numba is missing). After the table, the statistics'
own time per call (:func:`probe.measures.stats.map_sums`) is printed for both paths, side by side:
the first ``--calls`` calls of one ``analyze()`` run are recorded, then each path runs them over the
same interleaved repeats (minimum per call, microseconds).

``--dtype bfloat16`` (or float16) loads the model in that dtype for every part (the statistics are
still computed in float32 and summed in float64); the table's first line says the dtype.

Usage: python benchmarks/bench_floor.py [--model minilm] [--n 500] [--repeats 3] [--batch-size 16]
                                        [--threads 1,2] [--corpus FILE] [--json OUT] [--dtype float32]
                                        [--clock wall|cpu] [--path torch|kernel] [--calls 64]
Goals (issue 19): default <= 1.15x and analyze() <= 1.05x the bare sdpa forward; issue 49 on the way,
at torch's default thread count: default <= 1.35x and analyze() <= 1.15x.
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


def parts(lm, texts: list[str], batch_size: int, serial: bool = False, overlapped: bool = False) -> dict:
    """name -> zero-argument function running that part once (with ``serial``, also analyze() and the
    default analysis with the serial loop: ``analyze() serial``, ``default serial``; with ``overlapped``,
    always overlapped: ``analyze() overlapped``, ``default overlapped``)."""
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

    out = {"bare sdpa": bare, "eager + output_attentions": eager, "analyze()": analyze_default,
           "default probe analyze": cli_default, "tokenize": tokenize}
    if serial:  # the same two parts with the accumulators in the forward pass's thread (PROBE_OVERLAP=0)
        out["analyze() serial"] = lambda: with_overlap("0", analyze_default)
        out["default serial"] = lambda: with_overlap("0", cli_default)
    if overlapped:  # the same two parts with every whole-map batch overlapped (PROBE_OVERLAP=1)
        out["analyze() overlapped"] = lambda: with_overlap("1", analyze_default)
        out["default overlapped"] = lambda: with_overlap("1", cli_default)
    return out


def with_overlap(value: str, fn) -> None:
    """``fn()`` with :data:`probe.runs.overlap.ENV` set to ``value``, restored afterwards."""
    from probe.runs.overlap import ENV

    before = os.environ.get(ENV)
    os.environ[ENV] = value
    try:
        fn()
    finally:
        if before is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = before


#: Parts that tokenize their texts inside the timed call.
TOKENIZING = ("analyze()", "default probe analyze", "analyze() serial", "default serial", "analyze() overlapped",
              "default overlapped")
#: The parts in the order of the tables.
ORDER = ("bare sdpa", "eager + output_attentions", "analyze()", "analyze() serial", "analyze() overlapped",
         "default probe analyze", "default serial", "default overlapped", "tokenize")
#: The parts that run with the environment's PROBE_OVERLAP (unset: auto), whose choices are recorded.
AUTO = ("analyze()", "default probe analyze")


def run(model: str, n: int, repeats: int, batch_size: int, corpus: str | None, dtype: str = "float32",
        clock: str = "wall", calls: int = 64, threads: tuple[int, ...] = (2,), serial: bool = False,
        overlapped: bool = False) -> list[dict]:
    """One result per thread count in ``threads``, measured interleaved in this process (with ``serial``,
    the serial loop's analyze() and default analysis beside the others; with ``overlapped``, the
    always-overlapped ones)."""
    from probe.loading.models import load_model
    from probe.measures.kernel import PATH_ENV
    from probe.threads import set_threads

    texts, source = texts_for(n, corpus)
    lm = load_model(model, dtype=dtype)
    fns = parts(lm, texts, batch_size, serial, overlapped)
    for t in threads:  # warm-up: first-call costs (allocator, caches, each pool's start) out of the medians
        set_threads(t)
        for fn in fns.values():
            fn()
    times = {t: {name: [] for name in fns} for t in threads}
    chosen = {t: {name: [] for name in AUTO} for t in threads}
    for _ in range(repeats):
        for t in threads:
            set_threads(t)
            for name, fn in fns.items():
                times[t][name].append(timed(fn, clock))
                if name in AUTO:
                    chosen[t][name].append(choice())
    out = []
    for t in threads:
        set_threads(t)
        med = {name: statistics.median(v) for name, v in times[t].items()}
        r = {"model": model, "dtype": dtype, "n": n, "source": source, "batch_size": batch_size, "repeats": repeats,
             "threads": torch.get_num_threads(), "clock": clock, "path": os.environ.get(PATH_ENV, "kernel"),
             "overlap": os.environ.get("PROBE_OVERLAP", "auto"),
             "times": times[t], "median_s": med, "min_s": {name: min(v) for name, v in times[t].items()},
             "auto": chosen[t]}
        if calls:
            r["map_sums"] = per_call(lm, texts, batch_size, repeats, calls, clock)
        out.append(r)
    return out


def choice() -> str:
    """What the overlap policy of the analysis run last did (:data:`probe.runs.overlap.LAST`): ``serial``
    (no overlap applies) or the policy's choice and its reason, e.g. ``serial (quiet, load 1.2)`` or
    ``overlap (busy, load 5.3)``."""
    from probe.runs.overlap import LAST

    reason = LAST.get("reason", "")
    if reason.startswith("serial"):
        return "serial"
    load = LAST.get("load")
    where = reason if load is None else f"{reason}, load {load}"
    return f"{'overlap' if LAST.get('overlapped') else 'serial'} ({where})"


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
    for name in (n for n in ORDER if n in med):
        t = med[name]
        inside = name in TOKENIZING
        without = (t - tok) / bare if inside else t / bare
        low = r.get("min_s", med)
        lines.append(f"{name:<28}{t:>10.3f}{'yes' if inside else 'no':>11}{t / bare:>18.2f}x{without:>21.2f}x"
                     f"{low[name]:>9.3f}{low[name] / low['bare sdpa']:>11.2f}x")
    for name, runs in r.get("auto", {}).items():
        lines.append(f"auto in {name}, each timed run: " + "; ".join(runs))
    if "map_sums" in r:
        m = r["map_sums"]
        t, k = m["per_call_s"]["torch"], m["per_call_s"]["kernel"]
        lines.append(f"statistics per call (map_sums, first {m['calls']} calls, maps {m['shapes'][0]} to "
                     f"{m['shapes'][1]}): torch {1e6 * t:.0f} us, kernel {1e6 * k:.0f} us ({t / k:.2f}x)")
    lines.append("with tok: the part as timed / bare sdpa (bare and eager never tokenize; analyze() and the default "
                 "tokenize inside); without tok: (part - tokenize) / bare sdpa. Goals: default <= 1.15x, "
                 "analyze() <= 1.05x.")
    return "\n".join(lines)


def side_by_side(results: list[dict]) -> str:
    """The minima's ratios to the bare sdpa forward at each thread count, one column per count."""
    head = "".join(f"{str(r['threads']) + ' thread' + 's' * (r['threads'] > 1):>14}" for r in results)
    lines = [f"side by side (min x bare, with tok; overlap {results[0].get('overlap', 'auto')}):",
             f"{'part':<28}{head}"]
    for name in (n for n in ORDER if n in results[0]["min_s"]):
        cells = "".join(f"{r['min_s'][name] / r['min_s']['bare sdpa']:>13.2f}x" for r in results)
        lines.append(f"{name:<28}{cells}")
    lines.append(f"{'bare sdpa (min s)':<28}" + "".join(f"{r['min_s']['bare sdpa']:>13.3f}s" for r in results))
    return "\n".join(lines)


def thread_counts(text: str) -> tuple[int, ...]:
    """``--threads``: comma-separated counts >= 1 (``default``: torch's default, :func:`probe.threads.cores`)."""
    from probe.threads import cores

    counts = tuple(cores() if x.strip() == "default" else int(x) for x in text.split(","))
    if not counts or min(counts) < 1:
        raise ValueError(text)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=None, help="texts [default: 500 minilm, 200 smollm2, else 200]")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=thread_counts, default="1,default",
                        help="thread counts measured side by side, comma-separated [default: 1,default]")
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--json", default=None, help="also write the raw times here")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="parameter dtype of the model in every part")
    parser.add_argument("--clock", default="wall", choices=tuple(CLOCKS),
                        help="wall seconds, or this process's CPU seconds (steadier on a shared machine)")
    parser.add_argument("--path", default=None, choices=("torch", "kernel"),
                        help="how the statistics are computed [default: PROBE_STATS_PATH, else kernel]")
    parser.add_argument("--serial", action="store_true",
                        help="also analyze() and the default analysis with the serial loop (PROBE_OVERLAP=0)")
    parser.add_argument("--overlapped", action="store_true",
                        help="also analyze() and the default analysis always overlapped (PROBE_OVERLAP=1)")
    parser.add_argument("--calls", type=int, default=64,
                        help="statistics calls timed on both paths after the table (0: none)")
    args = parser.parse_args()
    if args.path:
        from probe.measures.kernel import PATH_ENV

        os.environ[PATH_ENV] = args.path
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (medians of interleaved repeats)")
    before = tuple(round(x, 2) for x in os.getloadavg())
    results = run(args.model, args.n or DEFAULT_N.get(args.model, 200), args.repeats, args.batch_size, args.corpus,
                  args.dtype, args.clock, args.calls, args.threads, args.serial, args.overlapped)
    after = tuple(round(x, 2) for x in os.getloadavg())
    print("\n\n".join(table(r, before, after) for r in results))
    if len(results) > 1:
        print()
        print(side_by_side(results))
    if args.json:
        Path(args.json).write_text(json.dumps([{**r, "load_before": before, "load_after": after} for r in results],
                                              indent=1))


if __name__ == "__main__":
    main()
