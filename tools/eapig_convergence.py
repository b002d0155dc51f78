"""EAP-IG convergence on SmolLM2 with the built-in pairs: edge scores at m = 1, 5, 20 and 50, each
against m = 50 (Pearson, Spearman, the share of the top 5% of edges by |score| in common), as
docs/circuits.md reports. Run: ``python tools/eapig_convergence.py`` (about 3 min on 2 cores)."""

from __future__ import annotations

import time

import numpy as np
from scipy.stats import spearmanr

from probe.circuits.attribution import edge_scores
from probe.circuits.checked import checked_graph
from probe.effects.pairs import builtin_pairs, encode_pairs
from probe.loading.models import load_model

STEPS = (50, 20, 5, 1)


def main() -> None:
    lm = load_model("smollm2")
    wiring, graph, _ = checked_graph(lm)
    enc = encode_pairs(lm, builtin_pairs())
    scores = {}
    for m in STEPS:
        t = time.perf_counter()
        scores[m] = edge_scores(lm, wiring, graph, enc, method="eap-ig", steps=m, batch_size=len(builtin_pairs()))
        print(f"m = {m}: {time.perf_counter() - t:.0f} s", flush=True)
    ref = scores[STEPS[0]]
    n_top = int(0.05 * len(ref))
    top = set(np.argsort(-np.abs(ref))[:n_top])
    print(f"{len(ref)} edges; against m = {STEPS[0]}:")
    for m in STEPS[1:]:
        s = scores[m]
        shared = len(top & set(np.argsort(-np.abs(s))[:n_top])) / n_top
        print(f"m = {m}: Pearson {np.corrcoef(s, ref)[0, 1]:.5f}, Spearman {spearmanr(s, ref)[0]:.3f}, "
              f"top-5% edges shared {shared:.1%}")


if __name__ == "__main__":
    main()
