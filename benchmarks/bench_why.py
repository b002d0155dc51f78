"""Benchmark and measurement: ``probe.why`` on the embedded models.

SmolLM2: 100 random whole-word tokens repeated (200 tokens). For each induction head (default L17H4,
L23H2, L23H7) and a few query rows of the second copy: the key the head attends to most, whether it is
the induction target (the token after the earlier copy of the query's token), the check, and at that
key the largest key-side and query-side sources (sum over the other side) with their share of the
score and each source head's label (a short analysis of the built-in sample plus the decoder circuit
probe, as ``probe why`` labels heads). Time of one head and row, beside one plain forward pass of the
same 200 tokens on the same machine (the ratio is the figure to compare across machines).

minilm: its heads labelled previous-token on the built-in sample, on one sentence: the same sources.

With --corpus-heads: the contributions of those heads averaged over every row of --texts repeated
sequences whose top key is the induction target (probe.qk.corpus).

With --timing: the time goal, one head and row over 200 tokens (repeated random words) and one head
over a 200-sentence corpus (examples/corpus.txt, the UD sample's sentences and the built-in sample,
cycled to --sentences), each beside a bare forward pass of the same input (no capture, no hooks) and
the machine's load (os.getloadavg, as uptime prints it); run it from two checkouts to compare code.

With --labels: the labels' cost (issue 49 item 5), in one run on one loaded model: the code before (the split
and the labelling analysis of the text plus the sample, on every call), the first call with no labels cached
(computed and written), a first call of a new process once they are on disk (memory cleared), a second call on
the same model with another text (memory), and the split alone (probe.qk.run.measure); each run_why + save of
the folder, with its ratio to the split alone. The cache folder is a temporary one (--cache to keep one).

With --command: the command's own time (issue 49 item 5: "probe why ... within 3 s beyond loading the
model"), each in a fresh process from a neutral folder, this checkout beside --baseline (another checkout's
root, e.g. ``git archive main probe | tar -x -C /tmp/base``), interleaved, the best of --repeats (the machine's
load only adds): ``python -c "import probe"``, ``probe --help``, and ``probe why --model smollm2 --head L23H2``
on the IOI sentence into a new folder: its wall time and CPU time, run.json's model_load_s (loading the
weights, the model class's import included), the rest (the wall time beyond the load: the interpreter,
probe's, torch's and transformers' imports, the config read, the split, the page) and the page (report_s);
then the same steps timed one by one in one process; beside them the floor of any process that loads SmolLM2
(``import torch, transformers`` and the Llama config and model modules, no probe).

Usage: PYTHONPATH=. python benchmarks/bench_why.py --command --baseline /tmp/base [--repeats 5]
       PYTHONPATH=. python benchmarks/bench_why.py --labels [--timing-heads L23H2] [--cache DIR]
       PYTHONPATH=. python benchmarks/bench_why.py [--heads L17H4,L23H2,L23H7] [--rows 150,175,199] [--skip-minilm]
       PYTHONPATH=. python benchmarks/bench_why.py --corpus-heads L17H4,L17H5,L18H6,L23H2 --texts 2
       PYTHONPATH=. python benchmarks/bench_why.py --timing [--timing-heads L17H4,L23H2] [--sentences 200]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import probe
from probe.patterns import CircuitProbe, circuit_probe
from probe.qk.corpus import why_corpus
from probe.qk.table import source_shares
from probe.sites import head_name
from probe.text.corpus import sample_texts


def labels_of(lm) -> dict:
    finished = [circuit_probe(lm)] if CircuitProbe.refusal(lm) is None else []
    heads = probe.analyze(lm, sample_texts(), finished=finished).heads
    return {head_name(int(r.layer), int(r.head)): str(r.label) for r in heads.itertuples()}


def sides(w, key: int, labels: dict, n: int = 3) -> tuple[str, str]:
    shares = source_shares(w, key)
    s = w.scores[key]
    out = []
    for side in ("key_side", "query_side"):
        top = shares.reindex(shares[side].abs().sort_values(ascending=False).index).head(n)
        out.append(", ".join(f"{r.source}{' (' + labels[r.source] + ')' if r.source in labels else ''} "
                             f"{getattr(r, side) / s:+.2f}" for r in top.itertuples()))
    return out[0], out[1]


def repeated_text(lm, n: int = 100, seed: int = 0) -> str:
    words = sorted(w for w in lm.tokenizer.get_vocab() if w.startswith("Ġ") and w[1:].isalpha() and len(w) > 3)
    g = torch.Generator().manual_seed(seed)
    pick = [words[k] for k in torch.randint(len(words), (n,), generator=g).tolist()]
    once = lm.tokenizer.convert_tokens_to_string(pick)
    return once + once


def smollm2(heads: list[str], rows: list[int]) -> None:
    lm = probe.load_model("smollm2")
    text = repeated_text(lm)
    ids = probe.capture_attention(lm, text).batch.input_ids[0]
    T = len(ids)
    print(f"SmolLM2, {T} tokens (100 random words twice), float32, {torch.get_num_threads()} threads")
    t = time.perf_counter()
    probe.capture_attention(lm, text)
    forward = time.perf_counter() - t
    labels = labels_of(lm)
    print(f"one forward pass with capture: {forward:.2f} s; heads labelled induction: "
          f"{sorted(k for k, v in labels.items() if v == 'induction')}; previous-token: "
          f"{sorted(k for k, v in labels.items() if v == 'previous-token')}")
    for head in heads:
        for i in rows:
            t = time.perf_counter()
            w = probe.why(lm, text, head, query=i)
            dt = time.perf_counter() - t
            key = w.top_keys(1)[0]
            earlier = [j for j in range(i) if int(ids[j]) == int(ids[i])]
            target = earlier[-1] + 1 if earlier else None
            ks, qs = sides(w, key, labels)
            print(f"{head} ({labels.get(head)}) row {i}: {dt:.2f} s ({dt / forward:.1f} forward passes), residual "
                  f"{w.residual:.2g}; top key {key} (A {w.pattern[key]:.3f}; induction target {target}, A "
                  f"{w.pattern[target] if target is not None else float('nan'):.3f}), s {w.scores[key]:.3g}")
            if target is not None:
                ks, qs = sides(w, target, labels)
                print(f"    at the induction target {target}: key side {ks}; query side {qs}")


def smollm2_corpus(heads: list[str], texts: int) -> None:
    """probe.qk.corpus.why_corpus over ``texts`` repeated random-word sequences (seeds 0 ..), label induction."""
    lm = probe.load_model("smollm2")
    labels = labels_of(lm)
    corpus = [repeated_text(lm, seed=k) for k in range(texts)]
    for head in heads:
        c = why_corpus(lm, corpus, head, "induction")
        print(f"{c.sentence(labels, n=3)}; residual {c.residual:.2g}; {c.seconds:.1f} s")


def minilm() -> None:
    lm = probe.load_model("minilm")
    labels = labels_of(lm)
    prev = sorted((k for k, v in labels.items() if v == "previous-token"), key=lambda k: (len(k), k))
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat."
    print(f"minilm: heads labelled previous-token: {prev}")
    for head in prev:
        keys_side, hits = [], 0
        w0 = probe.why(lm, text, head, query=1)
        n = len(w0.tokens)
        for i in range(1, n - 1):
            w = probe.why(lm, text, head, query=i)
            key = w.top_keys(1)[0]
            hits += key == i - 1
            M = w.matrix(i - 1)
            keys_side.append((M.sum(0) / w.scores[i - 1], M.sum(1) / w.scores[i - 1], w.residual))
        k = np.mean([x[0] for x in keys_side], 0)
        q = np.mean([x[1] for x in keys_side], 0)
        order_k, order_q = np.argsort(-np.abs(k))[:3], np.argsort(-np.abs(q))[:3]
        print(f"{head}: top key = i - 1 on {hits}/{n - 2} rows; worst residual {max(x[2] for x in keys_side):.2g}; "
              f"mean share at j = i - 1, key side: " + ", ".join(f"{w.sources[a]} {k[a]:+.2f}" for a in order_k)
              + "; query side: " + ", ".join(f"{w.sources[a]} {q[a]:+.2f}" for a in order_q))


def corpus_sentences(n: int) -> list[str]:
    """``n`` sentences: examples/corpus.txt, the UD sample's, the built-in sample, cycled."""
    from probe.text.corpus import read_corpus

    root = Path(__file__).resolve().parents[1] / "examples"
    base = [line.strip() for line in (root / "corpus.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    base += [t if isinstance(t, str) else t.text for t in read_corpus(str(root / "ud-sample.conllu"))]
    base += sample_texts()
    return [base[k % len(base)] for k in range(n)]


def timing(heads: list[str], sentences: int, repeats: int = 3) -> None:
    """The time goal: probe.why on one row of 200 tokens, why_corpus over ``sentences`` sentences, each
    beside bare forward passes of the same inputs, with the load average before and after."""
    import os

    from probe.capture.maps import encode, forward

    lm = probe.load_model("smollm2")
    text = repeated_text(lm)
    corpus = corpus_sentences(sentences)

    def bare(texts) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            for x in texts:
                forward(lm, encode(lm, [x]))
        return time.perf_counter() - t

    probe.why(lm, text, heads[0], query=199)  # warm: first calls
    print(f"load average before: {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads; probe from "
          f"{probe.__file__}")
    for head in heads:
        one = []
        for _ in range(repeats):
            f = bare([text])
            t = time.perf_counter()
            w = probe.why(lm, text, head, query=199)
            one.append((time.perf_counter() - t, f))
        best = min(one)
        print(f"{head} row 199 of {len(w.tokens)} tokens: why {best[0]:.2f} s, bare forward {best[1]:.2f} s, ratio "
              f"{best[0] / best[1]:.2f} (best of {repeats}); residual {w.residual:.2g}, top key {w.top_keys(1)[0]}")
    f = bare(corpus)
    t = time.perf_counter()
    c = why_corpus(lm, corpus, heads[0], "previous-token")
    dt = time.perf_counter() - t
    print(f"{heads[0]} over {sentences} sentences: why_corpus {dt:.1f} s, bare forward of each {f:.1f} s, ratio "
          f"{dt / f:.2f}; rows {c.rows}, mean score {c.mean_score:.6g}, residual {c.residual:.2g}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def labels_timing(head: str, cache: str | None, repeats: int = 5) -> None:
    """The labels' cost: see the module docstring (--labels)."""
    import os
    import tempfile

    import probe.qk.labels as labels
    from probe.qk.run import measure
    from probe.report import write_run
    from probe.runs.analysis import analyze
    from probe.settings import WhySettings

    folder = cache or tempfile.mkdtemp(prefix="probe-labels-")
    labels.cache_dir = lambda: Path(folder)  # the benchmark's own cache folder; the model's stays where it is
    out = Path(tempfile.mkdtemp(prefix="probe-why-"))
    t = time.perf_counter()
    lm = probe.load_model("smollm2")
    load = time.perf_counter() - t
    texts = ["The cat sat on the mat. The cat", "When Mary and John went to the store, John gave a drink to Mary."]
    print(f"load average before: {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads; model load {load:.1f} s; "
          f"label cache {folder}; probe from {probe.__file__}")
    measure(lm, texts[0], head)  # warm: first calls
    measure(lm, texts[1], head)

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    n = [0]

    def before() -> None:  # the code before: the split, the analysis of the text and the sample, the folder
        n[0] += 1
        r = measure(lm, texts[1], head)
        a = analyze(lm, [texts[1]] + sample_texts(), finished=[circuit_probe(lm)])
        r.labels, a.results["why"] = labels.label_map(a), r
        write_run(a, lm.tokenizer, out / f"run-{n[0]}")

    t = time.perf_counter()
    before()  # once: tens of seconds
    old = time.perf_counter() - t
    got = {}

    def call(text: str) -> None:
        n[0] += 1
        t = time.perf_counter()
        run = probe.run_why(lm, WhySettings(head=head, text=text))
        got[text] = (run.measured.seconds["labels_s"], time.perf_counter() - t)
        run.save(out / f"run-{n[0]}")

    labels.forget()
    for p in Path(folder).glob(f"{labels.FOLDER}/*.npz"):
        p.unlink()
    t = time.perf_counter()
    call(texts[1])
    computed = time.perf_counter() - t

    def from_disk() -> None:
        labels.forget()
        call(texts[0])

    disk = best(from_disk)
    disk_labels = got[texts[0]]
    split0 = best(lambda: measure(lm, texts[0], head))
    runs, memory, split1 = [], [], []  # interleaved: the same load on each
    for _ in range(repeats):
        t = time.perf_counter()
        measure(lm, texts[1], head)
        split1.append(time.perf_counter() - t)
        t = time.perf_counter()
        call(texts[1])
        memory.append(time.perf_counter() - t)
        runs.append(got[texts[1]][1])
    memory_labels = got[texts[1]]
    split, memory = [split0, min(split1)], min(memory)
    key = best(lambda: labels.cache_key(lm))
    rows = [("the split alone (measure), text 1", split[0], split[0]), ("the split alone (measure), text 2", split[1],
                                                                         split[1]),
            ("before: split + analysis of text 2 and sample + folder", old, split[1]),
            ("first call, text 2, labels computed and written", computed, split[1]),
            ("first call of a process, text 1, labels on disk", disk, split[0]),
            ("second call, same model, text 2 (labels in memory)", memory, split[1]),
            ("  of which run_why alone (no folder written)", min(runs), split[1])]
    for name, v, base in rows:
        print(f"{name:55s} {v:6.2f} s  x{v / base:5.2f} the split of its text")
    print(f"labels read from disk {disk_labels[0]:.3f} s, from memory {memory_labels[0]:.3f} s (of which the key, the "
          f"weights' fingerprint: {key:.3f} s); before / labels on disk: x{old / disk:.1f}; before / second "
          f"call: x{old / memory:.1f}; load average after: {os.getloadavg()[0]:.2f} (best of {repeats} but the "
          "first call and before; run_why + save of the folder)")


WHY_ARGS = ["why", "--model", "smollm2", "--text", "When Mary and John went to the store, John gave a drink to",
            "--head", "L23H2"]
#: What any process that loads SmolLM2 imports (no probe): the floor under the command's start-up (ended as
#: probe's command ends, without the interpreter's teardown).
LIBRARIES = ("import torch, transformers; from transformers import AutoConfig, AutoTokenizer; "
             "import transformers.models.llama.modeling_llama; import os; os._exit(0)")


#: The command's steps in one process (what ``probe why`` does, timed one by one), printed as JSON: the
#: interpreter and probe's command line, the run call's module (torch, pandas), the config read before the
#: weights (transformers and the Llama config), the load (the model class's import included), the split, the page.
PHASES = """
import json, shutil, sys, time
import probe.cli
from probe.cli.start import started
start = started()
got = {"start-up (interpreter, probe.cli)": time.perf_counter() - start}
last = [time.perf_counter()]
def lap(name):
    now = time.perf_counter(); got[name] = now - last[0]; last[0] = now
import probe.entries.why
lap("import the run call (torch, pandas)")
from probe.loading import models
models.peek_config("smollm2")
lap("config read (transformers, its config)")
lm = models.load_model("smollm2")
lap("model load (model class import, weights)")
from probe.entries.result import Console, folder_result
from probe.qk.run import why_analysis
from probe.settings import WhySettings
s = WhySettings(head="L23H2", text="When Mary and John went to the store, John gave a drink to")
measured, analysis = why_analysis(lm, s.text, s.head, s.query, top=s.top, progress=False, corpus=None, label=None,
                                  target=None)
lap("the split and the labels")
run = folder_result("why", s, lm, analysis, measured, Console(), {"heads": analysis.heads, "why": measured.frame,
                    "shares": measured.shares}, {"contributions": measured.why.contributions})
shutil.rmtree(sys.argv[1], ignore_errors=True)
run.save(sys.argv[1])
lap("the page and the folder")
print(json.dumps(got))
"""


def command_timing(baseline: str | None, repeats: int) -> None:
    """The command's own time: see the module docstring (--command)."""
    import json
    import os
    import resource
    import subprocess
    import sys
    import tempfile

    trees = {"this": str(Path(__file__).resolve().parent.parent)}
    if baseline:
        trees["baseline"] = str(Path(baseline).resolve())
    work = Path(tempfile.mkdtemp(prefix="probe-why-command-"))  # neutral: no checkout on the path but PYTHONPATH's

    cpu = [0.0]

    def wall(args: list[str], root: str | None, keep: list | None = None) -> float:
        env = dict(os.environ, PYTHONPATH=root) if root else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run([sys.executable, *args], cwd=work, env=env, check=True, capture_output=True, text=True)
        if keep is not None:
            keep.append(done.stdout)
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[0] = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime  # the process's user + system seconds
        return time.perf_counter() - t

    got: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    floor = []
    n = 0
    load = [os.getloadavg()[0]]
    wall(["-m", "probe", *WHY_ARGS, "--out", str(work / "warm")], trees["this"])  # the labels cached, files warm
    for _ in range(repeats):
        floor.append(wall(["-c", LIBRARIES], None))
        for name, root in trees.items():
            n += 1
            out = work / f"run-{n}"
            row = got[name]
            row.setdefault("import probe", []).append(wall(["-c", "import probe"], root))
            row.setdefault("probe --help", []).append(wall(["-m", "probe", "--help"], root))
            total = wall(["-m", "probe", *WHY_ARGS, "--out", str(out)], root)
            t = json.loads((out / "run.json").read_text())["timings_s"]
            row.setdefault("probe why: total", []).append(total)
            row.setdefault("  its CPU time (user + system)", []).append(cpu[0])
            row.setdefault("  model load (model_load_s)", []).append(t["model_load_s"])
            row.setdefault("  beyond the load", []).append(total - t["model_load_s"])
            row.setdefault("  the split (why_s)", []).append(t["why_s"])
            row.setdefault("  the page (report_s)", []).append(t["report_s"])
            printed: list[str] = []
            wall(["-c", PHASES, str(work / f"phases-{n}")], root, printed)
            for phase, seconds in json.loads(printed[0].splitlines()[-1]).items():
                row.setdefault(f"  step: {phase}", []).append(seconds)
        load.append(os.getloadavg()[0])
    print(f"best of {repeats}, seconds; load average {min(load):.2f}-{max(load):.2f} (os.getloadavg, as uptime "
          f"prints it); {os.cpu_count()} CPUs")
    names = list(trees)
    print(f"{'':52s}" + "".join(f"{name:>10s}" for name in names) + ("     ratio" if len(names) == 2 else ""))
    for key in got["this"]:
        vals = [min(got[name][key]) for name in names]
        ratio = f"{vals[0] / vals[1]:10.2f}" if len(vals) == 2 and vals[1] else ""
        print(f"{key:52s}" + "".join(f"{v:10.2f}" for v in vals) + ratio)
    print(f"{'libraries alone (no probe: torch, transformers, Llama)':52s}{min(floor):10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", default="L17H4,L23H2,L23H7")
    parser.add_argument("--rows", default="150,175,199")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--corpus-heads", default=None, help="SmolLM2 heads to average over repeated random words "
                        "(label induction), e.g. L17H4,L17H5,L18H6,L23H2; then nothing else runs")
    parser.add_argument("--texts", type=int, default=2)
    parser.add_argument("--timing", action="store_true", help="the time goal only (see the module docstring)")
    parser.add_argument("--timing-heads", default="L17H4,L23H2")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--labels", action="store_true", help="the labels' cost only (see the module docstring)")
    parser.add_argument("--cache", default=None, help="--labels: the label cache folder (default: a temporary one)")
    parser.add_argument("--command", action="store_true", help="the command's own time (see the module docstring)")
    parser.add_argument("--baseline", default=None, help="--command: another checkout's root to compare with")
    parser.add_argument("--repeats", type=int, default=5, help="--command: runs of each (the best is shown)")
    args = parser.parse_args()
    if args.command:
        command_timing(args.baseline, args.repeats)
        return
    if args.labels:
        labels_timing(args.timing_heads.split(",")[-1], args.cache)
        return
    if args.timing:
        timing(args.timing_heads.split(","), args.sentences)
        return
    if args.corpus_heads:
        smollm2_corpus(args.corpus_heads.split(","), args.texts)
        return
    if not args.skip_minilm:
        minilm()
    if not args.skip_smollm2:
        smollm2(args.heads.split(","), [int(r) for r in args.rows.split(",")])


if __name__ == "__main__":
    main()
