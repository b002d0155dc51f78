"""Measurement: the ablated in-context learning score of a decoder (the second half of Olsson et al.
2022's induction claim): icl_score clean, with the induction heads ablated, and with as many random
heads ablated (``--seeds`` sets), zero and mean ablation.

The heads' labels come from a heads.csv (``probe analyze`` of the model; the ``induction`` label);
the means from the reference half of the corpus (``probe effects``'s split, seed 0); the windows are
the first ``--windows`` windows of 512 tokens of the corpus joined in order (the definition asks for
at least 50; fewer is a cost decision, printed with the result). Prints the result as JSON and writes
it to ``--out``.

Usage (from the repository root): OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/icl_ablated.py \
       --heads heads.csv --conllu en_ewt-ud-dev.conllu
       [--model smollm2] [--windows 16] [--seeds 5] [--out icl.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from probe import load_model
from probe.effects.ablation import head_means
from probe.effects.icl import icl_claim
from probe.effects.induction import induction_group
from probe.effects.measure import split_batches
from probe.linguistic.conllu import read_conllu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", required=True, help="heads.csv with the labels")
    parser.add_argument("--conllu", required=True)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="icl_ablated.json")
    args = parser.parse_args()
    t0 = time.perf_counter()
    lm = load_model(args.model)
    texts = read_conllu(args.conllu).texts()
    group, how = induction_group(pd.read_csv(args.heads))
    ref, _, split = split_batches(lm, texts, 0.5, 0, 16, None)
    means = head_means(lm, ref)
    t1 = time.perf_counter()
    result = icl_claim(lm, texts, group, means, seeds=args.seeds, min_windows=min(args.windows, 50),
                       max_windows=args.windows)
    result.update(group=[list(h) for h in group], group_how=how, split=split, means_s=round(t1 - t0, 1),
                  claim_s=round(time.perf_counter() - t1, 1))
    text = json.dumps(result, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
