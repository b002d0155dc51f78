"""Benchmark: the live page's answers against a bare forward pass of the same text, side by side in one run.

For each model and text length (minilm with 20 tokens, SmolLM2 with 60), interleaved over repeats, each repeat
on a new text of exactly that many tokens (so that no answer comes from the session's cache):
  - bare: the model's own forward pass (no probe hooks, no_grad), inputs tokenized beforehand;
  - edit: what ``POST /api/edit`` does (the session's edit: probe.analyze on the text, the visible layer's head
    view, the model view, the grid's statistics, and the answer's JSON), through probe.live.api.answer;
  - steps + why: ``POST /api/head`` for one head and query (the step view's record and probe.why's split);
  - ablation: ``POST /api/ablate`` with two heads switched off (zero), output before and after and the maps.
Prints each median in ms and its ratio to the bare forward, with uptime's load before and after; beside them the
median CPU time of the process (every thread's) and its ratio to the bare forward's: on a machine other work
shares, the CPU time of a one-thread run (``--threads 1``) moves far less with the load than the wall time.

Usage: python benchmarks/bench_live.py [--repeats 7] [--models minilm:20,smollm2:60] [--threads 2]
Goals (issue 47, on a quiet 2-core CPU): edit <= 150 ms median on minilm/20 and <= 600 ms on SmolLM2/60, within
1.5x of the bare forward where the forward dominates; steps + why < 1 s / < 3 s; ablation <= 2 forward passes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def texts_of(lm, n_tokens: int, count: int) -> list[str]:
    """``count`` different texts of exactly ``n_tokens`` tokens (special tokens included)."""
    from probe.text.corpus import sample_texts

    words = " ".join(sample_texts()).split()
    out, start = [], 0
    while len(out) < count:
        chosen, i = [], start
        while True:
            trial = " ".join(chosen + [words[i % len(words)]])
            n = len(lm.tokenizer(trial)["input_ids"])
            if n <= n_tokens:
                chosen.append(words[i % len(words)])
                if n == n_tokens:
                    out.append(trial)
                    break
            elif n > n_tokens + 3:
                break
            i += 1
            if i - start > 4 * n_tokens:
                break
        start += 7
    return out


def bare(lm, text: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the model's own forward pass of ``text`` (tokenized beforehand)."""
    inputs = lm.tokenizer([text], return_tensors="pt")
    kw = {"use_cache": False} if lm.kind != "encoder" else {}
    t, c = time.perf_counter(), time.process_time()
    with torch.no_grad():
        lm.model(**inputs, **kw)
    return time.perf_counter() - t, time.process_time() - c


def timed(session, route: str, body: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one request as the server answers it (the session's answer and its JSON)."""
    from probe.live.api import answer

    t, c = time.perf_counter(), time.process_time()
    status, out = answer(session, route, body)
    json.dumps(out)
    assert status == 200, out
    return time.perf_counter() - t, time.process_time() - c


def bench(name: str, n_tokens: int, repeats: int) -> None:
    from probe.live.api import answer
    from probe.live.session import LiveSession
    from probe.loading.models import load_model

    lm = load_model(name)
    s = LiveSession(lm)
    texts = texts_of(lm, n_tokens, repeats + 1)
    layer, head = len(lm.sites) // 2, 1
    answer(s, "edit", {"text": texts[-1], "layer": layer})  # warm: the statistics kernel, first-call costs
    answer(s, "head", {"text": texts[-1], "layer": layer, "head": head})
    answer(s, "ablate", {"text": texts[-1], "heads": [[0, 1], [1, 2]], "layer": layer})
    rows = {"bare forward": [], "edit": [], "steps + why": [], "ablation (2 heads, zero)": []}
    for text in texts[:repeats]:
        rows["bare forward"].append(bare(lm, text))
        rows["edit"].append(timed(s, "edit", {"text": text, "layer": layer}))
        rows["steps + why"].append(timed(s, "head", {"text": text, "layer": layer, "head": head,
                                                     "query": n_tokens - 2}))
        rows["ablation (2 heads, zero)"].append(timed(s, "ablate", {"text": text, "heads": [[0, 1], [1, 2]],
                                                                    "layer": layer}))
        rows["bare forward"].append(bare(lm, text))
    base = statistics.median(w for w, _ in rows["bare forward"])
    base_cpu = statistics.median(c for _, c in rows["bare forward"])
    print(f"\n{name}: {n_tokens} tokens, {len(lm.sites)} layers x {lm.geometry.n_heads} heads, "
          f"{repeats} texts, torch threads {torch.get_num_threads()}")
    for what, ts in rows.items():
        med, cpu = statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts)
        print(f"  {what:28s} median {1000 * med:8.1f} ms  (min {1000 * min(w for w, _ in ts):7.1f})  "
              f"{med / base:5.2f} x bare   cpu {1000 * cpu:8.1f} ms  {cpu / base_cpu:5.2f} x bare")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", default="minilm:20,smollm2:60")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"before: {load()}")
    for item in a.models.split(","):
        name, n = item.split(":")
        bench(name, int(n), a.repeats)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
