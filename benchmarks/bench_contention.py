"""Benchmark: probe's runs beside CPU-bound processes, under the old thread policy and probe's
(:mod:`probe.threads`), side by side in one run.

Each policy has a fresh process (the OpenMP runtimes read their policy once, when loaded) that loads the
model, warms up on two sentences (numba's kernel loaded, first-call costs paid), then times one fixed
workload each time it is asked (waiting, it uses no CPU): wall seconds and the CPU seconds of all its
threads. It runs alone, beside 1 and beside 3 busy processes (each a pure Python loop: one core's worth
of demand), for each policy:

  - ``old``: what probe did before ``probe.threads``: ``OMP_WAIT_POLICY`` unset (OpenMP's default: a
    waiting worker spins for a while), torch's default thread count;
  - ``active``: ``OMP_WAIT_POLICY=ACTIVE`` (workers spin until work comes), torch's default threads;
  - ``new``: probe's policy (``OMP_WAIT_POLICY=PASSIVE``, threads = the cores this process may use);
  - ``new1``: probe's policy and ``probe.set_threads(1)`` (``probe --threads 1``).

Rounds are interleaved (for each repeat, each load, each policy) and the median is reported; the table
gives each cell's wall time, its ratio to the same policy alone, and its ratio to ``old`` at the same
load. A perfectly fair share on C cores beside B busy processes would cost about max(1, (B + T) / C)
times the time alone for T working threads; the policies are compared with that in mind. The machine's
load (``os.getloadavg``) is printed before and after: other users of the machine are part of "alone".

Workloads: ``analyze`` (``probe.analyze`` on minilm, 24 sentences of the built-in sample),
``analyze-smollm2`` (the same on SmolLM2, the workload of issue 49 item 7), ``patch`` (``probe.patch_heads``
on SmolLM2, 2 built-in pairs; slow: at load 10 its old and new processes took 6 minutes to be ready,
their warm-up a patching of one pair, and the first rounds did not end within the next 4).

Usage: python benchmarks/bench_contention.py [--quick] [--workloads analyze,patch] [--busy 0,1,3]
                                             [--policies old,new,new1] [--repeats 3]
``--quick``: analyze on minilm, loads 0, 1 and 3, policies old and new, 2 repeats (about 1-3 minutes on
two cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: The variables probe's policy writes (:mod:`probe.threads`); a measurement's process starts without them.
POLICY_VARS = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "PROBE_THREADS")
POLICIES = ("old", "active", "new", "new1")
WORKLOADS = ("analyze", "analyze-smollm2", "patch")
#: A busy process: one core's worth of pure Python work until it is killed.
BUSY = "while True:\n    pass\n"


def texts(n: int = 24) -> list[str]:
    """``n`` sentences of the built-in sample (repeated where it has fewer)."""
    from probe.text.corpus import sample_texts

    out = sample_texts()
    while len(out) < n:
        out = out + out
    return out[:n]


def child(workload: str, policy: str) -> None:
    """A measuring process: applies ``policy``, loads the model, warms up, says ``ready``; then runs the
    workload once per line ``run`` read on stdin, printing one JSON line each, until stdin closes. It
    waits on stdin (no CPU) while the other policies' processes are measured."""
    given = {k: os.environ.get(k) for k in POLICY_VARS}
    import probe  # applies probe's policy to this process's environment, before torch loads

    if policy in ("old", "active"):  # undo it before torch and numba read it: what probe did before
        for k, v in given.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if policy == "active":
            os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    elif policy == "new1":
        probe.set_threads(1)
    import torch

    from probe.loading.models import load_model

    lm = load_model("minilm" if workload == "analyze" else "smollm2")
    if workload == "patch":
        from probe.text.pairfile import builtin_pairs

        pairs = builtin_pairs()[:2]
        probe.patch_heads(lm, pairs[:1])  # warm-up
        run = lambda: probe.patch_heads(lm, pairs)  # noqa: E731
    else:
        sentences = texts()
        probe.analyze(lm, sentences[:2])  # warm-up: numba's kernel loaded, first-call costs paid
        run = lambda: probe.analyze(lm, sentences)  # noqa: E731
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"wall": wall, "cpu": cpu, "threads": torch.get_num_threads(),
                          "wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)")}), flush=True)


class Measurer:
    """A measuring process (:func:`child`) for one workload and policy, started without the policy
    variables in its environment."""

    def __init__(self, workload: str, policy: str):
        env = {k: v for k, v in os.environ.items() if k not in POLICY_VARS}
        self.name = f"{workload}/{policy}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", workload, "--policy", policy], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name} ended (exit status {self.proc.wait()}); its error is above")
        return line.strip()

    def ready(self) -> None:
        while self._line() != "ready":
            pass

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        return json.loads(self._line())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def busy(n: int) -> list[subprocess.Popen]:
    """``n`` busy processes (started; kill them with :func:`stop`)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="analyze on minilm, policies old and new, 2 repeats")
    ap.add_argument("--workloads", default="analyze", help=f"comma-separated, from {', '.join(WORKLOADS)}")
    ap.add_argument("--busy", default="0,1,3", help="busy processes beside the run, comma-separated")
    ap.add_argument("--policies", default="old,active,new,new1", help=f"comma-separated, from {', '.join(POLICIES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--policy", choices=POLICIES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.policy)
        return
    if args.quick:
        args.workloads, args.policies, args.repeats = "analyze", "old,new", 2
    workloads = args.workloads.split(",")
    counts = [int(b) for b in args.busy.split(",")]
    policies = args.policies.split(",")
    bad = [w for w in workloads if w not in WORKLOADS] + [p for p in policies if p not in POLICIES]
    if bad:
        raise SystemExit(f"unknown workload or policy: {', '.join(bad)}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} cores usable; load average before: {load()}; {args.repeats} repeat(s), median shown")
    started = time.perf_counter()
    results: dict[tuple, list[dict]] = {}
    for workload in workloads:
        measurers = {p: Measurer(workload, p) for p in policies}
        try:
            for m in measurers.values():
                m.ready()
            print(f"{workload}: processes ready after {time.perf_counter() - started:.0f} s; load {load()}")
            for r in range(args.repeats):
                for b in counts:
                    procs = busy(b)
                    try:
                        time.sleep(0.5 if b else 0)
                        order = policies[r % len(policies):] + policies[:r % len(policies)]  # each policy first once
                        for policy in order:
                            results.setdefault((workload, b, policy), []).append(measurers[policy].run())
                    finally:
                        stop(procs)
        finally:
            for m in measurers.values():
                m.close()
    print(f"load average after: {load()}; {time.perf_counter() - started:.0f} s in all\n")
    for workload in workloads:
        print(f"{workload}: wall s (x its time alone; x old at that load) | CPU s of the run's threads")
        heads = [f"{p} ({results[(workload, counts[0], p)][0]['threads']} thr)" for p in policies]
        print(f"{'busy':>5} " + " ".join(f"{h:>32}" for h in heads))
        med = {k: (statistics.median(r["wall"] for r in v), statistics.median(r["cpu"] for r in v))
               for k, v in results.items() if k[0] == workload}
        for b in counts:
            cells = []
            for p in policies:
                wall, cpu = med[(workload, b, p)]
                alone = med[(workload, counts[0], p)][0]
                old = med[(workload, b, policies[0])][0]
                cells.append(f"{wall:6.2f} (x{wall / alone:4.1f}; x{wall / old:4.2f}) | {cpu:5.1f}")
            print(f"{b:>5} " + " ".join(f"{c:>32}" for c in cells))
        print()


if __name__ == "__main__":
    main()
