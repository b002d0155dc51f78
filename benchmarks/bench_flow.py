"""Benchmark: the cost of attention flow (probe.attention_flow) next to rollout, by sequence length.

Prints, per length T (the text cut to exactly T tokens), the seconds of ``attention_rollout`` and
of ``attention_flow`` for the whole [T, T] matrix (``rows="all"``) and for the reported row only
(``rows="reported"``), each the fastest of ``--repeats`` runs (the forward pass included), and,
with ``--old``, the reported row by the previous solver (networkx preflow-push on one residual network
per sequence, reset by each solve) on the same maps, with the largest difference from the new values.

Usage: python benchmarks/bench_flow.py [--model minilm] [--lengths 16,32,64] [--repeats 1] [--rows all,reported] [--old]
Text: the built-in sample texts joined (long enough for 64 tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def fastest(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def old_row(tilde, i: int) -> list[float]:
    """The reported row the way probe.measures.flow solved it before the compiled solver: networkx preflow-push."""
    import networkx as nx
    from networkx.algorithms.flow import build_residual_network, preflow_push

    L, T, _ = tilde.shape
    G = nx.DiGraph()
    for l in range(1, L + 1):
        for a in range(T):
            for b in range(T):
                if tilde[l - 1, a, b] > 0:
                    G.add_edge((l, a), (l - 1, b), capacity=float(tilde[l - 1, a, b]))
    R = build_residual_network(G, "capacity")
    return [nx.maximum_flow_value(G, (L, i), (0, j), flow_func=preflow_push, residual=R) if (0, j) in G
            and nx.has_path(G, (L, i), (0, j)) else 0.0 for j in range(T)]


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's probe, not an installed one
    import torch

    import probe
    from probe.text.corpus import sample_texts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--lengths", default="16,32,64")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rows", default="all,reported")
    ap.add_argument("--old", action="store_true", help="also time the previous networkx solver (reported row)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lm = probe.load_model(args.model)
    text = " ".join(sample_texts())
    out = []
    for T in (int(x) for x in args.lengths.split(",")):
        res = probe.attention_rollout(lm, text, max_length=T)
        assert len(res.tokens) == T, (len(res.tokens), T)
        row = {"model": args.model, "layers": len(res.sites), "tokens": T}
        row["rollout_s"] = round(fastest(lambda T=T: probe.attention_rollout(lm, text, max_length=T), args.repeats), 3)
        for rows in args.rows.split(","):
            def flow(T=T, rows=rows):
                probe.attention_flow(lm, text, max_length=T, max_tokens=T, rows=rows)
            row[f"flow_{rows}_s"] = round(fastest(flow, args.repeats), 3)
        if args.old:
            from probe.measures.flow import flow_values
            from probe.measures.rollout import encode_for_stack, stack_maps

            maps = stack_maps(lm, encode_for_stack(lm, [text], T))[0]
            start = time.perf_counter()
            old = old_row(maps.tilde, maps.row_index)
            row["old_networkx_reported_s"] = round(time.perf_counter() - start, 3)
            new = flow_values(maps.tilde, [maps.row_index])[maps.row_index]
            row["old_vs_new_max_abs_diff"] = float(max(abs(a - b) for a, b in zip(old, new)))
        print(json.dumps(row), flush=True)
        out.append(row)


if __name__ == "__main__":
    main()
