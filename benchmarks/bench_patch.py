"""Benchmark: ``probe patch``'s activation patching (the default: SmolLM2, every head, all positions and the
last, one layer's 2 x heads copies a pass) by whole passes (the old path,
:func:`probe.effects.patch_full.full_head_logit_diffs`) and by passes re-entering the run at the patched layer
(the new path, :func:`probe.effects.patch_layers.layer_head_logit_diffs`, with the LM head at every position as
before :func:`probe.effects.patch_full.metric_logits` and at the metric position only), in one run, beside the
bare forward work from each patched layer on.

The bare work: a bare forward pass F of the same batch (the model alone, no hooks, all logits: copies x
pairs rows), timed in the same process (the minimum of ``--repeats``), times the layer-passes the patching
needs, sum over its patched passes of (n_layers - L) / n_layers with L the lowest layer a pass patches
(SmolLM2, 30 layers, one layer a pass: 15.5 F). Both paths' figures are ratios to it; the old path runs
n_layers + 4 whole passes.

It also checks the numbers: ``patch_heads``'s frame (patch.csv's columns: effect, effect_last, raw,
raw_last) by each path, and prints the maximum absolute difference (0: bit for bit).

The machine's load (os.getloadavg, as uptime prints it) is printed with each figure, and torch's thread
count.

Usage: PYTHONPATH=. python benchmarks/bench_patch.py [--pairs N] [--repeats 3] [--threads N] [--clock wall|cpu]
       (--pairs N: the first N built-in pairs, a quick mode; default all 20. --clock cpu: the process's CPU
       seconds, for a shared machine at --threads 1)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

import probe
import probe.effects.patch_full as patch_full
import probe.effects.patching as patching
from probe.effects.pairs import builtin_pairs, encode_pairs
from probe.effects.patch_full import full_head_logit_diffs, model_inputs
from probe.effects.patch_layers import layer_head_logit_diffs

COLUMNS = ["effect", "effect_last", "raw", "raw_last"]
#: The clock of every figure: wall seconds, or the process's CPU seconds (``--clock cpu``: on a shared
#: machine with one thread, the work itself, whatever else runs).
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def bare_forward(lm, enc, copies: int, repeats: int) -> float:
    """Seconds of the model's own forward pass of the patched passes' batch (the corrupted prompts, ``copies``
    copies), no hooks: the minimum of ``repeats``."""
    inputs = model_inputs(lm, enc, enc.corrupted, copies)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t = clock()
            lm.model(**inputs)
            best = min(best, clock() - t)
    return best


def timed_patch(lm, pairs, engine) -> tuple[float, object, dict]:
    """(seconds, ``patch_heads``'s frame, info) with ``engine`` as the patching's head_logit_diffs."""
    info: dict = {}
    own = patching.head_logit_diffs

    def run(*args, estimate=None, **kwargs):
        if engine is layer_head_logit_diffs:
            kwargs["info"] = info
        return engine(*args, **kwargs)

    patching.head_logit_diffs = run
    try:
        t = clock()
        frame = patching.patch_heads(lm, pairs)
        return clock() - t, frame, info
    finally:
        patching.head_logit_diffs = own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=None, help="the first N built-in pairs (default all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = probe.load_model("smollm2")
    pairs = builtin_pairs()[: args.pairs] if args.pairs else builtin_pairs()
    enc = encode_pairs(lm, pairs)
    S, H = len(lm.sites), lm.geometry.n_heads
    k = 2 * H
    print(f"{lm.name}: {S} layers x {H} heads, {len(pairs)} pairs x {enc.clean.shape[1]} tokens, {k} copies a pass "
          f"(batch {k * len(pairs)}), {torch.get_num_threads()} threads, {args.clock} clock")
    forward = bare_forward(lm, enc, k, args.repeats)
    print(f"bare forward pass of the batch: {forward:.2f} s ({load()})")
    old_s, old, _ = timed_patch(lm, pairs, full_head_logit_diffs)
    print(f"old path (whole passes): {old_s:.1f} s ({load()})")
    patch_full.METRIC_ROWS_ONLY = False
    every_s, every, _ = timed_patch(lm, pairs, layer_head_logit_diffs)
    print(f"re-entered, the LM head at every position (before metric_logits): {every_s:.1f} s ({load()})")
    patch_full.METRIC_ROWS_ONLY = True
    new_s, new, info = timed_patch(lm, pairs, layer_head_logit_diffs)
    print(f"new path (re-entered at the patched layer: {info['reentered']}; the LM head at the metric position): "
          f"{new_s:.1f} s ({load()})")
    forward_after = bare_forward(lm, enc, k, args.repeats)
    f = min(forward, forward_after)
    layer_passes = sum(S - L for L in info["starts"]) / S
    bare = f * layer_passes
    print(f"bare forward pass again: {forward_after:.2f} s ({load()}); F = {f:.2f} s")
    print(f"bare work from each patched layer on: {layer_passes:.1f} F = {bare:.1f} s")
    print(f"{'path':<10} {'seconds':>8} {'x bare':>7} {'F':>6}")
    print(f"{'old':<10} {old_s:8.1f} {old_s / bare:7.2f} {old_s / f:6.1f}   (counts {S + 4} whole passes)")
    print(f"{'re-entered':<10} {every_s:8.1f} {every_s / bare:7.2f} {every_s / f:6.1f}   (LM head at every position)")
    print(f"{'new':<10} {new_s:8.1f} {new_s / bare:7.2f} {new_s / f:6.1f}")
    print(f"new / old: {new_s / old_s:.2f}; new / re-entered: {new_s / every_s:.2f}")
    head = np.abs(every[COLUMNS].to_numpy() - new[COLUMNS].to_numpy()).max()
    print(f"patch.csv numbers, max |re-entered - new|: {head:.3g} (bit for bit: {every[COLUMNS].equals(new[COLUMNS])})")
    diff = np.abs(old[COLUMNS].to_numpy() - new[COLUMNS].to_numpy()).max()
    same = old[COLUMNS].equals(new[COLUMNS]) and old.attrs == new.attrs
    print(f"patch.csv numbers, max |old - new|: {diff:.3g} (bit for bit: {same})")


if __name__ == "__main__":
    main()
